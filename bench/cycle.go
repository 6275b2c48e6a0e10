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
	"github.com/sqllock/sqllock/internal/testkit"
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

// errs keeps the first error of the variants of a comparison (a
// testkit.Variant returns none).
type errs struct{ first error }

func (e *errs) do(f func() error) func() {
	return func() {
		if err := f(); err != nil && e.first == nil {
			e.first = err
		}
	}
}

// pin returns a connection of db held for the whole comparison.
func pin(ctx context.Context, db *sql.DB) (*sql.Conn, error) { return db.Conn(ctx) }

// rawStatements are the baseline: pg_try_advisory_lock and
// pg_advisory_unlock with $1.
func rawStatements(ctx context.Context, conn *sql.Conn, key int64) error {
	var ok bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("raw lock: %v %v", ok, err)
	}
	if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("raw unlock: %v %v", ok, err)
	}
	return nil
}

// ourStatements are sqllock's own two statements (with the backend pid and
// pg_is_in_recovery() in the lock, and the pid check in the unlock), by hand:
// what the richer statements cost by themselves.
func ourStatements(ctx context.Context, conn *sql.Conn, key int64) error {
	var ok, standby bool
	var pid int64
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1), pg_backend_pid(), pg_is_in_recovery()", key).Scan(&ok, &pid, &standby); err != nil || !ok {
		return fmt.Errorf("lock: %v %v", ok, err)
	}
	var released sql.NullBool
	return conn.QueryRowContext(ctx, "SELECT CASE WHEN pg_backend_pid() = $2::int4 THEN pg_advisory_unlock($1) END, pg_backend_pid()", key, pid).Scan(&released, &pid)
}

// gooseCycle uses goose v3's session locker (its default lock id) on conn.
func gooseCycle(ctx context.Context, conn *sql.Conn) (func() error, error) {
	locker, err := gooselock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	return func() error {
		if err := locker.SessionLock(ctx, conn); err != nil {
			return err
		}
		return locker.SessionUnlock(ctx, conn)
	}, nil
}

// migrateCycle uses golang-migrate v4's postgres driver Lock and Unlock. The
// driver keeps a connection of its own for its life (and its Close closes
// the pool), so it runs on a pool of its own.
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
	testkit.Result
	external bool // another process (pgbench): wall time only
}

// cycleVariants returns every variant of the uncontended cycle, and a
// function that closes what they hold. Each pinned variant holds a
// connection of its own; each sqllock variant has a pool of its own.
func cycleVariants(e *env) ([]testkit.Variant, *errs, func(), error) {
	ctx := e.ctx
	cctx, cancel := context.WithCancel(ctx)
	var closers []func()
	closers = append(closers, cancel)
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) ([]testkit.Variant, *errs, func(), error) {
		closeAll()
		return nil, nil, nil, err
	}
	ers := &errs{}
	var vs []testkit.Variant
	add := func(name string, f func() error) { vs = append(vs, testkit.Variant{Name: name, Run: ers.do(f)}) }
	key := int64(benchKey)
	for _, d := range []struct{ name, driver string }{{"pq", "postgres"}, {"pgx", "pgx"}} {
		db := open(d.driver, e.dsn)
		closers = append(closers, func() { db.Close() })
		for _, c := range []struct {
			suffix string
			ctx    context.Context
		}{{"", ctx}, {", cancellable ctx", cctx}} {
			conn, err := pin(ctx, db)
			if err != nil {
				return fail(err)
			}
			closers = append(closers, func() { conn.Close() })
			rctx, k := c.ctx, key
			key++
			add("raw-"+d.name+c.suffix, func() error { return rawStatements(rctx, conn, k) })
			l := sqllock.New(open(d.driver, e.dsn))
			lk := sqllock.Int64(key)
			key++
			add("sqllock-"+d.name+c.suffix, func() error {
				h, err := l.TryLock(rctx, lk)
				if err != nil {
					return err
				}
				return h.Unlock(rctx)
			})
		}
		if d.name != "pgx" {
			continue
		}
		conn, err := pin(ctx, db)
		if err != nil {
			return fail(err)
		}
		closers = append(closers, func() { conn.Close() })
		k := key
		key++
		add("raw-pgx, sqllock's statements", func() error { return ourStatements(ctx, conn, k) })
		k2 := key
		key++
		add("raw-pgx, pool checkout per cycle", func() error {
			c, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			return rawStatements(ctx, c, k2)
		})
		gconn, err := pin(ctx, db)
		if err != nil {
			return fail(err)
		}
		closers = append(closers, func() { gconn.Close() })
		goose, err := gooseCycle(ctx, gconn)
		if err != nil {
			return fail(err)
		}
		add("goose-pgx", goose)
		atlasDB := open("pgx", e.dsn)
		atlasDB.SetMaxOpenConns(1)
		closers = append(closers, func() { atlasDB.Close() })
		atlas, err := atlasCycle(ctx, atlasDB)
		if err != nil {
			return fail(err)
		}
		add("atlas-pgx", atlas)
	}
	mig, closeMig, err := migrateCycle(e.dsn)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, closeMig)
	add("golang-migrate-pq", mig)
	return vs, ers, closeAll, nil
}

// measureCycles runs calls rounds of the uncontended cycle (every variant
// once per round, in a random order), and pgbench for pgbenchFor.
func measureCycles(e *env, calls int, pgbenchFor time.Duration) ([]cycleResult, error) {
	vs, ers, closeAll, err := cycleVariants(e)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	for _, v := range vs { // warm up: prepared statements, session settings
		v.Run()
	}
	rec := testkit.NewRecorder(vs...)
	for range calls {
		rec.Round()
	}
	res := rec.Results(200)
	if ers.first != nil {
		return nil, ers.first
	}
	var out []cycleResult
	for _, r := range res {
		out = append(out, cycleResult{Result: r})
	}
	for _, host := range []struct{ name, host string }{{"pgbench -M prepared, 127.0.0.1 (another process)", "127.0.0.1"}, {"pgbench -M prepared, unix socket (another process)", e.srv.SocketDir()}} {
		if host.host == "" {
			continue
		}
		tps, err := pgbench(e, host.host, pgbenchFor)
		if err != nil {
			return nil, err
		}
		out = append(out, cycleResult{Result: testkit.Result{Name: host.name, Wall: time.Duration(float64(time.Second) / tps)}, external: true})
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
