package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// BenchmarkOperations compares each operation with the same statements
// written by hand, interleaved call by call (see testkit.Compare), on each
// driver: median wall time, mean client CPU and allocations of both, and
// "ratio" (sqllock's throughput ÷ by hand's). The hand-written side runs
// on a connection pinned for the run; sqllock checks one out of its pool
// where the operation does. Run pinned to one CPU:
//
//	taskset -c 0 go test -run '^$' -bench BenchmarkOperations -benchtime 1000x .
func BenchmarkOperations(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	compareOperations(b, func(drv string) *sql.DB { return pgtest.Open(b, drv, dsn) })
}

// BenchmarkOperationsRTT is BenchmarkOperations through a proxy that adds
// 250 µs each way (a data centre's round trip of 0.5 ms).
func BenchmarkOperationsRTT(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	compareOperations(b, func(drv string) *sql.DB {
		return pgtest.Open(b, drv, pgtest.StartProxy(b, srv.Addr(), 250*time.Microsecond).DSN(dsn))
	})
}

// compareOperations runs every operation of each driver on open(driver).
func compareOperations(b *testing.B, open func(drv string) *sql.DB) {
	for _, drv := range drivers {
		db := open(drv)
		for _, op := range operations(drv) {
			b.Run(drv+"/"+op.name, func(b *testing.B) {
				hand, lib, done := op.setup(b, db)
				defer done()
				testkit.Compare(b, []testkit.Variant{{Name: "hand", Run: hand}, {Name: "sqllock", Run: lib}},
					testkit.Ratio{Name: "ratio", Of: "sqllock", Over: "hand"})
			})
		}
	}
}

// operation is one row of BenchmarkOperations: setup returns the
// hand-written and the sqllock variant, and what releases them.
type operation struct {
	name  string
	setup func(b *testing.B, db *sql.DB) (hand, lib func(), done func())
}

func operations(drv string) []operation {
	ctx := context.Background()
	pinned := func(b *testing.B, db *sql.DB) *sql.Conn {
		c, err := db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	check := func(b *testing.B, err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	// array binds a key list as lib/pq and pgx each take it.
	array := func(keys []int64) any {
		if drv == "postgres" {
			return pq.Array(keys)
		}
		return keys
	}
	ops := []operation{
		{"RLock+Unlock", func(b *testing.B, db *sql.DB) (func(), func(), func()) {
			c, l := pinned(b, db), sqllock.New(db)
			var ok bool
			return func() {
					check(b, c.QueryRowContext(ctx, "SELECT pg_try_advisory_lock_shared($1)", int64(5101)).Scan(&ok))
					check(b, c.QueryRowContext(ctx, "SELECT pg_advisory_unlock_shared($1)", int64(5101)).Scan(&ok))
				}, func() {
					lk, err := l.RLock(ctx, sqllock.Int64(5102))
					check(b, err)
					check(b, lk.Unlock(ctx))
				}, func() { c.Close() }
		}},
		{"Lock+Unlock", func(b *testing.B, db *sql.DB) (func(), func(), func()) {
			c, l := pinned(b, db), sqllock.New(db)
			var ok bool
			return func() {
					_, err := c.ExecContext(ctx, "SELECT pg_advisory_lock($1)", int64(5103))
					check(b, err)
					check(b, c.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", int64(5103)).Scan(&ok))
				}, func() {
					lk, err := l.Lock(ctx, sqllock.Int64(5104))
					check(b, err)
					check(b, lk.Unlock(ctx))
				}, func() { c.Close() }
		}},
		{"InTx", func(b *testing.B, db *sql.DB) (func(), func(), func()) {
			l := sqllock.New(db)
			return func() {
					tx, err := db.BeginTx(ctx, nil)
					check(b, err)
					_, err = tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(5105))
					check(b, err)
					check(b, tx.Commit())
				}, func() {
					check(b, l.InTx(ctx, sqllock.Int64(5106), nil, func(*sql.Tx) error { return nil }))
				}, func() {}
		}},
		{"LockTx", func(b *testing.B, db *sql.DB) (func(), func(), func()) {
			t1, err := db.BeginTx(ctx, nil)
			check(b, err)
			t2, err := db.BeginTx(ctx, nil)
			check(b, err)
			return func() {
					_, err := t1.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", int64(5107))
					check(b, err)
				}, func() {
					check(b, sqllock.LockTx(ctx, t2, sqllock.Int64(5108)))
				}, func() { t1.Rollback(); t2.Rollback() }
		}},
		{"Inspect", func(b *testing.B, db *sql.DB) (func(), func(), func()) {
			c := pinned(b, db)
			return func() {
					rows, err := c.QueryContext(ctx, "SELECT classid, objid, objsubid, pid, mode, granted FROM pg_locks WHERE locktype = 'advisory'")
					check(b, err)
					for rows.Next() {
					}
					check(b, rows.Close())
				}, func() {
					_, err := sqllock.Inspect(ctx, db, nil)
					check(b, err)
				}, func() { c.Close() }
		}},
	}
	for _, n := range []int{1, 100, 5000} {
		ops = append(ops, operation{fmt.Sprintf("TryLock+Unlock/%d", n), func(b *testing.B, db *sql.DB) (func(), func(), func()) {
			c, l := pinned(b, db), sqllock.New(db, sqllock.WithKeepAlive(0))
			s, err := l.Session(ctx)
			check(b, err)
			raw, keys := make([]int64, n), make([]sqllock.Key, n)
			for i := range n {
				raw[i], keys[i] = int64(60000+i), sqllock.Int64(int64(70000+i))
			}
			return func() {
					var got int
					check(b, c.QueryRowContext(ctx, "SELECT count(*) FILTER (WHERE pg_try_advisory_lock(k)) FROM unnest($1::int8[]) AS k", array(raw)).Scan(&got))
					check(b, c.QueryRowContext(ctx, "SELECT count(*) FILTER (WHERE pg_advisory_unlock(k)) FROM unnest($1::int8[]) AS k", array(raw)).Scan(&got))
					if got != n {
						b.Fatalf("unlocked %d of %d", got, n)
					}
				}, func() {
					got, err := s.TryLock(ctx, keys...)
					check(b, err)
					if len(got) != n {
						b.Fatalf("took %d of %d", len(got), n)
					}
					check(b, s.Unlock(ctx, got...))
				}, func() { c.Close(); s.Close(ctx) }
		}})
	}
	return ops
}
