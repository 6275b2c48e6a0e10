package sqllock

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"sync"
)

// Semaphore lets at most N holders, across every process that uses the
// same name and N, hold it at once: "at most 3 report generators in the
// fleet". It is made of N advisory locks, its slots: the pair keys
// (class, 0) to (class, N-1), where class is a 31-bit hash of the name
// with the top bit set ([SemaphoreSlots] lists them).
//
// Each permit is an ordinary [Lock] on one slot: the same contract (it
// pins a connection, Done and Err report a loss, Unlock is confirmed on
// the backend that was granted it, doubt discards the connection), and the
// Locker's keep-alive watches it with its other locks.
//
// A Semaphore is safe for concurrent use. Processes must agree on N: a
// process with a larger N has more slots.
type Semaphore struct {
	l     *Locker
	name  string
	class int32
	n     int

	tryOnce sync.Once
	try     string // the statement that takes the first free slot (see trySQL)
}

// trySQL returns the statement that takes the first free slot, made once
// the server check has run.
func (s *Semaphore) trySQL() string {
	s.tryOnce.Do(func() { s.try = s.l.sql().SemaphoreTrySQL(s.class, s.n) })
	return s.try
}

// maxSlots bounds N: each slot is one term of a statement.
const maxSlots = 1024

// Semaphore returns the semaphore name of n slots. It panics if n is not
// between 1 and 1024.
func (l *Locker) Semaphore(name string, n int) *Semaphore {
	if n < 1 || n > maxSlots {
		panic(fmt.Sprintf("sqllock: Semaphore(%q, %d): n must be 1 to %d", name, n, maxSlots))
	}
	s := &Semaphore{l: l, name: name, class: semaphoreClass(name), n: n}
	return s
}

// semaphoreClass is the pair class of a semaphore's slots.
func semaphoreClass(name string) int32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return int32(h.Sum32() | 1<<31)
}

// SemaphoreSlots returns the keys of the slots of the semaphore name of n
// slots, as [Inspect] reports them (to name them in a [Registry], say); none
// for n below 1.
func SemaphoreSlots(name string, n int) []Key {
	if n < 1 {
		return nil
	}
	c := semaphoreClass(name)
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Pair(c, int32(i))
	}
	return keys
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Size returns N, the number of slots.
func (s *Semaphore) Size() int { return s.n }

// TryAcquire takes a free slot if there is one, in one round trip, and
// otherwise returns an error matching [ErrNotAcquired] at once. Release
// the permit with its Unlock. Other errors are those of [Locker.TryLock].
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lock, error) {
	return s.acquire(ctx, true)
}

// Acquire takes a slot, waiting while all are taken. It waits in the
// server on one slot chosen at random, in statements no longer than half
// the server's deadlock_timeout (see [Locker.Lock]); between two, it tries
// every slot again. So a waiter is woken at once when its slot is freed,
// and within half a deadlock_timeout (0.5 s by default) when another one
// is; it never polls faster. Waiters are not served in order of arrival.
// When ctx ends first, Acquire returns an error matching [ErrNotAcquired]
// and ctx.Err(), and no slot stays held.
func (s *Semaphore) Acquire(ctx context.Context) (*Lock, error) {
	return s.acquire(ctx, false)
}

func (s *Semaphore) acquire(ctx context.Context, try bool) (lk *Lock, err error) {
	if end := s.l.startAcquire(ctx, Acquisition{Name: s.name, Wait: !try}); end != nil {
		defer func() { end(lk, err) }()
	}
	name := fmt.Sprintf("semaphore %q", s.name)
	if err := ctx.Err(); err != nil {
		return nil, notAcquired(name, err)
	}
	l := s.l
	conn, cerr := getConn(ctx, l.abandoned, l.db)
	if cerr != nil {
		if ctxEnded(ctx) {
			return nil, notAcquired(name, ctxErr(ctx))
		}
		return nil, fmt.Errorf("sqllock: %s: get connection: %w", name, cerr)
	}
	if err := l.checkServer(ctx, conn); err != nil {
		conn.Close() // no lock statement ran on it
		if ctxEnded(ctx) {
			return nil, notAcquired(name, ctxErr(ctx))
		}
		return nil, err
	}
	for {
		var slot, pid int64
		var standby bool
		err = queryRow(ctx, l.abandoned, conn, s.trySQL(), nil, &slot, &pid, &standby, skip)
		if err == nil && standby && !l.cfg.allowStandby {
			if slot >= 0 {
				k := Pair(s.class, int32(slot))
				if rerr := l.release(conn, k, false, pid); rerr != nil {
					return nil, rerr
				}
			} else {
				conn.Close()
			}
			return nil, standbyError(name)
		}
		if err == nil && slot >= 0 {
			k := Pair(s.class, int32(slot))
			if ctxEnded(ctx) {
				l.discard(conn, k, "context ended during the semaphore statement")
				return nil, notAcquired(name, ctxErr(ctx))
			}
			lk = newLock(l, k, false, conn, pid)
			l.stats.took(1)
			l.mon.add(lk)
			return lk, nil
		}
		if ctxEnded(ctx) {
			l.discard(conn, Key{}, "context ended during the semaphore statement")
			return nil, notAcquired(name, ctxErr(ctx))
		}
		if err != nil {
			l.discard(conn, Key{}, "semaphore statement failed")
			return nil, lockError(name, err)
		}
		if try {
			l.stats.contended.Add(1)
			conn.Close() // confirmed: this session holds nothing
			err := fmt.Errorf("%w: all %d slots of %s are held", ErrNotAcquired, s.n, name)
			if l.cfg.holders {
				err = l.withHolders(Key{}, err, SemaphoreSlots(s.name, s.n)...)
			}
			return nil, err
		}
		// Wait on one slot, for one slice; then try them all again.
		k := Pair(s.class, int32(rand.IntN(s.n)))
		var ok bool
		var wpid int64
		slice, err := l.waitSlice(ctx, conn)
		if err == nil {
			q, args := l.sql().WaitSQL(0, k.sqlKey(), slice)
			err = queryRow(ctx, l.abandoned, conn, q, args, &ok, &wpid, &standby)
		}
		switch {
		case ctxEnded(ctx):
			// Whatever the driver said: a cancelled wait can be granted,
			// and some drivers report a cancelled statement as a success
			// (the rule of Locker.Lock).
			if !errors.Is(err, errAbandoned) {
				l.cancelWait(pid, k)
			}
			l.discard(conn, k, "context ended during the semaphore wait")
			return nil, notAcquired(name, ctxErr(ctx))
		case err == nil && (!ok || wpid != pid):
			l.discard(conn, k, "semaphore wait not confirmed")
			return nil, fmt.Errorf("sqllock: %s: the wait for slot %v returned without the lock (backend %d, then %d)", name, k, pid, wpid)
		case err == nil && standby && !l.cfg.allowStandby:
			if rerr := l.release(conn, k, false, wpid); rerr != nil {
				return nil, rerr
			}
			return nil, standbyError(name)
		case err == nil:
			lk = newLock(l, k, false, conn, wpid)
			l.stats.took(1)
			l.mon.add(lk)
			return lk, nil
		case sqlState(err) == "55P03" || sqlState(err) == "40P01":
			if sqlState(err) == "40P01" {
				l.slice.Store(nil)
			}
			l.log(ctx, slog.LevelDebug, "sqllock: semaphore: trying every slot again", Key{}, slog.String("semaphore", s.name))
			continue
		default:
			l.discard(conn, k, "semaphore wait failed")
			return nil, lockError(name, err)
		}
	}
}
