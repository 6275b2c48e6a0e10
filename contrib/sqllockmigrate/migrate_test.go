package sqllockmigrate_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/database/postgres"
	_ "github.com/golang-migrate/migrate/v4/source/file"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockmigrate"
	"github.com/sqllock/sqllock/interop"
	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// gate is the advisory key the first migration waits for, so that the test
// decides when the index build starts.
const gate = 4242

// source writes the migrations: the first waits for the test's gate, the
// second builds an index concurrently (outside a transaction: with
// x-multi-statement each statement runs on its own).
func source(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"1_gate.up.sql": fmt.Sprintf("SELECT pg_advisory_lock(%d);\nSELECT pg_advisory_unlock(%d);\n", gate, gate),
		"2_cic.up.sql":  "CREATE INDEX CONCURRENTLY items_name ON items (name);\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return "file://" + dir
}

// migrateURL is golang-migrate's URL for dsn, with its postgres driver
// (lib/pq) and one statement at a time.
func migrateURL(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err == nil && u.Scheme == "" {
		err = fmt.Errorf("%q is not a URL", dsn)
	}
	if err != nil {
		pgtest.Unavailable(t, "a server whose DSN is a URL (golang-migrate opens URLs)", err)
	}
	u.Scheme = "postgres"
	q := u.Query()
	q.Set("x-multi-statement", "true")
	u.RawQuery = q.Encode()
	return u.String()
}

// outcome is how one instance's Up ended.
type outcome struct {
	err  error
	took time.Duration
}

// opener opens one instance's Migrate on dsn (opening may wait for the
// lock: golang-migrate's PostgreSQL drivers take it to create their version
// table).
type opener func(dsn string) (*migrate.Migrate, error)

// up opens an instance and runs its Up in the background, as a deploy
// does; ErrNoChange (another instance applied everything) is success. The
// Migrate is closed when t ends.
func up(t *testing.T, open opener, dsn string) <-chan outcome {
	c := make(chan outcome, 1)
	start := time.Now()
	var m *migrate.Migrate
	t.Cleanup(func() {
		if m != nil {
			m.Close()
		}
	})
	go func() {
		var err error
		m, err = open(dsn)
		if err == nil {
			err = m.Up()
		}
		if errors.Is(err, migrate.ErrNoChange) {
			err = nil
		}
		c <- outcome{err, time.Since(start)}
	}()
	return c
}

// cicTrial runs the scenario once on a fresh database: instance A takes
// the lock and stops at the gate; instance B is seen waiting for the lock
// (in pg_locks); the gate opens and A builds the index concurrently while
// B waits. It returns both outcomes, or a zero outcome with stalled set
// when an instance was still running at bound (then its backends are
// ended).
func cicTrial(t *testing.T, open opener, keyOf func(dsn string) sqllock.Key, bound time.Duration) (a, b outcome, valid, stalled bool) {
	t.Helper()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	if _, err := db.Exec("CREATE TABLE items AS SELECT g AS id, md5(g::text) AS name FROM generate_series(1, 2000) g"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	gateConn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer gateConn.Close()
	if _, err := gateConn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", gate); err != nil {
		t.Fatal(err)
	}
	key := keyOf(dsn)
	waiting := func(k sqllock.Key) bool {
		held, err := sqllock.Inspect(ctx, db, nil, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range held {
			if !h.Granted {
				return true
			}
		}
		return false
	}
	until := func(cond func() bool, what string) {
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: not seen within %v", what, bound)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}

	aDone := up(t, open, dsn)
	until(func() bool { return waiting(sqllock.Int64(gate)) }, "A at the gate")
	bDone := up(t, open, dsn)
	until(func() bool { return waiting(key) }, "B waiting for the lock")
	if _, err := gateConn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", gate); err != nil {
		t.Fatal(err)
	}
	var gotA, gotB bool
	for !gotA || !gotB {
		select {
		case a = <-aDone:
			gotA = true
		case b = <-bDone:
			gotB = true
		case <-ctx.Done():
			// Stalled: end the instances' backends so that their Up returns.
			admin, err := srv.Admin()
			if err != nil {
				t.Fatal(err)
			}
			_, err = admin.Exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", pgtest.DatabaseOf(dsn))
			admin.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !gotA {
				<-aDone
			}
			if !gotB {
				<-bDone
			}
			return outcome{}, outcome{}, false, true
		}
	}
	return a, b, indexValid(t, dsn), false
}

// indexValid reports whether the index build finished (a failed CREATE
// INDEX CONCURRENTLY leaves an invalid index behind).
func indexValid(t *testing.T, dsn string) bool {
	t.Helper()
	var valid bool
	err := pgtest.Open(t, "pgx", dsn).QueryRow("SELECT coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = 'items_name'::regclass), false)").Scan(&valid)
	if err != nil {
		return false
	}
	return valid
}

// TestCICWhileWaiting: instance A runs a migration with CREATE INDEX
// CONCURRENTLY while instance B waits for the lock, both opened with
// OpenPostgres (B waits as it opens: the driver takes the lock to create
// its version table), at the server's default deadlock_timeout (1 s): 20 of
// 20 trials, both finish, the index is valid.
func TestCICWhileWaiting(t *testing.T) {
	src := source(t)
	open := func(t *testing.T) opener {
		return func(dsn string) (*migrate.Migrate, error) {
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { db.Close() })
			drv, err := sqllockmigrate.OpenPostgres(context.Background(), sqllock.New(db),
				&postgres.Config{MultiStatementEnabled: true}, sqllockmigrate.WithWait(time.Minute))
			if err != nil {
				return nil, err
			}
			m, err := migrate.NewWithDatabaseInstance(src, "postgres", drv)
			if err != nil {
				return nil, err
			}
			m.LockTimeout = 2 * time.Minute
			return m, nil
		}
	}
	keyOf := func(dsn string) sqllock.Key {
		return interop.GolangMigrate(pgtest.DatabaseOf(dsn), "public", "schema_migrations")
	}
	const trials = 20
	ran, ok := 0, 0
	var worst time.Duration
	for i := range trials {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ran++
			a, b, valid, stalled := cicTrial(t, open(t), keyOf, 90*time.Second)
			switch {
			case stalled:
				t.Errorf("stalled: an instance was still running after 90 s")
			case a.err != nil || b.err != nil:
				t.Errorf("A: %v; B: %v", a.err, b.err)
			case !valid:
				t.Errorf("the index is not valid")
			default:
				ok++
				worst = max(worst, a.took, b.took)
			}
		})
	}
	t.Logf("%d of %d trials: both instances finished, the index built (the slower Up took at most %v)", ok, ran, worst.Round(time.Millisecond))
	if ok != ran {
		t.Errorf("%d of %d trials finished", ok, ran)
	}
}

// TestUpstreamCICDeadlocks runs the same scenario with golang-migrate's own
// postgres driver on both instances (opened from a URL, as the migrate
// command does), whose B waits in pg_advisory_lock: the index build waits
// for B's snapshot while B waits for A's lock. It reports what it saw in
// each trial, and fails if upstream ever gets through: then the comparison
// in the package doc and in docs/benchmarks.md is out of date.
func TestUpstreamCICDeadlocks(t *testing.T) {
	src := source(t)
	open := func(dsn string) (*migrate.Migrate, error) {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, err
		}
		u.Scheme = "postgres"
		q := u.Query()
		q.Set("x-multi-statement", "true")
		u.RawQuery = q.Encode()
		m, err := migrate.New(src, u.String())
		if err != nil {
			return nil, err
		}
		m.LockTimeout = 2 * time.Minute
		return m, nil
	}
	keyOf := func(dsn string) sqllock.Key {
		k, err := interop.GolangMigrateURL(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	migrateURL(t, pgtest.Start(t).DSN()) // golang-migrate needs a URL
	const trials = 3
	ran, failed := 0, 0
	for i := range trials {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			ran++
			a, b, valid, stalled := cicTrial(t, open, keyOf, 30*time.Second)
			switch {
			case stalled:
				failed++
				t.Logf("stalled: an instance was still running after 30 s")
			case a.err != nil || b.err != nil || !valid:
				failed++
				t.Logf("A after %v: %v; B after %v: %v; index valid: %v", a.took.Round(time.Millisecond), a.err, b.took.Round(time.Millisecond), b.err, valid)
			default:
				t.Logf("both finished (A %v, B %v)", a.took.Round(time.Millisecond), b.took.Round(time.Millisecond))
			}
		})
	}
	t.Logf("upstream's postgres driver: %d of %d trials failed or stalled", failed, ran)
	if failed != ran {
		t.Errorf("upstream got through %d of %d trials: the comparison is out of date", ran-failed, ran)
	}
}

// TestWaitIsBounded: while another instance holds the lock, a driver
// that waits at most 300 ms (WithWait) gets an error matching
// database.ErrLocked and sqllock.ErrNotAcquired, both as it opens
// (OpenPostgres) and in Up, and its waits leave nothing behind: once the
// holder releases, a try gets the lock at once. Upstream's driver, given a
// LockTimeout of 300 ms, returns ErrLockTimeout from Up but leaves its
// pg_advisory_lock waiting, which takes the lock when the holder releases
// and keeps it until that Migrate is closed (golang-migrate issue 269); its
// opening, which takes the lock too, is not bounded at all.
func TestWaitIsBounded(t *testing.T) {
	const wait = 300 * time.Millisecond
	for _, upstream := range []bool{false, true} {
		name := map[bool]string{false: "sqllockmigrate", true: "upstream"}[upstream]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := pgtest.Start(t).NewDatabase(t)
			u := migrateURL(t, dsn)
			db := pgtest.Open(t, "pgx", dsn)
			key := interop.GolangMigrate(pgtest.DatabaseOf(dsn), "public", "schema_migrations")
			if upstream {
				key, _ = interop.GolangMigrateURL(u)
			}
			l := sqllock.New(db)
			open := func() (*migrate.Migrate, error) {
				if upstream {
					return migrate.New(source(t), u)
				}
				drv, err := sqllockmigrate.OpenPostgres(ctx, sqllock.New(pgtest.Open(t, "pgx", dsn)), nil, sqllockmigrate.WithWait(wait))
				if err != nil {
					return nil, err
				}
				return migrate.NewWithDatabaseInstance(source(t), "postgres", drv)
			}
			bounded := func(what string, err error, took time.Duration) {
				t.Helper()
				t.Logf("%s while another instance holds the lock: after %v: %v", what, took.Round(time.Millisecond), err)
				// The wait's deadline ended it (sqllock ends a wait in the
				// server just before its deadline), not golang-migrate's
				// LockTimeout of a minute.
				if !errors.Is(err, database.ErrLocked) || !errors.Is(err, sqllock.ErrNotAcquired) ||
					!errors.Is(err, context.DeadlineExceeded) || errors.Is(err, migrate.ErrLockTimeout) {
					t.Fatalf("%s = %v, want the wait's error (database.ErrLocked, sqllock.ErrNotAcquired, context.DeadlineExceeded)", what, err)
				}
			}
			holder, err := l.Lock(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if !upstream {
				start := time.Now()
				_, err := open()
				bounded("opening", err, time.Since(start))
			}
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			m, err := open()
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			m.LockTimeout = time.Minute
			if upstream {
				m.LockTimeout = wait
			}
			if holder, err = l.Lock(ctx, key); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = m.Up()
			took := time.Since(start)
			if upstream {
				t.Logf("Up() while another instance holds the lock: after %v: %v", took.Round(time.Millisecond), err)
				if !errors.Is(err, migrate.ErrLockTimeout) {
					t.Fatalf("upstream: Up() = %v, want ErrLockTimeout", err)
				}
			} else {
				bounded("Up()", err, took)
			}
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// A try from a third instance: upstream's abandoned wait takes
			// the lock a moment after the release, so it is looked for.
			third := sqllock.New(pgtest.Open(t, "pgx", dsn))
			deadline := time.Now().Add(10 * time.Second)
			for {
				lk, err := third.TryLock(ctx, key)
				if err == nil {
					lk.Unlock(ctx)
				}
				switch {
				case err == nil && !upstream:
					return // nothing left behind
				case err == nil && time.Now().Before(deadline):
					time.Sleep(20 * time.Millisecond)
					continue
				case err == nil:
					t.Fatal("upstream: the abandoned wait never took the lock: the comparison is out of date")
				case !errors.Is(err, sqllock.ErrNotAcquired):
					t.Fatal(err)
				case !upstream:
					t.Fatalf("after the wait and the holder's release, TryLock() = %v: the wait left the lock taken", err)
				}
				t.Logf("upstream: after the holder's release, the abandoned wait holds the lock until its Migrate is closed")
				m.Close()
				lk, err = third.Lock(ctx, key) // free once it is closed
				if err != nil {
					t.Fatal(err)
				}
				lk.Unlock(ctx)
				return
			}
		})
	}
}
