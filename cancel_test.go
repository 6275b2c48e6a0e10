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
		wg.Wait()
		for w := 0; w < workers; w++ {
			waitFree(t, observer, sqllock.Pair(100, int32(w)), 10*time.Second)
		}
		if n := advisoryCount(t, observer); n != 0 {
			t.Fatalf("%d advisory locks left held after the stress", n)
		}
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
