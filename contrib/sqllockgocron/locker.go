package sqllockgocron

import (
	"context"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/sqllock/sqllock"
)

// Locker is a gocron.Locker that takes each job's lock through a
// [sqllock.Locker]: the key is sqllock.Hash("gocron:" + the job's name)
// unless [WithKey] says otherwise. It is safe for concurrent use; one
// Locker serves any number of schedulers and jobs.
type Locker struct {
	l    *sqllock.Locker
	key  func(job string) sqllock.Key
	hold time.Duration
}

var _ gocron.Locker = (*Locker)(nil)

// Option configures NewLocker.
type Option interface{ apply(*Locker) }

type optionFunc func(*Locker)

func (f optionFunc) apply(g *Locker) { f(g) }

// WithKey sets the key of each job's lock, from the job's name (gocron's
// key: WithName's, or the function's name).
func WithKey(key func(job string) sqllock.Key) Option {
	return optionFunc(func(g *Locker) { g.key = key })
}

// WithHoldAtLeast keeps each run's lock until at least d after it was
// taken, even when the job returns sooner (see [sqllock.Lock.UnlockAfter]):
// for jobs that every scheduler fires on the same schedule, choose d
// between the largest skew of the schedulers' clocks and timers and the
// schedule's period, and the job runs once per tick. 0 (the default)
// releases the lock when the job returns. d must be from 0 to 7 days
// ([NewLocker] panics otherwise).
func WithHoldAtLeast(d time.Duration) Option {
	if d < 0 || d > 7*24*time.Hour {
		panic(fmt.Sprintf("sqllockgocron: WithHoldAtLeast(%v): want 0 to 168h", d))
	}
	return optionFunc(func(g *Locker) { g.hold = d })
}

// NewLocker returns a Locker that takes jobs' locks through l. It panics
// if l is nil.
func NewLocker(l *sqllock.Locker, opts ...Option) *Locker {
	if l == nil {
		panic("sqllockgocron: NewLocker with a nil *sqllock.Locker")
	}
	g := &Locker{l: l, key: func(job string) sqllock.Key { return sqllock.Hash("gocron:" + job) }}
	for _, o := range opts {
		o.apply(g)
	}
	return g
}

// Lock implements gocron.Locker: it takes the job's lock if it is free,
// without waiting. An error makes gocron skip this run: one matching
// [sqllock.ErrNotAcquired] when another scheduler holds the lock, others
// when the database cannot be reached.
func (g *Locker) Lock(ctx context.Context, job string) (gocron.Lock, error) {
	lk, err := g.l.TryLock(ctx, g.key(job))
	if err != nil {
		return nil, err
	}
	return &lock{lk: lk, hold: g.hold}, nil
}

// lock is a run's lock: its Unlock releases it, or starts its hold window.
type lock struct {
	lk   *sqllock.Lock
	hold time.Duration
}

// Unlock implements gocron.Lock. With a hold window it returns at once and
// the lock is released in the background when the window ends.
func (r *lock) Unlock(ctx context.Context) error {
	if r.hold > 0 {
		return r.lk.UnlockAfter(r.hold)
	}
	return r.lk.Unlock(ctx)
}
