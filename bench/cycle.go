package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"ariga.io/atlas/sql/postgres"
	"ariga.io/atlas/sql/schema"
	migratepg "github.com/golang-migrate/migrate/v4/database/postgres"
	gooselock "github.com/pressly/goose/v3/lock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// env is what the measurements share: one server, a pool per driver.
type env struct {
	ctx context.Context
	srv *pgtest.Server
	dsn string
	pq  *sql.DB
	pgx *sql.DB
}

const benchKey = 4242

// rawCycle is the baseline: pg_try_advisory_lock and pg_advisory_unlock,
// with $1, on one pinned connection.
func rawCycle(ctx context.Context, db *sql.DB) (func() error, func(), error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func() error {
		var ok bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", int64(benchKey)).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("raw lock: %v %v", ok, err)
		}
		if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", int64(benchKey)).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("raw unlock: %v %v", ok, err)
		}
		return nil
	}, func() { conn.Close() }, nil
}

// checkoutCycle is the raw statements with a connection checked out of the
// pool and returned each cycle, as a lock of one's own needs.
func checkoutCycle(ctx context.Context, db *sql.DB) func() error {
	return func() error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		var ok bool
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", int64(benchKey+3)).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("raw lock: %v %v", ok, err)
		}
		return conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", int64(benchKey+3)).Scan(&ok)
	}
}

// oursCycle runs sqllock's own two statements (with the backend pid and
// pg_is_in_recovery() in the lock, and the pid check in the unlock) by hand
// on one pinned connection: what the richer statements cost by themselves.
func oursCycle(ctx context.Context, db *sql.DB) (func() error, func(), error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func() error {
		var ok, standby bool
		var pid int64
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1), pg_backend_pid(), pg_is_in_recovery()", int64(benchKey+4)).Scan(&ok, &pid, &standby); err != nil || !ok {
			return fmt.Errorf("lock: %v %v", ok, err)
		}
		var released sql.NullBool
		return conn.QueryRowContext(ctx, "SELECT CASE WHEN pg_backend_pid() = $2::int4 THEN pg_advisory_unlock($1) END, pg_backend_pid()", int64(benchKey+4), pid).Scan(&released, &pid)
	}, func() { conn.Close() }, nil
}

func sqllockCycle(ctx context.Context, db *sql.DB) func() error {
	l := sqllock.New(db)
	k := sqllock.Int64(benchKey)
	return func() error {
		lk, err := l.TryLock(ctx, k)
		if err != nil {
			return err
		}
		return lk.Unlock(ctx)
	}
}

// gooseCycle uses goose v3's session locker (its default lock id) on one
// pinned connection.
func gooseCycle(ctx context.Context, db *sql.DB) (func() error, func(), error) {
	locker, err := gooselock.NewPostgresSessionLocker()
	if err != nil {
		return nil, nil, err
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	return func() error {
		if err := locker.SessionLock(ctx, conn); err != nil {
			return err
		}
		return locker.SessionUnlock(ctx, conn)
	}, func() { conn.Close() }, nil
}

// migrateCycle uses golang-migrate v4's postgres driver Lock and Unlock,
// on a pool of its own (the driver's Close closes the pool).
func migrateCycle(dsn string) (func() error, func(), error) {
	drv, err := migratepg.WithInstance(open("postgres", dsn), &migratepg.Config{})
	if err != nil {
		return nil, nil, err
	}
	return func() error {
		if err := drv.Lock(); err != nil {
			return err
		}
		return drv.Unlock()
	}, func() { drv.Close() }, nil
}

// atlasCycle uses atlas's postgres driver Lock (try, then back off).
func atlasCycle(ctx context.Context, db *sql.DB) (func() error, error) {
	drv, err := postgres.Open(db)
	if err != nil {
		return nil, err
	}
	locker, ok := drv.(schema.Locker)
	if !ok {
		return nil, errors.New("atlas driver is not a schema.Locker")
	}
	return func() error {
		unlock, err := locker.Lock(ctx, "bench", 0)
		if err != nil {
			return err
		}
		return unlock()
	}, nil
}

// cycleResult is one row of the uncontended-cycle table.
type cycleResult struct {
	name   string
	median time.Duration
	note   string
}

// cycleOps returns one uncontended cycle of every Go variant, and a
// function that closes what they opened.
func cycleOps(e *env) ([]namedOp, func(), error) {
	var ops []namedOp
	var closers []func()
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	for _, d := range []struct {
		name string
		db   *sql.DB
	}{{"pq", e.pq}, {"pgx", e.pgx}} {
		raw, closeRaw, err := rawCycle(e.ctx, d.db)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		closers = append(closers, closeRaw)
		ops = append(ops, namedOp{"raw-" + d.name, raw}, namedOp{"sqllock-" + d.name, sqllockCycle(e.ctx, d.db)})
	}
	ops = append(ops, namedOp{"raw-pgx, pool checkout per cycle", checkoutCycle(e.ctx, e.pgx)})
	ours, closeOurs, err := oursCycle(e.ctx, e.pgx)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, closeOurs)
	ops = append(ops, namedOp{"raw-pgx, sqllock's statements, pinned", ours})
	goose, closeGoose, err := gooseCycle(e.ctx, e.pgx)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, closeGoose)
	mig, closeMig, err := migrateCycle(e.dsn)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, closeMig)
	atlas, err := atlasCycle(e.ctx, e.pgx)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	ops = append(ops, namedOp{"goose-pgx", goose}, namedOp{"golang-migrate-pq", mig}, namedOp{"atlas-pgx", atlas})
	return ops, closeAll, nil
}

func measureCycles(e *env, rounds, n int, pgbenchFor time.Duration) ([]cycleResult, error) {
	ops, closeAll, err := cycleOps(e)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	samples, err := interleave(rounds, n, ops)
	if err != nil {
		return nil, err
	}
	var out []cycleResult
	for _, op := range ops {
		out = append(out, cycleResult{name: op.name, median: samples[op.name].median()})
	}
	for _, host := range []struct{ name, host string }{{"pgbench -M prepared, 127.0.0.1", "127.0.0.1"}, {"pgbench -M prepared, unix socket", e.srv.SocketDir()}} {
		if host.host == "" {
			continue
		}
		tps, err := pgbench(e, host.host, pgbenchFor)
		if err != nil {
			return nil, err
		}
		out = append(out, cycleResult{name: host.name, median: time.Duration(float64(time.Second) / tps), note: "ceiling (C client, one connection)"})
	}
	return out, nil
}

// pgbench runs the same two statements with pgbench for d and returns
// its transactions per second.
func pgbench(e *env, host string, d time.Duration) (float64, error) {
	dir := e.srv.BinDir()
	if dir == "" {
		return 0, errors.New("pgbench needs a local server")
	}
	script := filepath.Join(os.TempDir(), "sqllock-bench.sql")
	if err := os.WriteFile(script, []byte(fmt.Sprintf("SELECT pg_try_advisory_lock(%d);\nSELECT pg_advisory_unlock(%d);\n", benchKey+1, benchKey+1)), 0o644); err != nil {
		return 0, err
	}
	cmd := exec.Command(filepath.Join(dir, "pgbench"), "-n", "-M", "prepared", "-f", script, "-T", strconv.Itoa(max(1, int(d.Seconds()))), "-c", "1",
		"-h", host, "-p", strconv.Itoa(e.srv.Port), "-U", pgtest.Role, pgtest.DatabaseOf(e.dsn))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench: no tps in %q", strings.TrimSpace(string(out)))
	}
	return strconv.ParseFloat(string(m[1]), 64)
}
