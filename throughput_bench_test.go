package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
// raw) and "of-ceiling" (sqllock ÷ ceiling), and where the time went: the
// client's CPU per lock (this process), the server's (its processes, read
// from /proc: a local server) and the client's allocations per
// lock, each summed over the variant's phases. Run it with -benchtime 1x
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
				admin := pgtest.Open(b, "pgx", srv.AdminDSN())
				rates := map[string][]float64{}
				var cost = map[string]*phaseCost{}
				for range rounds {
					for _, i := range rand.Perm(len(variants)) {
						v := variants[i]
						ctx, cancel := context.WithTimeout(context.Background(), phase)
						before := measureCost(b, admin)
						start := time.Now()
						got := v.run(ctx, n)
						cancel()
						rates[v.name] = append(rates[v.name], float64(got)/time.Since(start).Seconds())
						if cost[v.name] == nil {
							cost[v.name] = &phaseCost{}
						}
						cost[v.name].add(before, measureCost(b, admin), got)
					}
				}
				med := map[string]float64{}
				for name, r := range rates {
					slices.Sort(r)
					med[name] = r[len(r)/2]
					b.ReportMetric(med[name], name+"-locks/s")
					c := cost[name]
					b.ReportMetric(c.client/float64(c.locks)/1e3, name+"-client-µs/lock")
					b.ReportMetric(c.server/float64(c.locks)/1e3, name+"-server-µs/lock")
					b.ReportMetric(c.allocs/float64(c.locks), name+"-allocs/lock")
				}
				b.ReportMetric(med["sqllock"]/med["raw"], "ratio")
				b.ReportMetric(med["sqllock"]/med["ceiling"], "of-ceiling")
			})
		}
	}
}

// phaseCost sums what the phases of one variant cost: client CPU (this
// process, user + system), server CPU (the server's backends), and the
// client's allocations, in ns and counts, over locks locks.
type phaseCost struct {
	client, server, allocs float64
	locks                  int64
}

// costAt is a reading of the counters phaseCost sums.
type costAt struct {
	client, server time.Duration
	allocs         uint64
}

func (c *phaseCost) add(before, after costAt, locks int64) {
	c.client += float64(after.client - before.client)
	c.server += float64(after.server - before.server)
	c.allocs += float64(after.allocs - before.allocs)
	c.locks += locks
}

// measureCost reads this process's CPU time and allocations, and the
// server's: its postmaster's children, live (their /proc entries) and
// ended (the postmaster's cutime and cstime), so a backend that ends
// within a phase still counts. The server must be local.
func measureCost(tb testing.TB, admin *sql.DB) costAt {
	var at costAt
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		at.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	at.allocs = ms.Mallocs
	var dir string
	if err := admin.QueryRow("SHOW data_directory").Scan(&dir); err != nil {
		tb.Fatal(err)
	}
	pidFile, err := os.ReadFile(dir + "/postmaster.pid")
	if err != nil {
		tb.Fatal(err)
	}
	pm, _ := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	if f := procStat(pm); len(f) > 14 {
		at.server += ticks(f[11]) + ticks(f[12]) + ticks(f[13]) + ticks(f[14])
	}
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) > 12 && f[1] == strconv.Itoa(pm) {
			at.server += ticks(f[11]) + ticks(f[12])
		}
	}
	return at
}

// procStat returns the fields of /proc/PID/stat after the command (which
// may hold spaces, in parentheses): state, ppid, ...; nil when it cannot
// be read.
func procStat(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// ticks converts a time of /proc/PID/stat.
func ticks(f string) time.Duration {
	n, _ := strconv.ParseInt(f, 10, 64)
	return time.Duration(n) * time.Second / clockTicks
}

// clockTicks is the unit of /proc/PID/stat's times (USER_HZ, 100 on Linux).
const clockTicks = 100

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
