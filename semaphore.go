package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Semaphore lets at most N holders, across every process that uses the
// same name and N, hold it at once: "at most 3 report generators in the
// fleet". It is made of N advisory locks, its slots: the pair keys
// (class, 0) to (class, N-1), where class is a 31-bit hash of the name
// with the top bit set.
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

// semaphoreSlots returns the keys of the slots of the semaphore name of n
// slots; none for n below 1.
func semaphoreSlots(name string, n int) []Key {
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

// TryAcquire takes a free slot if there is one, in one round trip, and
// otherwise returns an error matching [ErrNotAcquired] at once. Release
// the permit with its Unlock. Other errors are those of [Locker.TryLock].
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lock, error) {
	mustContext(ctx, "Semaphore.TryAcquire")
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
	mustContext(ctx, "Semaphore.Acquire")
	return s.acquire(ctx, false)
}

func (s *Semaphore) acquire(ctx context.Context, try bool) (lk *Lock, err error) {
	if end := s.l.startAcquire(ctx, Acquisition{Name: s.name, Wait: !try}); end != nil {
		defer func() { end(lk, err) }()
	}
	name := fmt.Sprintf("semaphore %q", s.name)
	lk, err = s.l.withConn(ctx, name, func(conn *sql.Conn, id ident) (*Lock, error) {
		return s.acquireOn(ctx, conn, id, try, name)
	})
	if err != nil && s.l.cfg.holders && errors.Is(err, ErrNotAcquired) && !errors.Is(err, errAbandoned) {
		err = s.l.withHolders(Key{}, err, semaphoreSlots(s.name, s.n)...)
	}
	return lk, err
}

// acquireOn takes a slot on conn: it tries every slot in one statement,
// then, for Acquire, waits on one slot chosen at random for one slice of
// the engine's wait, and tries them all again.
func (s *Semaphore) acquireOn(ctx context.Context, conn *sql.Conn, id ident, try bool, name string) (*Lock, error) {
	l := s.l
	w := connWaiter{conn, l.abandoned, l.newMark()}
	for {
		var slot int64
		o := outcome{sent: monoNow()} // the permit's lease begins with this statement
		q, args := l.mode.Arrays(s.trySQL(), w.m)
		o.err = w.queryRow(ctx, q, args, &slot, &o.pid, &o.standby, skip)
		if o.err == nil && slot == -2 {
			o.err = foreignSession() // nothing was tried
		}
		if o.err == nil {
			l.observeRTT(time.Duration(monoNow() - o.sent))
		}
		o.ok = o.err == nil && slot >= 0
		k := Key{}
		if o.ok {
			k = Pair(s.class, int32(slot))
		}
		if o.ok || o.err != nil || try || ctxEnded(ctx) || o.standby && !l.cfg.allowStandby {
			lk, err := l.settle(ctx, conn, id, l.sql(), w.m, k, false, o, name)
			if errors.Is(err, ErrNotAcquired) && !ctxEnded(ctx) {
				err = fmt.Errorf("%w: all %d slots of %s are held", ErrNotAcquired, s.n, name)
			}
			return lk, err
		}
		// Wait on one slot, for one slice; then try them all again.
		k = Pair(s.class, int32(rand.IntN(s.n)))
		o = l.waitOn(ctx, w, sessionLevel, l.sql(), 0, k, o.pid, waitSlice)
		if o.err != nil && sqlState(o.err) == "55P03" && !ctxEnded(ctx) {
			l.log(ctx, slog.LevelDebug, "sqllock: semaphore: trying every slot again", Key{}, slog.String("semaphore", s.name))
			continue
		}
		return l.settle(ctx, conn, id, l.sql(), w.m, k, false, o, name)
	}
}
