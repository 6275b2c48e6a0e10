package sqllock_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// BenchmarkTryLockUnlock measures one uncontended try-lock + unlock cycle.
// raw-* runs the same two statements by hand on one pinned *sql.Conn (the
// baseline); sqllock-* is Locker.TryLock + Lock.Unlock, which also checks a
// connection out of the pool and back each cycle. Compare each sqllock-*
// with its raw-* from the same run (-count 7, then benchstat or medians).
func BenchmarkTryLockUnlock(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	for _, drv := range drivers {
		db := pgtest.Open(b, drv, dsn)
		name := map[string]string{"postgres": "pq", "pgx": "pgx"}[drv]
		b.Run("raw-"+name, func(b *testing.B) { benchRaw(b, db) })
		b.Run("sqllock-"+name, func(b *testing.B) { benchSqllock(b, db) })
	}
}

func benchRaw(b *testing.B, db *sql.DB) {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	var ok bool
	for b.Loop() {
		if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", int64(4242)).Scan(&ok); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", int64(4242)).Scan(&ok); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

func benchSqllock(b *testing.B, db *sql.DB) {
	ctx := context.Background()
	l := sqllock.New(db)
	k := sqllock.Int64(4242)
	for b.Loop() {
		lk, err := l.TryLock(ctx, k)
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTryLockUnlockRatio interleaves a raw cycle and a sqllock cycle in
// every iteration, so both see the same machine, and reports the median of
// each and their throughput ratio (sqllock ops/s ÷ raw ops/s; above 1 is
// faster than the raw statements).
func BenchmarkTryLockUnlockRatio(b *testing.B) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	for _, drv := range drivers {
		b.Run(drv, func(b *testing.B) {
			db := pgtest.Open(b, drv, dsn)
			ctx := context.Background()
			conn, err := db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			l := sqllock.New(db)
			rawKey, k := int64(4243), sqllock.Int64(4244)
			var ok bool
			rawCycle := func() {
				if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", rawKey).Scan(&ok); err != nil || !ok {
					b.Fatal(ok, err)
				}
				if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", rawKey).Scan(&ok); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
			libCycle := func() {
				lk, err := l.TryLock(ctx, k)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			testkit.Interleaved(b, "raw", rawCycle, "sqllock", libCycle)
		})
	}
}
