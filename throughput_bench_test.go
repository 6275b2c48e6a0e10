package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
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
// process; the medians are reported: locks/s of each, "ratio" (sqllock ÷
// raw) and "of-ceiling" (sqllock ÷ ceiling). Run it with -benchtime 1x
// (one measurement of every variant per sub-benchmark):
//
//	go test -run '^$' -bench BenchmarkThroughput -benchtime 1x .
//
// SQLLOCK_PHASE sets the length of a phase (default 300ms), SQLLOCK_ROUNDS
// the number of rounds (default 3).
func BenchmarkThroughput(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	phase := envDuration("SQLLOCK_PHASE", 300*time.Millisecond)
	rounds := envInt("SQLLOCK_ROUNDS", 3)
	for _, drv := range drivers {
		for _, n := range []int{1, 16, 128, 1024} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", drv, n), func(b *testing.B) {
				open := func() *sql.DB {
					db := pgtest.Open(b, drv, dsn)
					db.SetMaxOpenConns(64)
					db.SetMaxIdleConns(64)
					return db
				}
				l := sqllock.New(open())
				raw := open()
				ceiling := open()
				variants := []struct {
					name string
					run  func(ctx context.Context, n int) int64
				}{
					{"sqllock", func(ctx context.Context, n int) int64 {
						return perGoroutine(ctx, n, func(k int64) error {
							lk, err := l.TryLock(context.Background(), sqllock.Int64(k))
							if err != nil {
								return err
							}
							return lk.Unlock(context.Background())
						})
					}},
					{"raw", func(ctx context.Context, n int) int64 {
						return perGoroutine(ctx, n, func(k int64) error { return rawTryUnlock(raw, k) })
					}},
					{"ceiling", func(ctx context.Context, n int) int64 { return batched(ctx, b, ceiling, n) }},
				}
				rates := map[string][]float64{}
				for range rounds {
					for _, i := range rand.Perm(len(variants)) {
						v := variants[i]
						ctx, cancel := context.WithTimeout(context.Background(), phase)
						start := time.Now()
						got := v.run(ctx, n)
						cancel()
						rates[v.name] = append(rates[v.name], float64(got)/time.Since(start).Seconds())
					}
				}
				med := map[string]float64{}
				for name, r := range rates {
					slices.Sort(r)
					med[name] = r[len(r)/2]
					b.ReportMetric(med[name], name+"-locks/s")
				}
				b.ReportMetric(med["sqllock"]/med["raw"], "ratio")
				b.ReportMetric(med["sqllock"]/med["ceiling"], "of-ceiling")
			})
		}
	}
}

// perGoroutine runs n goroutines, each taking and releasing keys of its
// own with one until ctx ends, and returns how many locks they took.
func perGoroutine(ctx context.Context, n int, one func(k int64) error) int64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			base := int64(8_000_000 + g*1000)
			for i := int64(0); ctx.Err() == nil; i++ {
				if err := one(base + i%1000); err == nil {
					total.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return total.Load()
}

// rawTryUnlock is one lock by hand: a pooled connection, the try, the
// unlock, back to the pool.
func rawTryUnlock(db *sql.DB, k int64) error {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var ok bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", k).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("try: %v, %w", ok, err)
	}
	return conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", k).Scan(&ok)
}

// batched is the ceiling for n goroutines: their keys, n at a time, sent
// in statements of up to 64 keys (a try statement, then an unlock
// statement), on up to 16 pinned connections at once, until ctx ends. It
// returns the number of locks taken.
func batched(ctx context.Context, tb testing.TB, db *sql.DB, n int) int64 {
	batch := min(n, 64)
	conns := min(16, (n+batch-1)/batch)
	var total atomic.Int64
	var wg sync.WaitGroup
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := db.Conn(context.Background())
			if err != nil {
				tb.Error(err)
				return
			}
			defer conn.Close()
			var lit strings.Builder
			lit.WriteByte('{')
			for i := range batch {
				if i > 0 {
					lit.WriteByte(',')
				}
				lit.WriteString(strconv.Itoa(9_000_000 + c*1000 + i))
			}
			lit.WriteByte('}')
			keys := lit.String()
			for ctx.Err() == nil {
				var got int64
				if err := conn.QueryRowContext(context.Background(),
					"SELECT count(*) FILTER (WHERE pg_try_advisory_lock(k)) FROM unnest($1::text::int8[]) AS u(k)", keys).Scan(&got); err != nil {
					tb.Error(err)
					return
				}
				var freed int64
				if err := conn.QueryRowContext(context.Background(),
					"SELECT count(*) FILTER (WHERE pg_advisory_unlock(k)) FROM unnest($1::text::int8[]) AS u(k)", keys).Scan(&freed); err != nil {
					tb.Error(err)
					return
				}
				total.Add(freed)
			}
		}()
	}
	wg.Wait()
	return total.Load()
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
