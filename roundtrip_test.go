package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// TestRoundTrips counts, through a proxy that reads the protocol, the
// messages each operation sends that wait for the server's answer (Sync,
// simple Query): a regression in the number of round trips fails here.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			dsn := srv.NewDatabase(t)
			// Waits go in slices of half the deadlock_timeout, a round
			// trip each: long ones, so that a wait the test ends is one
			// slice however slowly a loaded machine gets to its release
			// (a slice of the default 500 ms ended first, and counted).
			setDeadlockTimeout(t, srv, dsn, 30*time.Second)
			proxy := pgtest.StartProxy(t, srv.Addr(), 0)
			db := pgtest.Open(t, drv, proxy.DSN(dsn))
			l := sqllock.New(db, sqllock.WithKeepAlive(0), sqllock.WithDedicatedSessions())
			perOp := func(name string, want float64, op func() error) {
				t.Helper()
				for range 3 { // warm up: prepared statements, session settings
					if err := op(); err != nil {
						t.Fatal(err)
					}
				}
				const n = 50
				before := proxy.RoundTrips()
				for range n {
					if err := op(); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
				}
				got := float64(proxy.RoundTrips()-before) / n
				t.Logf("%s: %.2f round trips", name, got)
				if got != want {
					t.Errorf("%s: %.2f round trips per operation, want %v", name, got, want)
				}
			}
			// tryUnlock and lockTokens are operations of l on k.
			tryUnlock := func(l *sqllock.Locker, k sqllock.Key) func() error {
				return func() error {
					lk, err := l.TryLock(bg(), k)
					if err != nil {
						return err
					}
					return lk.Unlock(bg())
				}
			}
			lockTokens := func(l *sqllock.Locker, k sqllock.Key) func() error {
				return func() error {
					lk, err := l.Lock(bg(), k)
					if err != nil {
						return err
					}
					for range 2 {
						if _, err := lk.Token(bg()); err != nil {
							return err
						}
					}
					return lk.Unlock(bg())
				}
			}
			k := sqllock.Int64(31)
			perOp("TryLock + Unlock", 2, tryUnlock(l, k))
			perOp("Lock + Unlock (free)", 2, func() error {
				lk, err := l.Lock(bg(), k)
				if err != nil {
					return err
				}
				return lk.Unlock(bg())
			})
			perOp("RLock + Unlock", 2, func() error {
				lk, err := l.RLock(bg(), k)
				if err != nil {
					return err
				}
				return lk.Unlock(bg())
			})
			perOp("TryDo", 2, func() error {
				_, err := l.TryDo(bg(), k, func(context.Context) error { return nil })
				return err
			})
			perOp("InTx (BEGIN, lock, COMMIT)", 3, func() error {
				return l.InTx(bg(), k, nil, func(*sql.Tx) error { return nil })
			})
			tx, err := db.BeginTx(bg(), nil)
			if err != nil {
				t.Fatal(err)
			}
			// LockTx cannot tell the driver from a Tx, so it binds the key:
			// lib/pq spends two round trips on a statement with parameters.
			perOp("LockTx, in an open transaction", map[string]float64{"postgres": 2, "pgx": 1}[drv], func() error { return sqllock.LockTx(bg(), tx, k) })
			tx.Rollback()
			perOp("Inspect", 1, func() error { _, err := sqllock.Inspect(bg(), db, nil); return err })
			// A fencing token: one round trip on first use, none after.
			perOp("Lock + Token + Token + Unlock", 3, lockTokens(l, k))
			// Who leads an election: one query, whoever asks.
			e := l.Election(k)
			perOp("Election.Leader", 1, func() error { _, err := e.Leader(bg()); return err })
			// A candidate is a lock of its Locker: no server check, no setup
			// of its own, per campaign.
			perOp("Campaign (free) + Resign", 2, func() error {
				ld, err := e.Campaign(bg(), "host-a")
				if err != nil {
					return err
				}
				return ld.Unlock(bg())
			})
			// A wait on a shared session: the try there, then, on that same
			// session (it carries no other lock), the registration in the
			// key's line and the wait, then the unlock: four round trips,
			// counted on a pool and proxy of the waiter's own. The first
			// round also checks the server and reads deadlock_timeout; each
			// round's shared session is new (the one before kept its lock,
			// as a session of its own). Giving the shared session back to
			// the pool and taking another to wait on would cost two more.
			{
				wproxy := pgtest.StartProxy(t, srv.Addr(), 0)
				wl := sqllock.New(pgtest.Open(t, drv, wproxy.DSN(dsn)), sqllock.WithKeepAlive(0))
				for round := range 3 {
					// A key of its own each round.
					wk := sqllock.Int64(37 + 100*int64(round))
					hold, err := l.TryLock(bg(), wk)
					if err != nil {
						t.Fatal(err)
					}
					got := make(chan error, 1)
					before := wproxy.RoundTrips()
					go func() {
						lk, err := wl.Lock(bg(), wk)
						if err == nil {
							err = lk.Unlock(bg())
						}
						got <- err
					}()
					testkit.WaitWaiters(t, db, wk, 1)
					if err := hold.Unlock(bg()); err != nil {
						t.Fatal(err)
					}
					if err := <-got; err != nil {
						t.Fatal(err)
					}
					n := wproxy.RoundTrips() - before
					t.Logf("shared: Lock that waited + Unlock, round %d: %d round trips", round, n)
					if round > 0 && n != 4 {
						t.Errorf("shared: Lock that waited + Unlock: %d round trips, want 4", n)
					}
				}
			}
			// Shared sessions: the same counts. A lock held throughout keeps
			// the carrier pinned (an empty one is reset and pooled a second
			// later, in a round trip of its own).
			sl := sqllock.New(db, sqllock.WithKeepAlive(0))
			pin, err := sl.TryLock(bg(), sqllock.Int64(39))
			if err != nil {
				t.Fatal(err)
			}
			sk := sqllock.Int64(38)
			perOp("shared: TryLock + Unlock", 2, tryUnlock(sl, sk))
			perOp("shared: Lock + Token + Token + Unlock", 3, lockTokens(sl, sk))
			// Concurrent callers share round trips: each takes a distinct
			// key, all hold, then all unlock. A first round opens the
			// carriers; the second is counted.
			callers := []int{1, 100, 1000}
			if testkit.Short() {
				callers = callers[:2]
			}
			for _, n := range callers {
				var trips int64
				for round := range 2 {
					before := proxy.RoundTrips()
					locks := make([]*sqllock.Lock, n)
					var wg sync.WaitGroup
					errs := make(chan error, n)
					for i := range n {
						wg.Go(func() {
							lk, err := sl.TryLock(bg(), sqllock.Pair(34, int32(i)))
							locks[i] = lk
							if err != nil {
								errs <- err
							}
						})
					}
					waitGroup(t, &wg, hangCeiling)
					for _, lk := range locks {
						wg.Go(func() {
							if err := lk.Unlock(bg()); err != nil {
								errs <- err
							}
						})
					}
					waitGroup(t, &wg, hangCeiling)
					close(errs)
					for err := range errs {
						t.Fatalf("%d concurrent callers: %v", n, err)
					}
					if round == 1 {
						trips = proxy.RoundTrips() - before
					}
				}
				per := float64(trips) / float64(n)
				t.Logf("shared: TryLock + Unlock by %d concurrent callers: %.3f round trips per lock (%d sessions)", n, per, sl.Stats().SharedSessions)
				if n == 1 && per != 2 || n > 1 && per >= 2 {
					t.Errorf("shared: %d concurrent callers: %.3f round trips per lock, want 2 alone and fewer together", n, per)
				}
			}
			pin.Unlock(bg())
			for deadline := time.Now().Add(5 * time.Second); sl.Stats().SharedSessions > 0 && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond) // the carriers' resets: not in the counts below
			}

			s, err := l.Session(bg())
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []int{1, 100, 5000} {
				keys := make([]sqllock.Key, n)
				for i := range keys {
					keys[i] = sqllock.Pair(32, int32(i))
				}
				perOp(fmt.Sprintf("Session TryLock(%d) + Unlock(%d)", n, n), 2, func() error {
					got, err := s.TryLock(bg(), keys...)
					if err != nil {
						return err
					}
					if len(got) != n {
						return fmt.Errorf("TryLock took %d of %d", len(got), n)
					}
					return s.Unlock(bg(), got...)
				})
			}
			s.Close(bg())

			// A contended Lock: a free key is tried on a shared session
			// first, whatever happened to it before, and a held one is then
			// waited for on that same session: the try, the registration in
			// its line, the wait, the unlock.
			holder, err := l.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			wproxy := pgtest.StartProxy(t, srv.Addr(), 0)
			wl := sqllock.New(pgtest.Open(t, drv, wproxy.DSN(dsn)), sqllock.WithKeepAlive(0))
			for i := range 4 {
				before := wproxy.RoundTrips()
				got := make(chan error, 1)
				go func() {
					lk, err := wl.Lock(bg(), k)
					if err == nil {
						err = lk.Unlock(bg())
					}
					got <- err
				}()
				testkit.WaitWaiters(t, db, k, 1)
				if err := holder.Unlock(bg()); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatal(err)
				}
				// The first on a new Locker and connection also checks the
				// server, reads deadlock_timeout, and, on pgx, prepares
				// each statement; from then on: the try, the registration,
				// the wait and the unlock.
				trips, want := wproxy.RoundTrips()-before, int64(4)
				t.Logf("contended Lock + Unlock #%d: %d round trips", i+1, trips)
				if i >= 2 && trips != want {
					t.Errorf("contended Lock + Unlock #%d: %d round trips, want %d", i+1, trips, want)
				}
				if i == 0 {
					// The waiter's first try ran on a shared session, which
					// goes back to the pool a second after, in a round trip
					// of its own: not in the count below.
					for deadline := time.Now().Add(5 * time.Second); wl.Stats().SharedSessions > 0 && time.Now().Before(deadline); {
						time.Sleep(10 * time.Millisecond)
					}
				}
				if holder, err = l.Lock(bg(), k); err != nil {
					t.Fatal(err)
				}
			}
			holder.Unlock(bg())

			// The keep-alive: one round trip per interval for all locks.
			kl := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
			var held []*sqllock.Lock
			for i := range 20 {
				lk, err := kl.Lock(bg(), sqllock.Pair(33, int32(i)))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, lk)
			}
			time.Sleep(250 * time.Millisecond)
			before, checks := proxy.RoundTrips(), kl.Stats().KeepAliveChecks
			time.Sleep(time.Second)
			trips, ran := proxy.RoundTrips()-before, kl.Stats().KeepAliveChecks-checks
			t.Logf("keep-alive: %d round trips, %d checks in 1 s for 20 locks", trips, ran)
			// (A check that straddles the window's edge may count on one
			// side of it and its round trip on the other.)
			if ran < 5 || trips < ran-1 || trips > ran+1 {
				t.Errorf("keep-alive: %d round trips for %d checks; want one per check", trips, ran)
			}
			for _, lk := range held {
				lk.Unlock(bg())
			}
		})
	}
}
