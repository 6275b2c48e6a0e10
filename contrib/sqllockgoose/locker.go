package sqllockgoose

import (
	"context"
	"database/sql"
	"fmt"
	"sync"

	"github.com/pressly/goose/v3/lock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
)

// Locker takes goose's migration lock through a [sqllock.Locker]. It is a
// goose lock.SessionLocker and a lock.Locker; both forms take the lock on a
// session of the sqllock Locker, so goose's connection or *sql.DB argument
// only tells one holder from another.
//
// A Locker is safe for concurrent use. Several Providers may share one:
// each holds the lock in turn, as separate instances would.
type Locker struct {
	l   *sqllock.Locker
	key sqllock.Key

	mu   sync.Mutex
	held map[any][]*sqllock.Lock // guarded by mu: each holder's locks (goose's *sql.Conn or *sql.DB), oldest first
}

var (
	_ lock.SessionLocker = (*Locker)(nil)
	_ lock.Locker        = (*Locker)(nil)
)

// Option configures New.
type Option interface{ apply(*Locker) }

type optionFunc func(*Locker)

func (f optionFunc) apply(g *Locker) { f(g) }

// WithKey makes the Locker take k instead of goose's default key: use it
// when goose's own lockers are configured with lock.WithLockID(id), as
// sqllock.Int64(id).
func WithKey(k sqllock.Key) Option {
	return optionFunc(func(g *Locker) { g.key = k })
}

// New returns a Locker that takes goose's lock (by default goose's default
// key, [interop.Goose]) through l. New panics if l is nil.
func New(l *sqllock.Locker, opts ...Option) *Locker {
	if l == nil {
		panic("sqllockgoose: New with a nil *sqllock.Locker")
	}
	g := &Locker{l: l, key: interop.Goose(), held: map[any][]*sqllock.Lock{}}
	for _, o := range opts {
		o.apply(g)
	}
	return g
}

// Key returns the key the Locker takes.
func (g *Locker) Key() sqllock.Key { return g.key }

// SessionLock implements goose's lock.SessionLocker: it waits for the lock
// until ctx ends. When ctx ends first, it returns an error matching
// [sqllock.ErrNotAcquired] and ctx.Err(), and nothing stays held or queued.
func (g *Locker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	return g.lock(ctx, conn)
}

// SessionUnlock implements goose's lock.SessionLocker: it releases the lock
// that SessionLock took for conn. It returns an error matching
// [sqllock.ErrLockLost] when the lock was lost while goose held it (the
// migrations ran, at least in part, without it), and [sqllock.ErrReleased]
// when conn holds none.
func (g *Locker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	return g.unlock(ctx, conn)
}

// Lock implements goose's lock.Locker, as [Locker.SessionLock] does, for
// db.
func (g *Locker) Lock(ctx context.Context, db *sql.DB) error {
	return g.lock(ctx, db)
}

// Unlock implements goose's lock.Locker, as [Locker.SessionUnlock] does,
// for db.
func (g *Locker) Unlock(ctx context.Context, db *sql.DB) error {
	return g.unlock(ctx, db)
}

func (g *Locker) lock(ctx context.Context, holder any) error {
	lk, err := g.l.Lock(ctx, g.key)
	if err != nil {
		return fmt.Errorf("sqllockgoose: lock %v: %w", g.key, err)
	}
	g.mu.Lock()
	g.held[holder] = append(g.held[holder], lk)
	g.mu.Unlock()
	return nil
}

// unlock releases the oldest lock of holder: one holder has two only when
// Providers on one *sql.DB share the Locker through goose.WithLocker, and
// the first lost its lock before it unlocked (the key is exclusive).
func (g *Locker) unlock(ctx context.Context, holder any) error {
	g.mu.Lock()
	var lk *sqllock.Lock
	if q := g.held[holder]; len(q) > 0 {
		lk = q[0]
		if len(q) == 1 {
			delete(g.held, holder)
		} else {
			g.held[holder] = q[1:]
		}
	}
	g.mu.Unlock()
	if lk == nil {
		return fmt.Errorf("sqllockgoose: unlock %v: %w", g.key, sqllock.ErrReleased)
	}
	if err := lk.Unlock(ctx); err != nil {
		return fmt.Errorf("sqllockgoose: unlock %v: %w", g.key, err)
	}
	return nil
}
