package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// limitConnections caps dsn's database at n connections, as a server with
// max_connections = n + 3 (its reserved slots) would.
func limitConnections(t *testing.T, srv *pgtest.Server, dsn string, n int) {
	t.Helper()
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var name string
	if err := pgtest.Open(t, "pgx", dsn).QueryRowContext(bg(), "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ExecContext(bg(), fmt.Sprintf("ALTER DATABASE %q CONNECTION LIMIT %d", name, n)); err != nil {
		t.Fatal(err)
	}
}

// backends returns how many sessions of dsn's database hold advisory
// locks.
func lockingBackends(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(bg(), "SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestManyLocksFewSessions: one Locker, N goroutines each taking a
// distinct free key (half Lock, half TryLock; 2,000 in the full run, 300
// in -short; SQLLOCK_MANY_LOCKS=5000 for more; bench -sharing goes to
// 10,000), against a database that
// admits 97 connections (a default server's 100 less its reserved ones):
// every lock is granted, on at most 16 sessions; every Unlock is confirmed;
// nothing is left held. With a session per lock (WithDedicatedSessions),
// a database that admits 20 runs out of connections at 30 locks.
func TestManyLocksFewSessions(t *testing.T) {
	t.Parallel()
	n := 2000
	if testkit.Short() {
		n = 300
	}
	if v, err := strconv.Atoi(os.Getenv("SQLLOCK_MANY_LOCKS")); err == nil {
		n = v // the 5,000, or more
	}
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			base := srv.NewDatabase(t)
			limitConnections(t, srv, base, 20)
			sessionPerLockRefused(t, drv, base)

			dsn := srv.NewDatabase(t)
			limitConnections(t, srv, dsn, 97)
			observer := pgtest.Open(t, "pgx", dsn)
			observer.SetMaxOpenConns(1)

			l := sqllock.New(pgtest.Open(t, drv, dsn))
			locks := make([]*sqllock.Lock, n)
			errs := make(chan error, n)
			var wg sync.WaitGroup
			start := time.Now()
			for i := range n {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(bg(), time.Minute)
					defer cancel()
					k := sqllock.Pair(41, int32(i))
					var err error
					if i%2 == 0 {
						locks[i], err = l.Lock(ctx, k)
					} else {
						locks[i], err = l.TryLock(ctx, k)
					}
					if err != nil {
						errs <- fmt.Errorf("lock %d: %w", i, err)
					}
				})
			}
			waitGroup(t, &wg, hangCeiling)
			took := time.Since(start)
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			sessions, st := lockingBackends(t, observer), l.Stats()
			t.Logf("%d locks held in %v on %d sessions (Stats: %d held, %d shared sessions)", n, took, sessions, st.Held, st.SharedSessions)
			if sessions > 16 || st.SharedSessions > 16 {
				t.Errorf("%d locks on %d sessions (%d shared), want at most 16", n, sessions, st.SharedSessions)
			}
			if got := advisoryCount(t, observer); got != n || st.Held != int64(n) {
				t.Errorf("server shows %d advisory locks, Stats().Held = %d; want %d", got, st.Held, n)
			}
			for i, lk := range locks {
				if sqllock.ConnOf(lk) != nil {
					t.Fatalf("lock %d: a connection of its own, want a shared session", i)
				}
			}
			// Inspect names each lock's holder: its shared session.
			for _, lk := range locks[:10] {
				if pids := holders(t, observer, lk.Key()); len(pids) != 1 || pids[0] != lk.PID() {
					t.Errorf("Inspect: %v held by %v, want backend %d", lk.Key(), pids, lk.PID())
				}
			}
			for _, lk := range locks {
				wg.Go(func() {
					if err := lk.Unlock(bg()); err != nil {
						t.Errorf("Unlock(%v) = %v", lk.Key(), err)
					}
				})
			}
			waitGroup(t, &wg, hangCeiling)
			waitNoLocks(t, observer, 10*time.Second)
			if st := l.Stats(); st.Held != 0 || st.Lost != 0 || st.Discarded != 0 {
				t.Errorf("after every Unlock: %+v", st)
			}
		})
	}
}

// sessionPerLockRefused: with a session per lock, 30 goroutines taking
// distinct free keys run a database that admits 20 connections out of
// them.
func sessionPerLockRefused(t *testing.T, drv, dsn string) {
	t.Helper()
	dedicated := sqllock.New(pgtest.Open(t, drv, dsn), sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
	var refused atomic.Int64
	var held []*sqllock.Lock
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(bg(), 3*time.Second)
			defer cancel()
			lk, err := dedicated.Lock(ctx, sqllock.Pair(40, int32(i)))
			if err != nil {
				refused.Add(1)
				return
			}
			mu.Lock()
			held = append(held, lk)
			mu.Unlock()
		})
	}
	waitGroup(t, &wg, hangCeiling)
	t.Logf("a session per lock: %d of 30 locks held, %d refused", len(held), refused.Load())
	if refused.Load() == 0 {
		t.Errorf("a session per lock: all 30 locks held in a database that admits 20 connections")
	}
	for _, lk := range held {
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedExclusive: goroutines of one Locker take one key over and over
// (Lock, TryLock, Do): an advisory lock is re-entrant within a session, so
// two holders on one shared session would both be granted it; never more
// than one is inside, and every call that took it got in.
func TestSharedExclusive(t *testing.T) {
	t.Parallel()
	rounds := 40
	if testkit.Short() {
		rounds = 10
	}
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(50*time.Millisecond))
		k := sqllock.Int64(4242)
		var inside, most, entries atomic.Int64
		enter := func() {
			now := inside.Add(1)
			for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
			}
			time.Sleep(100 * time.Microsecond)
			inside.Add(-1)
			entries.Add(1)
		}
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Go(func() {
				for r := range rounds {
					switch (g + r) % 4 {
					case 0:
						lk, err := l.Lock(bg(), k)
						if err != nil {
							t.Error(err)
							return
						}
						enter()
						if err := lk.Unlock(bg()); err != nil {
							t.Error(err)
						}
					case 1:
						lk, err := l.TryLock(bg(), k)
						if errors.Is(err, sqllock.ErrNotAcquired) {
							continue
						}
						if err != nil {
							t.Error(err)
							return
						}
						enter()
						if err := lk.Unlock(bg()); err != nil {
							t.Error(err)
						}
					case 2:
						if err := l.Do(bg(), k, func(context.Context) error { enter(); return nil }); err != nil {
							t.Error(err)
						}
					default:
						// Other keys on the same sessions.
						lk, err := l.TryLock(bg(), sqllock.Pair(4243, int32(g*1000+r)))
						if err != nil {
							t.Error(err)
							return
						}
						if err := lk.Unlock(bg()); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
		waitGroup(t, &wg, hangCeiling)
		t.Logf("%d entries, at most %d inside at once, %d shared sessions", entries.Load(), most.Load(), l.Stats().SharedSessions)
		if most.Load() != 1 {
			t.Errorf("at most %d inside at once, want 1", most.Load())
		}
		if entries.Load() == 0 {
			t.Errorf("no entries")
		}
		waitNoLocks(t, db, 10*time.Second)
	})
}

// TestSharedSessionLoss: a Locker's locks spread over its shared sessions
// (two, for a pool of 8 connections: hundreds of locks each); one session
// is terminated: every Lock on it reports the loss (Done, Err wrapping
// ErrLockLost, Unlock returning it), no other Lock does, and the Locker
// goes on taking locks.
func TestSharedSessionLoss(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, drv, dsn)
			db.SetMaxOpenConns(8) // shared sessions: a quarter of it
			l := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
			observer := pgtest.Open(t, "pgx", dsn)
			n := 1200
			if testkit.Short() {
				n = 600 // still 300 or more on the more loaded of the two
			}
			locks := make([]*sqllock.Lock, n)
			var wg sync.WaitGroup
			// A first wave opens both shared sessions (it queues on the
			// first while the second connects); the second wave, within
			// the second they stay open empty, spreads over both.
			for round := range 2 {
				for i := range n {
					wg.Go(func() {
						lk, err := l.TryLock(bg(), sqllock.Pair(42, int32(i)))
						if err != nil {
							t.Error(err)
						}
						locks[i] = lk
					})
				}
				waitGroup(t, &wg, 2*time.Minute)
				if round == 1 {
					break
				}
				for _, lk := range locks {
					if err := lk.Unlock(bg()); err != nil {
						t.Fatal(err)
					}
				}
			}
			if t.Failed() {
				t.FailNow()
			}
			byPID := map[int][]*sqllock.Lock{}
			for _, lk := range locks {
				byPID[lk.PID()] = append(byPID[lk.PID()], lk)
			}
			pids := make([]int, 0, len(byPID))
			for pid := range byPID {
				pids = append(pids, pid)
			}
			sort.Slice(pids, func(i, j int) bool { return len(byPID[pids[i]]) > len(byPID[pids[j]]) })
			// (On a loaded machine the second wave may find one session
			// closed and reopened: the other then carries few locks, which
			// still shows that a loss stays on its session.)
			if len(pids) != 2 || len(byPID[pids[0]]) < 300 {
				t.Fatalf("%d locks on %d sessions (the most loaded carries %d, the least %d): want 2, one carrying 300 or more", n, len(pids), len(byPID[pids[0]]), len(byPID[pids[len(pids)-1]]))
			}
			victim := pids[0]
			t.Logf("%d locks on %d sessions; terminating backend %d, which carries %d", n, len(pids), victim, len(byPID[victim]))
			start := time.Now()
			terminate(t, srv, victim)
			for _, lk := range byPID[victim] {
				select {
				case <-lk.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("lock %v on the terminated session: not reported lost after 10 s", lk.Key())
				}
				if !errors.Is(lk.Err(), sqllock.ErrLockLost) {
					t.Fatalf("lock %v: Err() = %v, want ErrLockLost", lk.Key(), lk.Err())
				}
			}
			t.Logf("all %d locks of the terminated session reported lost in %v", len(byPID[victim]), time.Since(start))
			time.Sleep(300 * time.Millisecond) // more keep-alive checks: no other loss
			survivors := 0
			for _, pid := range pids[1:] {
				for _, lk := range byPID[pid] {
					if err := lk.Err(); err != nil {
						t.Errorf("lock %v on backend %d: Err() = %v after another session was terminated", lk.Key(), pid, err)
					}
					survivors++
				}
			}
			if got := advisoryCount(t, observer); got != survivors {
				t.Errorf("server shows %d advisory locks, want the %d survivors", got, survivors)
			}
			// The Locker goes on: a new lock on a session that lives.
			fresh, err := l.TryLock(bg(), sqllock.Int64(4244))
			if err != nil || fresh.PID() == victim {
				t.Fatalf("TryLock after the loss = %v on backend %d", err, fresh.PID())
			}
			for _, lk := range append(locks, fresh) {
				err := lk.Unlock(bg())
				switch {
				case lk.PID() == victim && !errors.Is(err, sqllock.ErrLockLost):
					t.Errorf("Unlock of a lost lock = %v, want ErrLockLost", err)
				case lk.PID() != victim && err != nil:
					t.Errorf("Unlock of %v = %v", lk.Key(), err)
				}
			}
			waitNoLocks(t, observer, 10*time.Second)
		})
	}
}

// TestSharedSessionsGoBack: shared sessions that hold nothing go back to
// the pool (their settings reset) a second after their last lock.
func TestSharedSessionsGoBack(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		lk, err := l.TryLock(bg(), sqllock.Int64(7))
		if err != nil {
			t.Fatal(err)
		}
		if n := l.Stats().SharedSessions; n != 1 {
			t.Fatalf("SharedSessions = %d with one lock, want 1", n)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for l.Stats().SharedSessions != 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := l.Stats().SharedSessions; n != 0 {
			t.Fatalf("SharedSessions = %d five seconds after the last unlock, want 0", n)
		}
		if st := l.Stats(); st.Discarded != 0 {
			t.Errorf("Discarded = %d: the shared session did not go back to the pool", st.Discarded)
		}
		dl := sqllock.New(db, sqllock.WithDedicatedSessions())
		dk, err := dl.TryLock(bg(), sqllock.Int64(8))
		if err != nil {
			t.Fatal(err)
		}
		defer dk.Unlock(bg())
		if sqllock.ConnOf(dk) == nil {
			t.Errorf("no connection of its own with WithDedicatedSessions")
		}
	})
}

// TestSharedCallerNotHeld: a call that sends its own statement on a
// shared session (nothing else was under way on it) returns with its
// answer, not after the calls that queued behind it meanwhile: those go
// out in the next statement, sent for them by the session's runner. Over
// a link of 400 ms round trips: A's try is in flight when B's queues on
// the same session; A returns a round trip before B does.
func TestSharedCallerNotHeld(t *testing.T) {
	t.Parallel()
	const oneWay = 200 * time.Millisecond
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			dsn := srv.NewDatabase(t)
			proxy := pgtest.StartProxy(t, srv.Addr(), oneWay)
			l := sqllock.New(pgtest.Open(t, drv, proxy.DSN(dsn)))
			// The shared session opened, and idle (it lingers a second).
			lk, err := l.TryLock(bg(), sqllock.Int64(1))
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			type result struct {
				lk  *sqllock.Lock
				err error
				at  time.Time
			}
			try := func(k int64, out chan<- result) {
				lk, err := l.TryLock(bg(), sqllock.Int64(k))
				out <- result{lk, err, time.Now()}
			}
			a, b := make(chan result, 1), make(chan result, 1)
			sent := proxy.RoundTrips()
			go try(2, a)
			// B once A's statement is on its way (its answer is a round
			// trip away).
			for deadline := time.Now().Add(10 * time.Second); proxy.RoundTrips() == sent; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("A's statement never reached the server")
				}
			}
			go try(3, b)
			ra, rb := <-a, <-b
			for _, r := range []result{ra, rb} {
				if r.err != nil {
					t.Fatal(r.err)
				}
				defer func() {
					if err := r.lk.Unlock(bg()); err != nil {
						t.Error(err)
					}
				}()
			}
			if ra.lk.PID() != rb.lk.PID() {
				t.Fatalf("A on backend %d, B on %d: want one shared session", ra.lk.PID(), rb.lk.PID())
			}
			gap := rb.at.Sub(ra.at)
			t.Logf("A returned %v before B", gap)
			if gap < oneWay {
				t.Errorf("A returned %v before B, want at least %v (half of B's own round trip): A was held for B's statement", gap, oneWay)
			}
		})
	}
}
