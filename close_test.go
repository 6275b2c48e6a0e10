package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// TestLockerClose: Close leaves nothing behind. Callers that wait for a
// lock (in the server, and queued in the Locker behind them) leave with
// ErrClosed; every lock, Session and permit is released, its Err and
// Done say so; no connection of the pool is in use as Close returns, and
// no session of the Locker is left on the server; later calls are refused without a statement; a second
// Close does nothing.
func TestLockerClose(t *testing.T) {
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		other := sqllock.New(pgtest.Open(t, "pgx", dsn))
		held, err := other.Lock(bg(), sqllock.Int64(1))
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(bg())

		l := sqllock.New(db)
		lk, err := l.Lock(bg(), sqllock.Int64(2))
		if err != nil {
			t.Fatal(err)
		}
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.TryLock(bg(), sqllock.Int64(3), sqllock.Int64(4)); err != nil {
			t.Fatal(err)
		}
		permit, err := l.Semaphore("close", 2).Acquire(bg())
		if err != nil {
			t.Fatal(err)
		}
		// Two callers wait for key 1: the first in the server, the
		// second queued in the Locker behind it.
		waits := make(chan error, 2)
		for range 2 {
			go func() {
				lk, err := l.Lock(bg(), sqllock.Int64(1))
				if err == nil {
					lk.Unlock(bg())
				}
				waits <- err
			}()
		}
		testkit.WaitWaiters(t, db, sqllock.Int64(1), 1)
		for deadline := time.Now().Add(10 * time.Second); sqllock.Queued(l, sqllock.Int64(1)) != 2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("Queued = %d, want 2 callers of key 1", sqllock.Queued(l, sqllock.Int64(1)))
			}
		}

		if err := l.Close(bg()); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		// Close gives every connection back before it returns, a
		// discarded waiter's too, once its cancelled statement returned.
		inUse := db.Stats().InUse
		for range 2 {
			select {
			case err := <-waits:
				if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, sqllock.ErrClosed) {
					t.Errorf("a waiting Lock() = %v, want ErrNotAcquired and ErrClosed", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a waiting Lock() did not return after Close")
			}
		}
		for _, e := range []struct {
			what string
			err  error
			done <-chan struct{}
		}{{"Lock", lk.Err(), lk.Done()}, {"Session", s.Err(), s.Done()}, {"permit", permit.Err(), permit.Done()}} {
			if !errors.Is(e.err, sqllock.ErrReleased) || !errors.Is(e.err, sqllock.ErrClosed) {
				t.Errorf("%s.Err() after Close = %v, want ErrReleased and ErrClosed", e.what, e.err)
			}
			select {
			case <-e.done:
			default:
				t.Errorf("%s.Done() not closed after Close", e.what)
			}
		}
		// The server: only the other Locker's lock, and no waiter, once
		// the backends of the sessions Close discarded (a wait cancelled
		// with no certain answer) have ended, a moment after their
		// connections closed.
		n := advisoryCount(t, db)
		for start := time.Now(); n != 1 && time.Since(start) < 30*time.Second; n = advisoryCount(t, db) {
			time.Sleep(10 * time.Millisecond)
		}
		if n != 1 {
			t.Errorf("%d advisory locks 30 s after Close, want 1 (the other Locker's)", n)
		}
		if inUse != 0 {
			t.Errorf("%d connections of the pool in use as Close returned, want 0", inUse)
		}
		if _, err := l.TryLock(bg(), sqllock.Int64(5)); !errors.Is(err, sqllock.ErrClosed) || !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Errorf("TryLock() after Close = %v, want ErrNotAcquired and ErrClosed", err)
		}
		if _, err := l.Session(bg()); !errors.Is(err, sqllock.ErrClosed) {
			t.Errorf("Session() after Close = %v, want ErrClosed", err)
		}
		if err := l.Close(bg()); err != nil {
			t.Errorf("a second Close() = %v", err)
		}
		if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrReleased) {
			t.Errorf("Unlock() after Close = %v, want ErrReleased", err)
		}
	})
}

// TestLockerCloseWaitsOutWindows: Close keeps a task's hold window (the
// lock is held until the window's end, then released), as long as its ctx
// allows; a ctx that ends first ends the window then.
func TestLockerCloseWaitsOutWindows(t *testing.T) {
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		const window = time.Second
		for _, wait := range []bool{true, false} {
			l := sqllock.New(db)
			k := sqllock.Int64(10)
			if err := l.Do(bg(), k, func(context.Context) error { return nil }, sqllock.WithHoldAtLeast(window)); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			ctx, cancel := context.WithCancel(bg())
			if !wait {
				cancel() // end the window now
			}
			// While Close waits, the key stays held (by the server's
			// word), and no other Locker gets it.
			closed := make(chan error, 1)
			go func() { closed <- l.Close(ctx) }()
			if wait {
				time.Sleep(window / 4)
				if h := holders(t, db, k); len(h) != 1 {
					t.Errorf("holders of %v while Close waits out the window: %v, want one", k, h)
				}
			}
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("Close() = %v", err)
				}
			case <-time.After(window + 10*time.Second):
				t.Fatal("Close() did not return")
			}
			took := time.Since(began)
			cancel()
			if wait && took < window*3/4 {
				t.Errorf("Close() returned after %v, before the hold window of %v ended", took, window)
			}
			if h := holders(t, db, k); len(h) != 0 {
				t.Errorf("holders of %v after Close: %v, want none", k, h)
			}
			t.Logf("wait=%v: Close returned after %v (window %v)", wait, took, window)
		}
	})
}
