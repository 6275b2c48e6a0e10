package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// BenchmarkThroughput measures locks per second when N goroutines each
// take and release distinct free keys, one after another: through one
// default Locker (TryLock + Unlock), against the same statements written by
// hand (a pooled connection checked out per lock, pg_try_advisory_lock,
// pg_advisory_unlock, back to the pool), and against the ceiling, the same
// keys sent by hand in batches (one unnest statement tries up to 64 keys,
// one releases them, on up to 16 pinned connections at once: the server's
// cost per key with no library). Both pools allow 64 connections. The
// variants run in alternating phases, in a random order each round, in one
// process (internal/testkit's Throughput); reported: the median locks/s of
// each, "ratio" (sqllock ÷ raw) and "of-ceiling" (sqllock ÷ ceiling), and
// where the time went, per lock: the client's CPU, the server's (a local
// server's processes) and the client's allocations, and the longest one
// lock and release took ("-longest-ms"). Run it with
// -benchtime 1x (one measurement of every variant per sub-benchmark):
//
//	go test -run '^$' -bench BenchmarkThroughput -benchtime 1x .
//
// SQLLOCK_PHASE sets the length of a phase (default 300ms), SQLLOCK_ROUNDS
// the number of rounds (default 3). The bench command's -throughput draws
// the same measurement as a chart (docs/benchmarks.md).
func BenchmarkThroughput(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	phase := envDuration("SQLLOCK_PHASE", 300*time.Millisecond)
	rounds := envInt("SQLLOCK_ROUNDS", 3)
	serverCPU, err := testkit.ServerCPU(context.Background(), pgtest.Open(b, "pgx", dsn))
	if err != nil {
		b.Fatal(err)
	}
	for _, drv := range drivers {
		for _, n := range []int{1, 16, 128, 1024} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", drv, n), func(b *testing.B) {
				open := func() *sql.DB {
					db := pgtest.Open(b, drv, dsn)
					db.SetMaxOpenConns(64)
					db.SetMaxIdleConns(64)
					return db
				}
				res, err := testkit.Throughput(testkit.TryUnlockLoads(sqllock.New(open()), open(), open()), n, phase, rounds, serverCPU)
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
				b.ReportMetric(by["sqllock"].LocksPerSec/by["ceiling"].LocksPerSec, "of-ceiling")
			})
		}
	}
}

// envDuration returns the duration in the environment variable name, or
// def.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

// envInt returns the positive integer in the environment variable name, or
// def.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
