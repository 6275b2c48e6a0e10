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

// setDeadlockTimeout sets deadlock_timeout for new sessions of dsn's
// database (a superuser setting).
func setDeadlockTimeout(t *testing.T, srv *pgtest.Server, dsn string, d time.Duration) {
	t.Helper()
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(fmt.Sprintf("ALTER DATABASE %q SET deadlock_timeout = '%dms'", pgtest.DatabaseOf(dsn), d.Milliseconds())); err != nil {
		t.Fatal(err)
	}
}

// TestWaitersDoNotBreakConcurrentIndexBuilds: while a holder runs CREATE
// INDEX CONCURRENTLY (or REINDEX CONCURRENTLY) on its lock's session, three
// waiters wait for the lock (Lock, RLock, Do). The index build waits for the
// waiters' snapshots, which PostgreSQL reports to a waiter as a deadlock;
// the waiters must wait on, the build must finish, and each waiter must get
// the lock in turn, none seeing an error.
func TestWaitersDoNotBreakConcurrentIndexBuilds(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	deadlockTimeouts := []time.Duration{100 * time.Millisecond, time.Second} // scaled down, and the default
	if testkit.Short() {
		// The quick run loads the machine with many tests at once: there,
		// the default, whose slices leave the server half a second.
		deadlockTimeouts = deadlockTimeouts[1:]
	}
	for _, dt := range deadlockTimeouts {
		t.Run(fmt.Sprintf("deadlock_timeout=%v", dt), func(t *testing.T) { testConcurrentIndexBuilds(t, srv, dt) })
	}
}

func testConcurrentIndexBuilds(t *testing.T, srv *pgtest.Server, deadlockTimeout time.Duration) {
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		setDeadlockTimeout(t, srv, dsn, deadlockTimeout)
		if _, err := db.Exec("CREATE TABLE items AS SELECT g AS id, md5(g::text) AS name FROM generate_series(1, 20000) g"); err != nil {
			t.Fatal(err)
		}
		holderL := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0)) // the DDL runs on the holder's own session, with no check of the Locker beside it
		// A Locker per waiter: the callers of one Locker that wait for one
		// key queue inside it, and only the first waits in the server.
		waiterLs := map[string]*sqllock.Locker{"Lock": sqllock.New(db), "RLock": sqllock.New(db), "Do": sqllock.New(db)}
		snapshotWaits := func() (n int64) {
			for _, l := range waiterLs {
				n += l.Stats().SnapshotWaits
			}
			return n
		}
		k := sqllock.Hash("migrations")
		for _, ddl := range []string{
			"CREATE INDEX CONCURRENTLY items_name ON items (name)",
			"REINDEX INDEX CONCURRENTLY items_name",
		} {
			lk, err := holderL.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var order []string
			var wg sync.WaitGroup
			waiters := map[string]func(ctx context.Context) error{
				"Lock": func(ctx context.Context) error {
					w, err := waiterLs["Lock"].Lock(ctx, k)
					if err != nil {
						return err
					}
					time.Sleep(20 * time.Millisecond)
					return w.Unlock(ctx)
				},
				"RLock": func(ctx context.Context) error {
					w, err := waiterLs["RLock"].RLock(ctx, k)
					if err != nil {
						return err
					}
					time.Sleep(20 * time.Millisecond)
					return w.Unlock(ctx)
				},
				"Do": func(ctx context.Context) error {
					return waiterLs["Do"].Do(ctx, k, func(context.Context) error {
						time.Sleep(20 * time.Millisecond)
						return nil
					})
				},
			}
			errs := make(chan error, len(waiters))
			for name, wait := range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(bg(), 30*time.Second)
					defer cancel()
					err := wait(ctx)
					if err != nil {
						errs <- fmt.Errorf("%s: %w", name, err)
					}
					mu.Lock()
					order = append(order, name)
					mu.Unlock()
				}()
			}
			testkit.WaitWaiters(t, db, k, len(waiters))
			// Let the waiters' own deadlock checks pass first: the build is
			// then the one to find the cycle, and, were the waits plain,
			// the one to fail.
			time.Sleep(2 * deadlockTimeout)
			before := snapshotWaits()
			start := time.Now()
			if _, err := sqllock.ConnOf(lk).ExecContext(bg(), ddl); err != nil {
				t.Fatalf("%s on the holder's session: %v", ddl, err)
			}
			took := time.Since(start)
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			waitGroup(t, &wg, hangCeiling)
			close(errs)
			for err := range errs {
				t.Errorf("%s: waiter failed: %v", ddl, err)
			}
			t.Logf("%s took %v with 3 waiters; waits started again: %d; waiters got the lock in order %v",
				ddl, took, snapshotWaits()-before, order)
			if len(order) != len(waiters) {
				t.Fatalf("%d of %d waiters finished", len(order), len(waiters))
			}
			// Held up by the waiters, the build would wait for their
			// 30 s deadlines (and they would fail); a loaded server
			// may take seconds for the build itself.
			if took > 3*deadlockTimeout+5*time.Second {
				t.Errorf("%s took %v: the waiters held it up", ddl, took)
			}
		}
		waitNoLocks(t, db, 5*time.Second)
	})
}
