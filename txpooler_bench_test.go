package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// BenchmarkTxPoolerThroughput measures locks per second through PgBouncer
// in transaction mode (default_pool_size 16) when N goroutines each take
// and release distinct free keys, one after another: through one Locker
// WithTransactionPooler (TryLock + Unlock; pgx with its default statement
// cache), against the same work written by hand with transaction-level
// locks through the same bouncer (BEGIN, SELECT
// pg_try_advisory_xact_lock, COMMIT; pgx in its simple protocol, as a
// program behind PgBouncer 1.18 must). Both pools allow 64 connections.
// The variants run in alternating phases in one process
// (internal/testkit's Throughput); reported: the median locks/s of each,
// "ratio" (sqllock ÷ raw), and, per lock, the client's CPU, the server's
// (its processes; PgBouncer's not counted) and the client's allocations.
// Run it with -benchtime 1x:
//
//	go test -run '^$' -bench BenchmarkTxPoolerThroughput -benchtime 1x .
//
// SQLLOCK_PHASE and SQLLOCK_ROUNDS as for BenchmarkThroughput.
func BenchmarkTxPoolerThroughput(b *testing.B) {
	srv := pgtest.Start(b)
	if !srv.Local() {
		pgtest.Unavailable(b, "a local cluster (for PgBouncer)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	dsn := srv.NewDatabase(b)
	bdsn := pgtest.StartPgBouncer(b, srv, "transaction", 16).DSNFor(pgtest.DatabaseOf(dsn))
	phase := envDuration("SQLLOCK_PHASE", 300*time.Millisecond)
	rounds := envInt("SQLLOCK_ROUNDS", 3)
	serverCPU, err := testkit.ServerCPU(context.Background(), pgtest.Open(b, "pgx", dsn))
	if err != nil {
		b.Fatal(err)
	}
	for _, drv := range drivers {
		for _, n := range []int{1, 16, 128} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", drv, n), func(b *testing.B) {
				open := func(dsn string) *sql.DB {
					db := pgtest.Open(b, drv, dsn)
					db.SetMaxOpenConns(64)
					db.SetMaxIdleConns(64)
					return db
				}
				rawDSN := bdsn
				if drv == "pgx" {
					rawDSN += "&default_query_exec_mode=simple_protocol"
				}
				l := sqllock.New(open(bdsn), sqllock.WithTransactionPooler())
				defer l.Close(context.Background())
				raw := open(rawDSN)
				loads := []testkit.Load{
					{Name: "sqllock", Run: func(ctx context.Context, n int) (int64, error) {
						return testkit.PerGoroutine(ctx, n, 8_000_000, func(k int64) error {
							lk, err := l.TryLock(context.Background(), sqllock.Int64(k))
							if err != nil {
								return err
							}
							return lk.Unlock(context.Background())
						})
					}},
					{Name: "raw", Run: func(ctx context.Context, n int) (int64, error) {
						return testkit.PerGoroutine(ctx, n, 8_000_000, func(k int64) error { return rawXactTry(raw, k) })
					}},
				}
				res, err := testkit.Throughput(loads, n, phase, rounds, serverCPU)
				if err != nil {
					b.Fatal(err)
				}
				by := map[string]testkit.LoadResult{}
				for _, r := range res {
					by[r.Name] = r
					b.ReportMetric(r.LocksPerSec, r.Name+"-locks/s")
					b.ReportMetric(r.ClientUS, r.Name+"-client-µs/lock")
					b.ReportMetric(r.ServerUS, r.Name+"-server-µs/lock")
					b.ReportMetric(r.Allocs, r.Name+"-allocs/lock")
					if r.Longest > 0 {
						b.ReportMetric(float64(r.Longest)/1e6, r.Name+"-longest-ms")
					}
				}
				b.ReportMetric(by["sqllock"].LocksPerSec/by["raw"].LocksPerSec, "ratio")
			})
		}
	}
}

// rawXactTry is one lock by hand behind a transaction pooler: a
// transaction that tries a transaction-level lock on k and commits.
func rawXactTry(db *sql.DB, k int64) error {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	var ok bool
	if err := tx.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock($1)", k).Scan(&ok); err != nil || !ok {
		tx.Rollback()
		return fmt.Errorf("try %d: %v, %w", k, ok, err)
	}
	return tx.Commit()
}
