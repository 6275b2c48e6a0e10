package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestStatsTimedOut: Stats.TimedOut counts the waiting calls that ended,
// not granted, at their context's deadline: a Lock in the server, a Lock
// queued in the Locker behind it, a Semaphore's Acquire, a Session's Lock
// and InTx, each past a short deadline on a key (or semaphore) held by
// another Locker. A cancelled wait, a try, and a call whose deadline had
// passed before it began are not counted; each counted call returned an
// error matching ErrNotAcquired and context.DeadlineExceeded.
func TestStatsTimedOut(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("stats timed out")
		holder := sqllock.New(pgtest.Open(t, driverOf(db), dsn))
		held, err := holder.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(bg())
		permit, err := holder.Semaphore("stats timed out", 1).Acquire(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer permit.Unlock(bg())

		l := sqllock.New(db)
		// timedOut runs call under a context with a short deadline, and
		// checks it ended not granted, at that deadline.
		timedOut := func(what string, call func(ctx context.Context) error) {
			t.Helper()
			ctx, cancel := context.WithTimeout(bg(), 150*time.Millisecond)
			defer cancel()
			if err := call(ctx); !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("%s past its deadline = %v, want ErrNotAcquired and DeadlineExceeded", what, err)
			}
		}
		lock := func(ctx context.Context) error {
			lk, err := l.Lock(ctx, k)
			if err == nil {
				lk.Unlock(bg())
			}
			return err
		}
		want := int64(0)
		check := func(after string) {
			t.Helper()
			if got := l.Stats().TimedOut; got != want {
				t.Fatalf("after %s: Stats().TimedOut = %d, want %d", after, got, want)
			}
		}

		timedOut("Lock", lock)
		want++
		check("a Lock that waited in the server")

		// Two at once: one waits in the server, the other in the Locker's
		// queue behind it.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { timedOut("a queued Lock", lock) })
		}
		waitGroup(t, &wg, hangCeiling)
		want += 2
		check("two Locks, one queued behind the other")

		timedOut("Semaphore.Acquire", func(ctx context.Context) error {
			lk, err := l.Semaphore("stats timed out", 1).Acquire(ctx)
			if err == nil {
				lk.Unlock(bg())
			}
			return err
		})
		want++
		check("a Semaphore's Acquire")

		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		timedOut("Session.Lock", func(ctx context.Context) error { return s.Lock(ctx, k) })
		s.Close(bg())
		want++
		check("a Session's Lock")

		timedOut("InTx", func(ctx context.Context) error {
			return l.InTx(ctx, k, nil, func(*sql.Tx) error { return nil })
		})
		want++
		check("InTx")

		// Not counted: a cancelled wait, a try, a call whose deadline had
		// passed before it began.
		ctx, cancel := context.WithCancel(bg())
		time.AfterFunc(100*time.Millisecond, cancel)
		if err := lock(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock = %v, want context.Canceled", err)
		}
		contended := l.Stats().Contended
		if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("TryLock of a held key = %v", err)
		}
		if got := l.Stats().Contended - contended; got != 1 {
			t.Errorf("a refused TryLock added %d to Stats().Contended, want 1", got)
		}
		past, cancelPast := context.WithDeadline(bg(), time.Now().Add(-time.Second))
		defer cancelPast()
		if err := lock(past); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock past its deadline before it began = %v", err)
		}
		check("a cancelled Lock, a TryLock and a Lock whose deadline had passed")
	})
}
