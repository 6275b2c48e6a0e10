package pgtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestJob is how an integration test of yours uses the harness.
func TestJob(t *testing.T) {
	db := pgtest.Open(t, "pgx", pgtest.Start(t).NewDatabase(t))
	var ok bool
	if err := db.QueryRowContext(context.Background(), "SELECT pg_try_advisory_xact_lock(42)").Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_try_advisory_xact_lock = %v, %v", ok, err)
	}
}

// TestOrdinaryRole: tests connect as a role without superuser rights.
func TestOrdinaryRole(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	var user string
	var super bool
	if err := db.QueryRow("SELECT current_user, usesuper FROM pg_user WHERE usename = current_user").Scan(&user, &super); err != nil {
		t.Fatal(err)
	}
	if user != pgtest.Role || super {
		t.Fatalf("tests run as %q (superuser %v), want the ordinary role %q", user, super, pgtest.Role)
	}
	if !strings.Contains(srv.DSN(), "127.0.0.1") && srv.Local() {
		t.Fatalf("DSN %q", srv.DSN())
	}
}

// TestNewDatabaseIsolated: each test's database is its own and is dropped
// at the end.
func TestNewDatabaseIsolated(t *testing.T) {
	srv := pgtest.Start(t)
	var name string
	t.Run("inner", func(t *testing.T) {
		dsn := srv.NewDatabase(t)
		name = pgtest.DatabaseOf(dsn)
		db := pgtest.Open(t, "pgx", dsn)
		if _, err := db.Exec("CREATE TABLE t (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.QueryRow("SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database %s still exists after its test: %d, %v", name, n, err)
	}
}

// TestNewDatabaseReused: a database its test left with no objects goes to
// the next test under another name, with no session and no lock of the
// first left: a lock still held, on a connection still open, is gone, and
// the old name no longer connects.
func TestNewDatabaseReused(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := context.Background()
	var first string
	var oid int
	t.Run("first", func(t *testing.T) {
		dsn := srv.NewDatabase(t)
		first = pgtest.DatabaseOf(dsn)
		db, err := sql.Open("pgx", dsn) // never closed: its session outlives the test
		if err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRowContext(ctx, "SELECT oid FROM pg_database WHERE datname = current_database()").Scan(&oid); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock(42)"); err != nil {
			t.Fatal(err)
		}
		// A temporary table's schema stays in the catalog; it is no object
		// of the test's once the session ends.
		if _, err := conn.ExecContext(ctx, "CREATE TEMP TABLE scratch (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	dsn := srv.NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	var again, sessions, locks int
	if err := db.QueryRow(`SELECT d.oid,
		(SELECT count(*) FROM pg_stat_activity a WHERE a.datid = d.oid AND a.pid <> pg_backend_pid()),
		(SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND l.database = d.oid)
		FROM pg_database d WHERE d.datname = current_database()`).Scan(&again, &sessions, &locks); err != nil {
		t.Fatal(err)
	}
	if again != oid || pgtest.DatabaseOf(dsn) == first {
		t.Fatalf("the next database is %s (oid %d), not %s (oid %d) renamed", pgtest.DatabaseOf(dsn), again, first, oid)
	}
	if sessions != 0 || locks != 0 {
		t.Fatalf("the reused database has %d sessions and %d advisory locks of its last test", sessions, locks)
	}
	old, err := sql.Open("pgx", srv.DSNFor(first))
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.PingContext(ctx); err == nil {
		t.Fatalf("the old name %s still connects", first)
	}
}

// TestNewDatabaseNotReusedWithLeftovers: a database in which its test left
// anything of its own is dropped, not handed to the next test.
func TestNewDatabaseNotReusedWithLeftovers(t *testing.T) {
	srv := pgtest.Start(t)
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, leftover := range []string{
		"CREATE TABLE t (x int)",
		"SELECT lo_create(0)",
		"COMMENT ON SCHEMA public IS 'mine'",
		"GRANT CREATE ON SCHEMA public TO PUBLIC",
		"REVOKE TEMPORARY ON DATABASE %s FROM PUBLIC",
		"ALTER DATABASE %s SET work_mem = '8MB'",
		"CREATE PUBLICATION mine",
		"CREATE SCHEMA mine",
	} {
		var oid int
		t.Run(leftover, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			name := pgtest.DatabaseOf(dsn)
			db := pgtest.Open(t, "pgx", srv.AdminDSNFor(name))
			if err := db.QueryRow("SELECT oid FROM pg_database WHERE datname = current_database()").Scan(&oid); err != nil {
				t.Fatal(err)
			}
			q := leftover
			if strings.Contains(q, "%s") {
				q = fmt.Sprintf(q, `"`+name+`"`)
			}
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		})
		var n int
		if err := admin.QueryRow("SELECT count(*) FROM pg_database WHERE oid = $1", oid).Scan(&n); err != nil || n != 0 {
			t.Errorf("after %q, the test's database (oid %d) was kept: %d, %v", leftover, oid, n, err)
		}
	}
}

// TestNoLeftoversWithoutClose: a program that starts a throwaway server and
// exits without closing it (as a test binary without pgtest.Run does) leaves
// no data directory behind.
func TestNoLeftoversWithoutClose(t *testing.T) {
	cmd := exec.Command("go", "run", "./testdata/leaver") // with local binaries, whatever this binary's server is
	cmd.Env = append(os.Environ(), "SQLLOCK_TEST_SERVER=local")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("leaver: %v", err)
	}
	base := filepath.Dir(strings.TrimPrefix(strings.TrimSpace(string(out)), "dir "))
	if !strings.Contains(base, "sqllock-pg-") {
		t.Fatalf("leaver printed %q", out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(base); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists 15 s after its program exited", base)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestProxyToOwnServer: a server of SQLLOCK_TEST_DSN has an address, so a
// Proxy can stand in front of it (the RTT benchmarks do).
func TestProxyToOwnServer(t *testing.T) {
	srv := pgtest.Start(t)
	t.Setenv("SQLLOCK_TEST_DSN", srv.AdminDSN())
	own, err := pgtest.Embedded(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if own.Addr() != srv.Addr() {
		t.Fatalf("the server of SQLLOCK_TEST_DSN has address %q, want %q", own.Addr(), srv.Addr())
	}
	proxy := pgtest.StartProxy(t, own.Addr(), 0)
	db := pgtest.Open(t, "pgx", proxy.DSN(own.DSN()))
	// pgx's health ping (db.Ping, and database/sql's reuse of a connection
	// idle for a second) is the pool's round trip, not counted; a query is.
	if err := db.Ping(); err != nil || proxy.RoundTrips() != 0 {
		t.Fatalf("through the proxy, Ping: %v, %d round trips counted, want 0", err, proxy.RoundTrips())
	}
	if _, err := db.Exec("SELECT 1"); err != nil || proxy.RoundTrips() != 1 {
		t.Fatalf("through the proxy, a query: %v, %d round trips counted, want 1", err, proxy.RoundTrips())
	}
}
