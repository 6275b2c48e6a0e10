package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// The context bounds every call: a deadline is kept by the server too, so a
// cancel that never reaches it cannot make a wait outlive its deadline; an
// ended context sends nothing.

// TestLockTxDeadlineAlwaysReturns: LockTx with very short deadlines, from
// many goroutines at once, against two shared holders, always returns by
// its deadline (plus scheduling): a driver's cancel request that reaches
// the server before the wait statement starts is lost (lib/pq), and there
// is no other connection to cancel from.
func TestLockTxDeadlineAlwaysReturns(t *testing.T) {
	t.Parallel()
	lockTxAlwaysReturns(t, false)
}

// TestLockTxCancelAlwaysReturns: the same with contexts that are cancelled
// after as short a time, and have no deadline for the server to keep: a
// lost cancel costs at most a slice of the wait (2 s, or twice the
// server's deadlock_timeout), never the rest of the holders' time.
func TestLockTxCancelAlwaysReturns(t *testing.T) {
	t.Parallel()
	lockTxAlwaysReturns(t, true)
}

// lockTxAlwaysReturns runs the LockTx trials: contexts with a deadline, or
// (cancelled) cancelled as the deadline would come.
func lockTxAlwaysReturns(t *testing.T, cancelled bool) {
	srv := pgtest.Start(t)
	// A call may return bound past its deadline, plus what the machine
	// costs it: four of the round trips measured around it (the
	// transaction's begin and rollback on the same pool), which a loaded
	// machine stretches as it stretches the call's own. A call not back
	// after stuckAfter is stuck, whatever the load: its backends are ended
	// so that the test reports it.
	bound, stuckAfter := 2*time.Second, 30*time.Second
	if cancelled {
		bound = 3 * time.Second // a slice of 2 s at most, and the rest
	}
	const goroutines = 8
	calls := 150
	if testkit.Short() {
		calls = 40
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		db.SetMaxOpenConns(goroutines + 4)
		k := sqllock.Pair(5, 6)
		for range 2 {
			h, err := db.BeginTx(bg(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Rollback()
			if err := sqllock.RLockTx(bg(), h, k); err != nil {
				t.Fatal(err)
			}
		}
		var stuck, late, notAcquired atomic.Int64
		var slowest atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 1))
				for range calls {
					beginAt := time.Now()
					tx, err := db.BeginTx(bg(), nil)
					trip := time.Since(beginAt)
					if err != nil {
						t.Error(err)
						return
					}
					d := time.Duration(200+r.IntN(5800)) * time.Microsecond
					ctx, cancel := context.WithTimeout(bg(), d)
					if cancelled {
						ctx, cancel = context.WithCancel(bg())
						time.AfterFunc(d, cancel)
					}
					began := time.Now()
					done := make(chan error, 1)
					go func() { done <- sqllock.LockTx(ctx, tx, k) }()
					select {
					case err = <-done:
					case <-time.After(stuckAfter):
						stuck.Add(1)
						err = <-done // unblocked by the cleanup below, once the test failed
					}
					took := time.Since(began)
					cancel()
					rollbackAt := time.Now()
					tx.Rollback()
					trip = max(trip, time.Since(rollbackAt))
					if took > d+bound+4*trip {
						late.Add(1)
						t.Logf("a call returned %v past its deadline of %v (round trips around it: %v)", took-d, d, trip)
					}
					if n := int64(took); n > slowest.Load() {
						slowest.Store(n)
					}
					switch {
					case errors.Is(err, sqllock.ErrNotAcquired) && (errors.Is(err, context.DeadlineExceeded) || cancelled && errors.Is(err, context.Canceled)):
						notAcquired.Add(1)
					case err == nil:
						t.Errorf("LockTx() against an exclusive wait on shared holders = nil")
					default:
						// A statement the driver gave up (the connection
						// is then bad) is fine: the transaction is gone.
					}
				}
			}()
		}
		// A stuck call would hang the test: end the waiting backends once
		// it is found, so that the failure is reported.
		watch := make(chan struct{})
		go func() {
			defer close(watch)
			for {
				time.Sleep(500 * time.Millisecond)
				if stuck.Load() > 0 {
					admin := pgtest.Open(t, "pgx", srv.AdminDSNFor(pgtest.DatabaseOf(dsn)))
					admin.Exec(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
					admin.Close()
					return
				}
				if allDone(&wg) {
					return
				}
			}
		}()
		waitGroup(t, &wg, hangCeiling)
		<-watch
		t.Logf("%d calls: %d not acquired at the deadline, %d returned more than %v (and four round trips) past it, %d stuck over %v, slowest %v",
			goroutines*calls, notAcquired.Load(), late.Load(), bound, stuck.Load(), stuckAfter, time.Duration(slowest.Load()))
		if stuck.Load() > 0 || late.Load() > 0 {
			t.Fatalf("LockTx() ignored its context: %d calls stuck, %d late", stuck.Load(), late.Load())
		}
	})
}

// allDone reports whether wg's count is zero, without waiting.
func allDone(wg *sync.WaitGroup) bool {
	c := make(chan struct{})
	go func() { wg.Wait(); close(c) }()
	select {
	case <-c:
		return true
	case <-time.After(10 * time.Millisecond):
		return false
	}
}

// TestLockTxDeadlineKeepsTxSettings: the deadline kept by the server does
// not change the transaction's own lock_timeout: a shorter one still ends
// the wait (with its own error), and after the grant the transaction has
// the setting it had.
func TestLockTxDeadlineKeepsTxSettings(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
		defer cancel()
		for _, tc := range []struct{ set, want string }{{"", "0"}, {"SET LOCAL lock_timeout = '123ms'", "123ms"}} {
			tx, err := db.BeginTx(bg(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.set != "" {
				if _, err := tx.Exec(tc.set); err != nil {
					t.Fatal(err)
				}
			}
			if err := sqllock.LockTx(ctx, tx, sqllock.Int64(9300)); err != nil {
				t.Fatalf("LockTx() of a free key = %v", err)
			}
			var got string
			if err := tx.QueryRow("SHOW lock_timeout").Scan(&got); err != nil {
				t.Fatal(err)
			}
			tx.Rollback()
			if got != tc.want {
				t.Errorf("lock_timeout after LockTx = %q, want %q (%s)", got, tc.want, tc.set)
			}
		}
		// A shorter lock_timeout of the transaction's own still applies.
		holder, err := db.BeginTx(bg(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback()
		if err := sqllock.LockTx(bg(), holder, sqllock.Int64(9301)); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(bg(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.Exec("SET LOCAL lock_timeout = '100ms'"); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		err = sqllock.LockTx(ctx, tx, sqllock.Int64(9301))
		took := time.Since(began)
		if err == nil || errors.Is(err, context.DeadlineExceeded) || took > 5*time.Second {
			t.Fatalf("LockTx() with lock_timeout 100ms and a 10 s deadline = %v after %v; want the server's 55P03 at about 100 ms", err, took)
		}
	})
}

// TestEndedContextSendsNothing: a lock call whose context has already
// ended sends no statement: another process's TryLock of the same free key
// is never refused because of it (a statement sent and undone would hold
// the key for a moment).
func TestEndedContextSendsNothing(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	rounds := 300
	if testkit.Short() {
		rounds = 100
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		other := pgtest.Open(t, "pgx", dsn) // another process's pool
		_ = srv
		ended, cancel := context.WithCancel(bg())
		cancel()
		for _, tc := range []struct {
			name string
			opts []sqllock.Option
		}{{"shared", nil}, {"dedicated", []sqllock.Option{sqllock.WithDedicatedSessions()}}} {
			t.Run(tc.name, func(t *testing.T) {
				l := sqllock.New(db, tc.opts...)
				o := sqllock.New(other, sqllock.WithDedicatedSessions())
				k := sqllock.Int64(9400)
				// A lock held meanwhile keeps a shared session open, as
				// in a busy service.
				keep, err := l.Lock(bg(), sqllock.Int64(9401))
				if err != nil {
					t.Fatal(err)
				}
				defer keep.Unlock(bg())
				stop := make(chan struct{})
				var sent atomic.Int64
				var wg sync.WaitGroup
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							select {
							case <-stop:
								return
							default:
							}
							for _, call := range []func() (*sqllock.Lock, error){
								func() (*sqllock.Lock, error) { return l.TryLock(ended, k) },
								func() (*sqllock.Lock, error) { return l.Lock(ended, k) },
							} {
								lk, err := call()
								if err == nil {
									lk.Unlock(bg())
									sent.Add(1)
								} else if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
									t.Errorf("lock call with an ended ctx = %v, want ErrNotAcquired and context.Canceled", err)
								}
							}
						}
					}()
				}
				refused := 0
				for range rounds {
					lk, err := o.TryLock(bg(), k)
					if errors.Is(err, sqllock.ErrNotAcquired) {
						refused++
						continue
					}
					if err != nil {
						t.Fatal(err)
					}
					lk.Unlock(bg())
				}
				close(stop)
				waitGroup(t, &wg, hangCeiling)
				if sent.Load() > 0 {
					t.Errorf("%d lock calls with an ended ctx took the lock", sent.Load())
				}
				if refused > 0 {
					t.Fatalf("another process's TryLock of a free key was refused %d times in %d while calls with an ended ctx ran", refused, rounds)
				}
			})
		}
	})
}

// TestStrayCancelDoesNotEndAWait: a cancel that reaches a waiting backend
// while the call's context goes on (pg_cancel_backend names a backend, not
// a statement: one meant for an earlier statement on the same backend, or
// a DBA's) does not end the call: Lock and a semaphore's Acquire wait on,
// and get the lock when it is freed.
func TestStrayCancelDoesNotEndAWait(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		other := pgtest.Open(t, "pgx", dsn)
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		holder := sqllock.New(other, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
		sem := l.Semaphore("stray", 1)
		hsem := holder.Semaphore("stray", 1)
		for _, tc := range []struct {
			name string
			key  sqllock.Key
			hold func() (*sqllock.Lock, error)
			wait func(ctx context.Context) (*sqllock.Lock, error)
		}{
			{"Lock", sqllock.Int64(9800), func() (*sqllock.Lock, error) { return holder.Lock(bg(), sqllock.Int64(9800)) },
				func(ctx context.Context) (*sqllock.Lock, error) { return l.Lock(ctx, sqllock.Int64(9800)) }},
			{"Semaphore", sqllock.SemaphoreSlots("stray", 1)[0], func() (*sqllock.Lock, error) { return hsem.Acquire(bg()) },
				func(ctx context.Context) (*sqllock.Lock, error) { return sem.Acquire(ctx) }},
		} {
			t.Run(tc.name, func(t *testing.T) {
				hl, err := tc.hold()
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
				defer cancel()
				got := make(chan error, 1)
				go func() {
					lk, err := tc.wait(ctx)
					if err == nil {
						err = lk.Unlock(bg())
					}
					got <- err
				}()
				// The waiter's backend (this database's, this key's: other
				// tests wait too; a sliced wait leaves the queue a moment
				// between its statements).
				pid := 0
				for pid == 0 {
					testkit.WaitWaiters(t, other, tc.key, 1)
					hs, err := sqllock.Inspect(bg(), other, nil, tc.key)
					if err != nil {
						t.Fatal(err)
					}
					for _, h := range hs {
						if !h.Granted {
							pid = h.PID
						}
					}
				}
				var ok bool
				if err := other.QueryRow("SELECT pg_cancel_backend($1)", pid).Scan(&ok); err != nil || !ok {
					t.Fatalf("pg_cancel_backend(%d) = %v, %v", pid, ok, err)
				}
				select {
				case err := <-got:
					t.Fatalf("%s returned %v after a cancel it did not ask for", tc.name, err)
				case <-time.After(300 * time.Millisecond):
				}
				if err := hl.Unlock(bg()); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatalf("%s after a stray cancel, once the holder left = %v, want the lock", tc.name, err)
				}
			})
		}
	})
}
