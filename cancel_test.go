package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestCancelStress races a waiter's context deadline against the holder's
// release, thousands of times per driver. Whatever the timing, a lock
// reported as acquired must really be held by the waiter's backend (no
// phantom successes), and no lock may stay held anywhere afterwards (no
// leaks, in particular none returned to the pool).
func TestCancelStress(t *testing.T) {
	long(t)
	const workers, perWorker = 4, 500
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		holderL := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		waiterL := sqllock.New(db, sqllock.WithKeepAlive(0))
		observer := pgtest.Open(t, "pgx", dsn)
		var acquired, notAcquired, phantoms, slowFree atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := sqllock.Pair(100, int32(w))
				rng := rand.New(rand.NewPCG(uint64(w), 7))
				for i := 0; i < perWorker && !t.Failed(); i++ {
					// The holder waits if an abandoned waiter's backend still
					// holds the key; it must be freed quickly.
					hctx, hcancel := context.WithTimeout(bg(), 10*time.Second)
					start := time.Now()
					h, err := holderL.Lock(hctx, k)
					hcancel()
					if err != nil {
						t.Errorf("holder Lock: %v (a leaked lock?)", err)
						return
					}
					if time.Since(start) > 100*time.Millisecond {
						slowFree.Add(1)
					}
					ctx, cancel := context.WithCancel(bg())
					res := make(chan *sqllock.Lock, 1)
					errc := make(chan error, 1)
					go func() {
						lk, err := waiterL.Lock(ctx, k)
						res <- lk
						errc <- err
					}()
					// Once the waiter waits in the server, release and cancel
					// at nearly the same moment, in either order.
					testkit.WaitWaiters(t, observer, k, 1)
					d1 := time.Duration(rng.IntN(400)) * time.Microsecond
					d2 := time.Duration(rng.IntN(1500)) * time.Microsecond
					var race sync.WaitGroup
					race.Add(2)
					go func() {
						defer race.Done()
						time.Sleep(d1)
						if err := h.Unlock(bg()); err != nil {
							t.Errorf("holder Unlock: %v", err)
						}
					}()
					go func() {
						defer race.Done()
						time.Sleep(d2)
						cancel()
					}()
					race.Wait()
					lk, err := <-res, <-errc
					if err != nil {
						if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
							t.Errorf("waiter Lock: %v, want ErrNotAcquired and context.Canceled", err)
						}
						notAcquired.Add(1)
						continue
					}
					acquired.Add(1)
					if got := holders(t, observer, k); !slices.Contains(got, lk.PID()) {
						phantoms.Add(1)
						t.Errorf("phantom: Lock succeeded on backend %d but holders are %v", lk.PID(), got)
					}
					if err := lk.Unlock(bg()); err != nil {
						t.Errorf("waiter Unlock: %v", err)
					}
				}
			}()
		}
		waitGroup(t, &wg, hangCeiling)
		for w := 0; w < workers; w++ {
			waitFree(t, observer, sqllock.Pair(100, int32(w)), 10*time.Second)
		}
		// A waiter's session discarded as its ctx ended takes its place in
		// line (a ticket and the doorbell) with it as its backend ends,
		// which a loaded machine delays: nothing may be left once the
		// backends have ended, within 10 s.
		left, since := advisoryCount(t, observer), time.Now()
		for left != 0 && time.Since(since) < 10*time.Second {
			time.Sleep(10 * time.Millisecond)
			left = advisoryCount(t, observer)
		}
		if left != 0 {
			t.Fatalf("%d advisory locks left held 10 s after the stress", left)
		}
		t.Logf("no advisory lock left %v after the keys were free", time.Since(since).Round(time.Millisecond))
		t.Logf("attempts %d: acquired %d, not acquired %d, phantoms %d, holder waited >100ms %d times, connections discarded %d",
			workers*perWorker, acquired.Load(), notAcquired.Load(), phantoms.Load(), slowFree.Load(), waiterL.Stats().Discarded)
		total := int64(workers * perWorker)
		if acquired.Load() < total/100 || notAcquired.Load() < total/100 {
			t.Fatalf("the race was not exercised: acquired %d, not acquired %d of %d", acquired.Load(), notAcquired.Load(), total)
		}
	})
}

// TestAbandonedWaitLeavesNoOneQueued: when a waiter's context ends, its
// backend leaves the queue before Lock (or InTx) returns, so the holder's
// release goes to no abandoned session. pgx closes the socket of a
// cancelled statement without a cancel request: without sqllock's own
// cancel, the abandoned backend was granted the lock in most rounds.
func TestAbandonedWaitLeavesNoOneQueued(t *testing.T) {
	long(t)
	const rounds = 40
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		holderL := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		waiterL := sqllock.New(db, sqllock.WithKeepAlive(0))
		for _, via := range []string{"Lock", "InTx"} {
			t.Run(via, func(t *testing.T) {
				k := sqllock.Hash("abandoned:" + via)
				grabbed := 0
				for i := 0; i < rounds; i++ {
					h, err := holderL.Lock(bg(), k)
					if err != nil {
						t.Fatalf("round %d: holder Lock: %v", i, err)
					}
					ctx, cancel := context.WithTimeout(bg(), 30*time.Millisecond)
					if via == "Lock" {
						_, err = waiterL.Lock(ctx, k)
					} else {
						err = waiterL.InTx(ctx, k, nil, func(*sql.Tx) error { return nil })
					}
					cancel()
					if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("round %d: waiter %s = %v, want ErrNotAcquired and DeadlineExceeded", i, via, err)
					}
					if err := h.Unlock(bg()); err != nil {
						t.Fatal(err)
					}
					// At once: nobody else may have been granted k.
					again, err := holderL.TryLock(bg(), k)
					if errors.Is(err, sqllock.ErrNotAcquired) {
						grabbed++
						waitFree(t, db, k, 5*time.Second)
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					again.Unlock(bg())
				}
				t.Logf("%s: the abandoned waiter's backend was granted the lock in %d of %d rounds", via, grabbed, rounds)
				if grabbed != 0 {
					t.Fatalf("%s: an abandoned waiter's backend took the lock in %d of %d rounds, want 0", via, grabbed, rounds)
				}
				waitNoLocks(t, db, 5*time.Second)
			})
		}
	})
}

// TestAbandonedConnNotPooled: on a driver that does not give a read up when
// its context ends (lib/pq), a statement that answers just as its caller
// gives it up (errAbandoned) must cost its connection. The caller's
// abandoned wait is cancelled from another connection, which watches the
// backend for up to two seconds after the call returned: had the
// connection gone back to the pool, that cancel would hit the next wait
// run on it, by a call whose context is still live (57014 instead of the
// lock). The hook holds the answer of the late-grant check that follows a
// wait's 55P03 until the caller has left.
func TestAbandonedConnNotPooled(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	l := sqllock.New(pgtest.Open(t, "postgres", dsn), sqllock.WithKeepAlive(0))
	holder := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
	const name = "abandoned-answer"
	h, err := holder.Semaphore(name, 1).Acquire(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unlock(bg())

	type held struct{}
	fired := make(chan struct{}, 1)
	var timedOut atomic.Bool // the wait's statement ended at the deadline (55P03)
	defer sqllock.SetAfterBlindStatement(func(ctx context.Context, err error, gone func() bool) {
		if ctx.Value(held{}) == nil {
			return
		}
		var st interface{ SQLState() string }
		if errors.As(err, &st) && st.SQLState() == "55P03" {
			timedOut.Store(true)
			return
		}
		if err != nil && !errors.Is(err, sql.ErrNoRows) || !timedOut.Swap(false) {
			return // only the late-grant check ("not held") of the wait below
		}
		for !gone() {
			time.Sleep(time.Millisecond)
		}
		// Let the abandoned wait's cancel take its connection first.
		time.Sleep(100 * time.Millisecond)
		select {
		case fired <- struct{}{}:
		default:
		}
	})()

	sem := l.Semaphore(name, 1)
	// The wait's first slice (or its deadline, less a margin) ends in the
	// server well before ctx; a loaded machine may answer too late: again.
	staged := false
	for attempt := 1; attempt <= 3 && !staged; attempt++ {
		ctx, cancel := context.WithTimeout(context.WithValue(bg(), held{}, true), time.Second)
		_, err = sem.Acquire(ctx)
		cancel()
		if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire(1 s) = %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		select {
		case <-fired:
			staged = true
		case <-time.After(2 * time.Second):
			t.Logf("attempt %d: the late-grant check answered after the deadline", attempt)
		}
	}
	if !staged {
		t.Fatal("the late-grant check was never abandoned")
	}

	// A later wait on the same pool, granted when the holder leaves.
	go func() {
		time.Sleep(500 * time.Millisecond)
		h.Unlock(bg())
	}()
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	lk, err := sem.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire after the holder left = %v (ctx live: %v), want the permit", err, ctx.Err() == nil)
	}
	lk.Unlock(bg())
}
