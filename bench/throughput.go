package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// The throughput curve: locks per second against goroutines, each taking
// and releasing distinct free keys, for a default Locker, the same
// statements by hand and the hand-batched ceiling (internal/testkit's
// Throughput, the measurement BenchmarkThroughput reports), with where
// the time goes; and the client memory a held lock costs.

// throughputGoroutines are the curve's numbers of goroutines.
var throughputGoroutines = []int{1, 16, 128, 1024}

// throughputPoint is one driver and number of goroutines.
type throughputPoint struct {
	driver string
	n      int
	res    map[string]testkit.LoadResult // by load name
}

// runThroughput measures the curve on a server of its own, writes its
// chart to dir and its tables to w.
func runThroughput(dir string, phase time.Duration, rounds int, w io.Writer) error {
	ctx := context.Background()
	srv, err := pgtest.Embedded(ctx)
	if err != nil {
		return err
	}
	defer srv.Close()
	admin := open("pgx", srv.DSN())
	defer admin.Close()
	serverCPU, err := testkit.ServerCPU(ctx, admin)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s, %d cores, %s, %s; phases of %v, %d rounds\n\n", time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), serverVersion(&env{ctx: ctx, pgx: admin}), phase, rounds)
	// Memory first, while nothing else runs in the process.
	var memTable strings.Builder
	fmt.Fprintln(&memTable, "| driver | client heap bytes per held lock, 5,000 held (their shared sessions included) |")
	fmt.Fprintln(&memTable, "|---|---|")
	for i, drv := range []string{"pgx", "postgres"} {
		per, err := heldMemory(open(drv, srv.DSN()), int32(80+i), 5000)
		if err != nil {
			return err
		}
		fmt.Fprintf(&memTable, "| %s | %.0f |\n", drv, per)
	}
	var points []throughputPoint
	for _, drv := range []string{"pgx", "postgres"} {
		for _, n := range throughputGoroutines {
			pool := func() *sql.DB {
				db := open(drv, srv.DSN())
				db.SetMaxOpenConns(64)
				db.SetMaxIdleConns(64)
				return db
			}
			l, raw, ceiling := pool(), pool(), pool()
			res, err := testkit.Throughput(testkit.TryUnlockLoads(sqllock.New(l), raw, ceiling), n, phase, rounds, serverCPU)
			l.Close()
			raw.Close()
			ceiling.Close()
			if err != nil {
				return err
			}
			p := throughputPoint{driver: drv, n: n, res: map[string]testkit.LoadResult{}}
			for _, r := range res {
				p.res[r.Name] = r
			}
			points = append(points, p)
		}
	}
	fmt.Fprintln(w, "| driver | goroutines | sqllock locks/s | raw | ceiling | sqllock ÷ raw | of ceiling | client µs/lock (sqllock / raw) | server µs/lock (sqllock / raw) | allocs/lock (sqllock / raw) |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	names := make([]string, len(points))
	ss := []series{{label: "sqllock"}, {label: "raw"}, {label: "ceiling"}}
	for i, p := range points {
		s, r, c := p.res["sqllock"], p.res["raw"], p.res["ceiling"]
		fmt.Fprintf(w, "| %s | %d | %.0f | %.0f | %.0f | %.2f | %.2f | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f |\n",
			p.driver, p.n, s.LocksPerSec, r.LocksPerSec, c.LocksPerSec, s.LocksPerSec/r.LocksPerSec, s.LocksPerSec/c.LocksPerSec,
			s.ClientUS, r.ClientUS, s.ServerUS, r.ServerUS, s.Allocs, r.Allocs)
		names[i] = fmt.Sprintf("%s %d", p.driver, p.n)
		ss[0].values = append(ss[0].values, s.LocksPerSec)
		ss[1].values = append(ss[1].values, r.LocksPerSec)
		ss[2].values = append(ss[2].values, c.LocksPerSec)
	}
	fmt.Fprintln(w)
	fmt.Fprint(w, memTable.String())
	return barChart(dir, "throughput.png", "Distinct free keys: locks/s against goroutines", "log10 locks/s (4 = 10k, 5 = 100k)", names, ss, true)
}

// heldMemory takes n locks on distinct free keys (class, i) through a
// default Locker on db and returns the client's heap bytes per held lock
// (live heap after a collection, from a steady heap before the first), the
// shared sessions that carry them included.
func heldMemory(db *sql.DB, class int32, n int) (per float64, err error) {
	defer func() {
		// The shared sessions go back to the pool a second after their
		// last lock; then the pool closes them, and the next measurement
		// starts from a heap without them.
		time.Sleep(3 * time.Second)
		db.Close()
	}()
	l := sqllock.New(db)
	warm, err := l.TryLock(context.Background(), sqllock.Pair(class, -1)) // the server check: not per lock
	if err != nil {
		return 0, err
	}
	defer warm.Unlock(context.Background())
	var locks []*sqllock.Lock
	defer func() {
		for _, lk := range locks {
			if uerr := lk.Unlock(context.Background()); uerr != nil && err == nil {
				err = uerr
			}
		}
	}()
	heap := func() float64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return float64(ms.HeapAlloc)
	}
	// The Locker measured before this one (its keep-alive stops, its
	// sessions go back to their pool) is gone by then.
	time.Sleep(6 * time.Second)
	h0 := heap()
	for range 50 {
		time.Sleep(100 * time.Millisecond)
		h := heap()
		if math.Abs(h-h0) < 0.002*h0 {
			break
		}
		h0 = h
	}
	for i := range n {
		lk, err := l.TryLock(context.Background(), sqllock.Pair(class, int32(i)))
		if err != nil {
			return 0, err
		}
		locks = append(locks, lk)
	}
	return (heap() - h0) / float64(n), nil
}
