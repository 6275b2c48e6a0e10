package main

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/poolguard"
)

// scaleResult is one row of the distinct-keys table.
type scaleResult struct {
	goroutines int
	sqllock    float64 // cycles/s
	raw        float64 // cycles/s, raw statements with a pool checkout per cycle
}

// measureScale runs N goroutines, each locking its own key in a loop,
// through a pool of 10 connections, for d per variant and N.
func measureScale(e *env, d time.Duration) ([]scaleResult, error) {
	db := open("pgx", e.dsn)
	defer db.Close()
	db.SetMaxOpenConns(10)
	db.SetMaxIdleConns(10)
	l := sqllock.New(db)
	var out []scaleResult
	for _, n := range []int{1, 2, 8, 32} {
		r := scaleResult{goroutines: n}
		var err error
		if r.sqllock, err = loop(n, d, func(i int) error {
			lk, err := l.TryLock(e.ctx, sqllock.Pair(60, int32(i)))
			if err != nil {
				return err
			}
			return lk.Unlock(e.ctx)
		}); err != nil {
			return nil, err
		}
		if r.raw, err = loop(n, d, func(i int) error {
			conn, err := db.Conn(e.ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			var ok bool
			if err := conn.QueryRowContext(e.ctx, "SELECT pg_try_advisory_lock(61, $1)", i).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("raw: %v %v", ok, err)
			}
			return conn.QueryRowContext(e.ctx, "SELECT pg_advisory_unlock(61, $1)", i).Scan(&ok)
		}); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// loop runs op in n goroutines for d and returns the total operations/s.
func loop(n int, d time.Duration, op func(i int) error) (float64, error) {
	var count atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := op(i); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				count.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return 0, err
	}
	return float64(count.Load()) / d.Seconds(), nil
}

// sessionResult is the many-locks-on-one-Session row.
type sessionResult struct {
	locks           int
	acquire         time.Duration // TryLock of all keys
	roundTrips      int64
	bytesPerLock    float64
	keepAliveChecks int64 // during one second at a 100 ms interval
}

// measureSession takes 5,000 locks on one Session.
func measureSession(e *env) (sessionResult, error) {
	const n = 5000
	counting := &testkit.CountingConnector{}
	probe := open("pgx", e.dsn)
	defer probe.Close()
	inner, err := probe.Driver().(driver.DriverContext).OpenConnector(e.dsn)
	if err != nil {
		return sessionResult{}, err
	}
	counting.Connector = inner
	db := sql.OpenDB(counting)
	defer db.Close()
	l := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
	s, err := l.Session(e.ctx)
	if err != nil {
		return sessionResult{}, err
	}
	keys := make([]sqllock.Key, n)
	for i := range keys {
		keys[i] = sqllock.Pair(70, int32(i))
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	trips := counting.Count()
	t := time.Now()
	got, err := s.TryLock(e.ctx, keys...)
	r := sessionResult{locks: len(got), acquire: time.Since(t), roundTrips: counting.Count() - trips}
	if err != nil {
		return r, err
	}
	keys = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	r.bytesPerLock = float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
	st := l.Stats()
	time.Sleep(time.Second)
	r.keepAliveChecks = l.Stats().KeepAliveChecks - st.KeepAliveChecks
	runtime.KeepAlive(got)
	return r, s.Close(e.ctx)
}

// guardResult is one row of the poolguard table.
type guardResult struct {
	name           string
	plain, guarded time.Duration
}

// measureGuard compares a plain and a guarded pool of each driver, one
// connection each, call by call (see testkit.Recorder).
func measureGuard(e *env, calls int) ([]guardResult, error) {
	var out []guardResult
	for _, drv := range []string{"postgres", "pgx"} {
		plain := open(drv, e.dsn)
		guarded, err := poolguard.Open(drv, e.dsn)
		if err != nil {
			return nil, err
		}
		for _, db := range []*sql.DB{plain, guarded} {
			db.SetMaxOpenConns(1)
		}
		ers := &errs{}
		clean := func(db *sql.DB) func() {
			return ers.do(func() error { var x int; return db.QueryRowContext(e.ctx, "SELECT $1::int", 7).Scan(&x) })
		}
		dirty := func(db *sql.DB, key int) func() {
			return ers.do(func() error {
				var a, b bool
				return db.QueryRowContext(e.ctx, "SELECT pg_try_advisory_lock($1), pg_advisory_unlock($1)", key).Scan(&a, &b)
			})
		}
		rec := testkit.NewRecorder(testkit.Variant{Name: "plain", Run: clean(plain)}, testkit.Variant{Name: "guarded", Run: clean(guarded)},
			testkit.Variant{Name: "plain-dirty", Run: dirty(plain, 8)}, testkit.Variant{Name: "guarded-dirty", Run: dirty(guarded, 9)})
		for range calls {
			rec.Round()
		}
		res := rec.Results(0)
		plain.Close()
		guarded.Close()
		if ers.first != nil {
			return nil, ers.first
		}
		name := map[string]string{"postgres": "lib/pq", "pgx": "pgx"}[drv]
		out = append(out,
			guardResult{name + ": SELECT $1::int (clean)", res[0].Wall, res[1].Wall},
			guardResult{name + ": lock+unlock in one statement (dirty return)", res[2].Wall, res[3].Wall})
	}
	return out, nil
}

// hotResult is the hot-key comparison of one driver.
type hotResult struct {
	driver string
	res    []testkit.HotResult // by hand, sqllock
}

// measureHotKey runs 50 goroutines over a pool of 10 connections that
// contend for one key, with the statements by hand and with sqllock (see
// testkit.HotKey), for each driver.
func measureHotKey(e *env, rounds int) ([]hotResult, error) {
	var out []hotResult
	for _, drv := range []string{"postgres", "pgx"} {
		pool := func() *sql.DB {
			db := open(drv, e.dsn)
			db.SetMaxOpenConns(10)
			db.SetMaxIdleConns(10)
			return db
		}
		hand, lib := pool(), pool()
		cpu, err := testkit.ServerCPU(e.ctx, hand)
		if err != nil {
			cpu = nil // a server in a container: no server CPU figure
		}
		res, err := testkit.HotKey(e.ctx, []testkit.HotVariant{testkit.HandLock(hand, benchKey+20), testkit.LockerLock(sqllock.New(lib), benchKey+21)}, 50, 500*time.Millisecond, rounds, cpu)
		hand.Close()
		lib.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, hotResult{driver: map[string]string{"postgres": "lib/pq", "pgx": "pgx"}[drv], res: res})
	}
	return out, nil
}

// open opens a pool; sql.Open fails only for an unknown driver name.
func open(driverName, dsn string) *sql.DB {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		panic(err)
	}
	return db
}
