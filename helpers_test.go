package sqllock_test

import (
	"context"
	"database/sql"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// drivers are the database/sql drivers every behaviour is proven with.
var drivers = []string{"postgres", "pgx"}

// eachDriver runs f once per driver, each with a database of its own.
func eachDriver(t *testing.T, f func(t *testing.T, db *sql.DB, dsn string)) {
	t.Helper()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			f(t, pgtest.Open(t, drv, dsn), dsn)
		})
	}
}

// eachDriverParallel is eachDriver with the drivers' runs in parallel: for
// an f that shares nothing with its caller or with the other run.
func eachDriverParallel(t *testing.T, f func(t *testing.T, db *sql.DB, dsn string)) {
	t.Helper()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			dsn := srv.NewDatabase(t)
			f(t, pgtest.Open(t, drv, dsn), dsn)
		})
	}
}

// holders returns the pids that hold k (granted), as another session sees
// them.
func holders(t testing.TB, q sqllock.Querier, k sqllock.Key) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locks, err := sqllock.Inspect(ctx, q, nil, k)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	var pids []int
	for _, l := range locks {
		if l.Granted {
			pids = append(pids, l.PID)
		}
	}
	return pids
}

// advisoryCount returns how many advisory locks exist in db's database.
func advisoryCount(t testing.TB, q sqllock.Querier) int {
	t.Helper()
	locks, err := sqllock.Inspect(context.Background(), q, nil)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return len(locks)
}

// waitFree waits until nobody holds k, and fails t after d.
func waitFree(t testing.TB, q sqllock.Querier, k sqllock.Key, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if len(holders(t, q, k)) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock %v still held by %v after %v", k, holders(t, q, k), d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func bg() context.Context { return context.Background() }

// hangCeiling bounds a test's wait for calls that must return (see
// waitGroup): far past what any of them takes on a loaded machine, and
// well within the run's timeout, so that a call that never returns fails
// its own test, with every goroutine's stack, instead of the whole run.
const hangCeiling = 5 * time.Minute

// waitGroup waits for wg, for at most ceiling (far longer than what it
// waits for takes on a loaded machine); then it fails t with every
// goroutine's stack, so that calls that never return fail their test
// instead of stopping the whole run at its timeout.
func waitGroup(t testing.TB, wg *sync.WaitGroup, ceiling time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(ceiling):
		buf := make([]byte, 16<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("calls still running after %v; goroutines:\n%s", ceiling, buf)
	}
}

// waitNoLocks waits until db's database has no advisory locks, and fails t
// after d. A waiter whose context ended is discarded by sqllock, but its
// backend can still be granted the lock, and hold it until it notices its
// client left; this waits for that.
func waitNoLocks(t testing.TB, q sqllock.Querier, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for advisoryCount(t, q) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d advisory locks left after %v", advisoryCount(t, q), d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// long skips t under -short (stress, fault and timing-heavy runs), except
// in CI (CI=true), where every test runs.
func long(t testing.TB) {
	t.Helper()
	testkit.Long(t)
}

// heldByAnotherRole takes key k in a session of the superuser, named
// appName, for t's life, and returns a pool of the ordinary test role on
// the same database, and whether that role may read all statistics (the
// superuser of a SQLLOCK_TEST_DSN may).
func heldByAnotherRole(t *testing.T, k int64, appName string) (user *sql.DB, privileged bool) {
	t.Helper()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	admin := pgtest.Open(t, "pgx", srv.AdminDSNFor(pgtest.DatabaseOf(dsn)))
	conn, err := admin.Conn(bg())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.ExecContext(bg(), "SELECT set_config('application_name', $1, false), pg_advisory_lock($2)", appName, k); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.ExecContext(bg(), "SELECT pg_advisory_unlock_all()") })
	user = pgtest.Open(t, "pgx", dsn)
	if err := user.QueryRow(`SELECT current_setting('is_superuser') = 'on' OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')`).Scan(&privileged); err != nil {
		t.Fatal(err)
	}
	return user, privileged
}

// waitingPID returns the pid of a session that waits (not granted) for k,
// or 0.
func waitingPID(t testing.TB, q sqllock.Querier, k sqllock.Key) int {
	t.Helper()
	locks, err := sqllock.Inspect(bg(), q, nil, k)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range locks {
		if !l.Granted {
			return l.PID
		}
	}
	return 0
}
