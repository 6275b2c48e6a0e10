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

// A batch runs n cycles of one variant and returns each cycle's duration.
// Whatever a variant pins (a connection) it takes before the batch and
// gives back after it, untimed, so that every variant of a driver runs on
// the one connection of a single-connection pool: the same backend, the same
// caches. (On these machines two connections of one server can differ by a
// fifth in speed; comparing variants on different backends measures that.)
type batch func(n int) (sample, error)

type namedBatch struct {
	name string
	run  batch
}

// timeEach runs cycle n times and returns the durations.
func timeEach(n int, cycle func() error) (sample, error) {
	s := make(sample, 0, n)
	for i := 0; i < n; i++ {
		t := time.Now()
		if err := cycle(); err != nil {
			return nil, err
		}
		s = append(s, time.Since(t))
	}
	return s, nil
}

// pinned runs cycle(conn) on one connection pinned for the batch.
func pinned(ctx context.Context, db *sql.DB, cycle func(conn *sql.Conn) error) batch {
	return func(n int) (sample, error) {
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return timeEach(n, func() error { return cycle(conn) })
	}
}

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

// checkout runs the raw statements with a connection checked out of the
// pool and returned every cycle, as a lock of one's own needs.
func checkout(ctx context.Context, db *sql.DB) batch {
	return func(n int) (sample, error) {
		return timeEach(n, func() error {
			conn, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			return rawStatements(ctx, conn, benchKey+3)
		})
	}
}

func sqllockBatch(ctx context.Context, db *sql.DB) batch {
	l := sqllock.New(db)
	k := sqllock.Int64(benchKey)
	return func(n int) (sample, error) {
		return timeEach(n, func() error {
			lk, err := l.TryLock(ctx, k)
			if err != nil {
				return err
			}
			return lk.Unlock(ctx)
		})
	}
}

// gooseBatch uses goose v3's session locker (its default lock id) on a
// connection pinned for the batch.
func gooseBatch(ctx context.Context, db *sql.DB) (batch, error) {
	locker, err := gooselock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	return pinned(ctx, db, func(conn *sql.Conn) error {
		if err := locker.SessionLock(ctx, conn); err != nil {
			return err
		}
		return locker.SessionUnlock(ctx, conn)
	}), nil
}

// migrateBatch uses golang-migrate v4's postgres driver Lock and Unlock. The
// driver keeps a connection of its own for its life (and its Close closes
// the pool), so it runs on a pool of its own: another backend.
func migrateBatch(dsn string) (batch, func(), error) {
	drv, err := migratepg.WithInstance(open("postgres", dsn), &migratepg.Config{})
	if err != nil {
		return nil, nil, err
	}
	return func(n int) (sample, error) {
		return timeEach(n, func() error {
			if err := drv.Lock(); err != nil {
				return err
			}
			return drv.Unlock()
		})
	}, func() { drv.Close() }, nil
}

// atlasBatch uses atlas's postgres driver Lock (try, then back off).
func atlasBatch(ctx context.Context, db *sql.DB) (batch, error) {
	drv, err := postgres.Open(db)
	if err != nil {
		return nil, err
	}
	locker, ok := drv.(schema.Locker)
	if !ok {
		return nil, errors.New("atlas driver is not a schema.Locker")
	}
	return func(n int) (sample, error) {
		return timeEach(n, func() error {
			unlock, err := locker.Lock(ctx, "bench", 0)
			if err != nil {
				return err
			}
			return unlock()
		})
	}, nil
}

// cycleResult is one row of the uncontended-cycle table.
type cycleResult struct {
	name   string
	median time.Duration
	rounds sample // each round's median
}

// cycleBatches returns every variant of the uncontended cycle, each driver's
// on a single-connection pool of its own, and a function that closes them.
func cycleBatches(e *env) ([]namedBatch, func(), error) {
	pq1, pgx1 := open("postgres", e.dsn), open("pgx", e.dsn)
	closers := []func(){func() { pq1.Close() }, func() { pgx1.Close() }}
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	var bs []namedBatch
	for _, d := range []struct {
		name string
		db   *sql.DB
	}{{"pq", pq1}, {"pgx", pgx1}} {
		d.db.SetMaxOpenConns(1)
		bs = append(bs,
			namedBatch{"raw-" + d.name, pinned(e.ctx, d.db, func(c *sql.Conn) error { return rawStatements(e.ctx, c, benchKey+1) })},
			namedBatch{"sqllock-" + d.name, sqllockBatch(e.ctx, d.db)})
	}
	bs = append(bs,
		namedBatch{"raw-pgx, pool checkout per cycle", checkout(e.ctx, pgx1)},
		namedBatch{"raw-pgx, sqllock's statements, pinned", pinned(e.ctx, pgx1, func(c *sql.Conn) error { return ourStatements(e.ctx, c, benchKey+4) })})
	goose, err := gooseBatch(e.ctx, pgx1)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	mig, closeMig, err := migrateBatch(e.dsn)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closers = append(closers, closeMig)
	atlas, err := atlasBatch(e.ctx, pgx1)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	bs = append(bs, namedBatch{"goose-pgx", goose}, namedBatch{"golang-migrate-pq (own connection)", mig}, namedBatch{"atlas-pgx", atlas})
	return bs, closeAll, nil
}

func measureCycles(e *env, rounds, n int, pgbenchFor time.Duration) ([]cycleResult, error) {
	bs, closeAll, err := cycleBatches(e)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	// Each round runs a batch of every variant, in an order that rotates
	// from round to round; the result is the median over rounds of each
	// batch's median, so that a slow stretch of the machine weighs one
	// round, not one variant.
	perRound := map[string]sample{}
	for r := 0; r < rounds; r++ {
		for j := range bs {
			b := bs[(r+j)%len(bs)]
			s, err := b.run(n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", b.name, err)
			}
			perRound[b.name] = append(perRound[b.name], s.median())
		}
	}
	var out []cycleResult
	for _, b := range bs {
		out = append(out, cycleResult{name: b.name, median: perRound[b.name].median(), rounds: perRound[b.name]})
	}
	for _, host := range []struct{ name, host string }{{"pgbench -M prepared, 127.0.0.1", "127.0.0.1"}, {"pgbench -M prepared, unix socket", e.srv.SocketDir()}} {
		if host.host == "" {
			continue
		}
		tps, err := pgbench(e, host.host, pgbenchFor)
		if err != nil {
			return nil, err
		}
		out = append(out, cycleResult{name: host.name, median: time.Duration(float64(time.Second) / tps)})
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
