package sqllock_test

// A waiting Lock whose try on a shared session was refused waits on that
// session when it carries no other lock (the hand-over; see share.go).

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// poolSettings reads the settings of every connection of db's pool (n
// connections, all taken at once).
func poolSettings(t *testing.T, db *sql.DB, n int) []string {
	t.Helper()
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var out []string
	for range n {
		c, err := db.Conn(bg())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		out = append(out, sessionSettings(t, c))
	}
	return out
}

// waiterPID returns the pid that waits (not granted) for k; there must be
// one.
func waiterPID(t *testing.T, q sqllock.Querier, k sqllock.Key) int {
	t.Helper()
	pid := waitingPID(t, q, k)
	if pid == 0 {
		t.Fatalf("no waiter for %v", k)
	}
	return pid
}

func waitNoShared(t *testing.T, l *sqllock.Locker) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); l.Stats().SharedSessions != 0; {
		if time.Now().After(deadline) {
			t.Fatal("shared sessions did not go back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// handoverConns is the pool size of the hand-over tests: carrierLimit 1,
// one shared session.
const handoverConns = 4

// handoverPool opens a pool of handoverConns connections on a database of
// its own, with drv; the settings its connections came with; and a pool of
// the same database, with a Locker on it, for the other holders.
func handoverPool(t *testing.T, srv *pgtest.Server, drv string) (db, odb *sql.DB, other *sqllock.Locker, before string) {
	t.Helper()
	dsn := srv.NewDatabase(t)
	db = pgtest.Open(t, drv, dsn)
	db.SetMaxOpenConns(handoverConns)
	db.SetMaxIdleConns(handoverConns)
	odb = pgtest.Open(t, "pgx", dsn)
	return db, odb, sqllock.New(odb, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0)), sessionSettings(t, db)
}

// TestHandoverLeavesAsItCame: the handed-over session goes back to the
// pool as it came on each path (not granted by the deadline, tuned or
// not; granted then unlocked; its wait's connection killed).
func TestHandoverLeavesAsItCame(t *testing.T) {
	long(t)
	t.Parallel()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, odb, other, before := handoverPool(t, srv, drv)
			const n = handoverConns
			l := sqllock.New(db, sqllock.WithOrphanBound(4*time.Second), sqllock.WithKeepAlive(0), sqllock.WithApplicationName("handover"))
			k, k2 := sqllock.Int64(7001), sqllock.Int64(7002)
			check := func(what string) {
				t.Helper()
				waitNoShared(t, l)
				for i, s := range poolSettings(t, db, n) {
					if s != before {
						t.Errorf("%s: pooled connection %d has %q, came with %q", what, i, s, before)
					}
				}
			}
			held, err := other.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}

			// (a) A tuned shared session (it held k2), handed over; the
			// wait ends at its deadline.
			lk2, err := l.TryLock(bg(), k2)
			if err != nil {
				t.Fatal(err)
			}
			carrierPID := lk2.PID()
			lk2.Unlock(bg())
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(bg(), 700*time.Millisecond)
				defer cancel()
				_, err := l.Lock(ctx, k)
				done <- err
			}()
			testkit.WaitWaiters(t, odb, k, 1)
			if p := waiterPID(t, odb, k); p != carrierPID {
				t.Errorf("(a) waiter %d is not the shared session %d (no hand-over)", p, carrierPID)
			}
			if err := <-done; !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("(a) Lock = %v", err)
			}
			check("(a) tuned, deadline")

			// (b) An untuned shared session (its first try was refused).
			time.Sleep(1100 * time.Millisecond) // k no longer hot
			ctx, cancel := context.WithTimeout(bg(), 700*time.Millisecond)
			_, err = l.Lock(ctx, k)
			cancel()
			if !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("(b) Lock = %v", err)
			}
			check("(b) untuned, deadline")

			// (c) Handed over, granted, unlocked.
			time.Sleep(1100 * time.Millisecond)
			got := make(chan *sqllock.Lock, 1)
			go func() {
				lk, err := l.Lock(bg(), k)
				if err != nil {
					t.Error(err)
				}
				got <- lk
			}()
			testkit.WaitWaiters(t, odb, k, 1)
			held.Unlock(bg())
			lk := <-got
			if lk == nil {
				t.FailNow()
			}
			locks, _ := sqllock.Inspect(bg(), odb, nil, k)
			if len(locks) != 1 || locks[0].ApplicationName != "handover" {
				t.Errorf("(c) holder = %+v: want it named handover", locks)
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			check("(c) granted, unlocked")

			// (d) Handed over; the wait's backend is terminated: the call
			// goes on, on another session, and is granted.
			held, err = other.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(1100 * time.Millisecond)
			go func() {
				ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
				defer cancel()
				lk, err := l.Lock(ctx, k)
				if err != nil {
					t.Errorf("(d) Lock after its wait's session was terminated = %v", err)
				}
				got <- lk
			}()
			testkit.WaitWaiters(t, odb, k, 1)
			victim := waiterPID(t, odb, k)
			if _, err := odb.ExecContext(bg(), "SELECT pg_terminate_backend($1)", victim); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); time.Sleep(300 * time.Millisecond); held.Unlock(bg()) }()
			lk = <-got
			waitGroup(t, &wg, hangCeiling)
			if lk != nil {
				lk.Unlock(bg())
			}
			check("(d) wait's session terminated")
		})
	}
}

// TestHandoverRefusedThenGranted: a shared session whose first try was
// refused applies the settings with its first grant (single or batched),
// keeps its locks past the orphan bound under the keep-alive, and goes back
// as it came.
func TestHandoverRefusedThenGranted(t *testing.T) {
	long(t)
	t.Parallel()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, odb, other, before := handoverPool(t, srv, drv)
			const n = handoverConns
			l := sqllock.New(db, sqllock.WithOrphanBound(4*time.Second), sqllock.WithKeepAlive(500*time.Millisecond), sqllock.WithApplicationName("refused-then"))
			k := sqllock.Int64(7101)
			held, err := other.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("TryLock of a held key = %v", err)
			}
			held.Unlock(bg())
			// One grant, then a batch.
			first, err := l.TryLock(bg(), sqllock.Int64(7102))
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var locks []*sqllock.Lock
			var wg sync.WaitGroup
			for i := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lk, err := l.Lock(bg(), sqllock.Int64(int64(7200+i)))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					locks = append(locks, lk)
					mu.Unlock()
				}()
			}
			waitGroup(t, &wg, hangCeiling)
			locks = append(locks, first)
			all, _ := sqllock.Inspect(bg(), odb, nil)
			for _, h := range all {
				if h.Granted && h.ApplicationName != "refused-then" {
					t.Errorf("holder %+v is not named", h)
				}
			}
			time.Sleep(5 * time.Second) // past the orphan bound: the keep-alive keeps them
			for _, lk := range locks {
				if err := lk.Err(); err != nil {
					t.Errorf("lock lost while held: %v", err)
				}
				if err := lk.Unlock(bg()); err != nil {
					t.Errorf("Unlock: %v", err)
				}
			}
			waitNoShared(t, l)
			for i, s := range poolSettings(t, db, n) {
				if s != before {
					t.Errorf("pooled connection %d has %q, came with %q", i, s, before)
				}
			}
		})
	}
}
