package sqllock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// BenchmarkTryLockUnlock compares one uncontended TryLock + Unlock cycle
// with the same two statements written by hand on one pinned *sql.Conn,
// each with context.Background() and with a cancellable context (real
// callers pass one; database/sql and some drivers watch it, at a cost),
// interleaved call by call in one run (see internal/testkit). It reports
// each variant's median wall time, mean process CPU and allocations per
// cycle, the throughput ratios sqllock ÷ raw ("ratio": both with
// Background, "ratio-ctx": both cancellable) and the client CPU sqllock
// adds per cycle ("cpu-added-ns", Background; "cpu-added-ctx-ns"). sqllock
// is a default Locker (locks on a shared session); "dedicated" a Locker
// made WithDedicatedSessions (a pool checkout and a session per lock), with
// its ratio to raw ("ratio-dedicated").
func BenchmarkTryLockUnlock(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	for _, drv := range drivers {
		b.Run(drv, func(b *testing.B) { compareCycles(b, func() *sql.DB { return pgtest.Open(b, drv, dsn) }) })
	}
}

// BenchmarkTryLockUnlockRTT is BenchmarkTryLockUnlock through a proxy that
// adds 250 µs each way: a round trip of 0.5 ms, as in a data centre.
func BenchmarkTryLockUnlockRTT(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	for _, drv := range drivers {
		b.Run(drv, func(b *testing.B) {
			proxy := pgtest.StartProxy(b, srv.Addr(), 250*time.Microsecond)
			compareCycles(b, func() *sql.DB { return pgtest.Open(b, drv, proxy.DSN(dsn)) })
		})
	}
}

// compareCycles runs the interleaved cycle comparison on pools from open:
// one for raw and the default Locker, one for the dedicated Locker (a pool
// of its own, so that the shared session the other pins does not change
// its pool's behaviour).
func compareCycles(b *testing.B, open func() *sql.DB) {
	db := open()
	bg := context.Background()
	cctx, cancel := context.WithCancel(bg)
	defer cancel()
	conn, err := db.Conn(bg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	l := sqllock.New(db)
	dl := sqllock.New(open(), sqllock.WithDedicatedSessions())
	raw := func(ctx context.Context, key int64) func() {
		return func() {
			var ok bool
			if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	}
	lib := func(ctx context.Context, l *sqllock.Locker, key int64) func() {
		k := sqllock.Int64(key)
		return func() {
			lk, err := l.TryLock(ctx, k)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	floor := floorCycle(b, db)
	res := testkit.Compare(b, []testkit.Variant{
		{Name: "raw", Run: raw(bg, 4241)},
		{Name: "raw-ctx", Run: raw(cctx, 4242)},
		{Name: "sqllock", Run: lib(bg, l, 4243)},
		{Name: "sqllock-ctx", Run: lib(cctx, l, 4244)},
		{Name: "dedicated", Run: lib(bg, dl, 4245)},
		{Name: "floor", Run: floor(bg, 4246)},
		{Name: "floor-ctx", Run: floor(cctx, 4247)},
	}, testkit.Ratio{Name: "ratio", Of: "sqllock", Over: "raw"}, testkit.Ratio{Name: "ratio-ctx", Of: "sqllock-ctx", Over: "raw-ctx"},
		testkit.Ratio{Name: "ratio-dedicated", Of: "dedicated", Over: "raw"},
		testkit.Ratio{Name: "ratio-floor", Of: "floor", Over: "raw"}, testkit.Ratio{Name: "ratio-floor-ctx", Of: "floor-ctx", Over: "raw"})
	b.ReportMetric(float64(res[2].CPU-res[0].CPU), "cpu-added-ns")
	b.ReportMetric(float64(res[3].CPU-res[1].CPU), "cpu-added-ctx-ns")
}

// floorCycle returns the floor of a shared session's TryLock + Unlock:
// the two statements a default Locker sends on a session set up already
// (its owner mark compared in the try, its pid in the unlock), on a
// pinned connection of db's set up by hand, each sent straight to the
// driver's connection as the Locker sends them, under ctx, with no
// library code around them. (For lib/pq these are the statements with
// the key in their text; a Locker's busy shared session prepares them
// after a few, and sends EXECUTE instead.) "ratio-floor" (a context that cannot end) and
// "ratio-floor-ctx" (one that can, as the Locker bounds its statements)
// are what a Locker would reach with no client cost of its own.
func floorCycle(b *testing.B, db *sql.DB) func(ctx context.Context, key int64) func() {
	bg := context.Background()
	conn, err := db.Conn(bg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	const mark = "bench-floor"
	var pid int64
	if err := conn.QueryRowContext(bg, "SELECT pg_backend_pid() FROM (SELECT set_config('sqllock.owner', '"+mark+"', false)) AS s").Scan(&pid); err != nil {
		b.Fatal(err)
	}
	st := sqltext.Plain(sqltext.DetectMode(db.Driver()))
	vals := make([]driver.Value, 1)
	one := func(ctx context.Context, q string, nv []driver.NamedValue) {
		err := conn.Raw(func(dc any) error {
			rows, err := dc.(driver.QueryerContext).QueryContext(ctx, q, nv)
			if err != nil {
				return err
			}
			defer rows.Close()
			if err := rows.Next(vals); err != nil {
				return err
			}
			if vals[0] != true {
				return fmt.Errorf("%s answered %v", q, vals[0])
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	named := func(args []any) []driver.NamedValue {
		nv := make([]driver.NamedValue, len(args))
		for i, a := range args {
			nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
		}
		return nv
	}
	return func(ctx context.Context, key int64) func() {
		k := sqltext.Key{V: key}
		tq, targs := st.TrySQL(sqltext.Try, k, mark)
		uq, uargs := st.UnlockSQL(false, k, pid)
		tnv, unv := named(targs), named(uargs)
		return func() {
			one(ctx, tq, tnv)
			one(ctx, uq, unv)
		}
	}
}

// BenchmarkHotKey runs 64 goroutines that contend for one key (Lock, no
// work, Unlock), with one Locker and with the raw statements by hand (a
// pooled connection each, pg_advisory_lock, pg_advisory_unlock), over
// pools of 64 connections, in alternating phases of 500 ms (one round of
// phases per b.N: -benchtime 8x). It reports each contender's handoffs per
// second (median over phases), their ratio (sqllock ÷ by hand), the
// longest wait and the server CPU per handoff.
func BenchmarkHotKey(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	for _, drv := range drivers {
		b.Run(drv, func(b *testing.B) {
			pool := func() *sql.DB {
				db := pgtest.Open(b, drv, dsn)
				db.SetMaxOpenConns(64)
				db.SetMaxIdleConns(64)
				return db
			}
			hand, lib := pool(), pool()
			var cpu func() (time.Duration, error)
			if srv.Local() {
				var err error
				if cpu, err = testkit.ServerCPU(context.Background(), hand); err != nil {
					b.Fatal(err)
				}
			}
			vs := []testkit.HotVariant{testkit.HandLock(hand, 4250), testkit.LockerLock(sqllock.New(lib), 4251)}
			res, err := testkit.HotKey(context.Background(), vs, 64, 500*time.Millisecond, b.N, cpu)
			if err != nil {
				b.Fatal(err)
			}
			for i, r := range res {
				name := []string{"hand", "sqllock"}[i]
				b.ReportMetric(r.PerSec, name+"-handoffs/s")
				b.ReportMetric(float64(r.MaxWait.Milliseconds()), name+"-max-wait-ms")
				b.ReportMetric(float64(r.ServerCPU.Nanoseconds())/1e3, name+"-server-cpu-µs/handoff")
			}
			b.ReportMetric(res[1].PerSec/res[0].PerSec, "ratio")
		})
	}
}
