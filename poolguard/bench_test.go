package poolguard_test

import (
	"database/sql"
	"testing"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/poolguard"
)

// BenchmarkGuardOverhead runs `SELECT $1::int` through a plain pool and a
// guarded pool of the same driver, interleaved in every iteration, and
// reports the median of each and the throughput ratio guarded ÷ plain.
func BenchmarkGuardOverhead(b *testing.B) {
	benchPair(b, func(db *sql.DB, i int) error {
		var n int
		return db.QueryRow("SELECT $1::int", i).Scan(&n)
	})
}

// BenchmarkGuardDirtyReturn measures the cost of a dirty return: each
// iteration takes and releases an advisory lock in one statement, so the
// guarded pool checks the connection every time it comes back (one extra
// round trip).
func BenchmarkGuardDirtyReturn(b *testing.B) {
	benchPair(b, func(db *sql.DB, i int) error {
		var a, u bool
		return db.QueryRow("SELECT pg_try_advisory_lock(7), pg_advisory_unlock(7)").Scan(&a, &u)
	})
}

func benchPair(b *testing.B, op func(db *sql.DB, i int) error) {
	srv := pgtest.Start(b)
	dsn := srv.NewDatabase(b)
	for _, drv := range drivers {
		b.Run(drv, func(b *testing.B) {
			plain := pgtest.Open(b, drv, dsn)
			g := poolguard.Wrap(connector(b, drv, dsn))
			guarded := sql.OpenDB(g)
			defer guarded.Close()
			for _, db := range []*sql.DB{plain, guarded} {
				db.SetMaxOpenConns(1)
				db.SetMaxIdleConns(1)
			}
			i := 0
			run := func(db *sql.DB) func() {
				return func() {
					if err := op(db, i); err != nil {
						b.Fatal(err)
					}
					i++
				}
			}
			n := testkit.Interleaved(b, "plain", run(plain), "guarded", run(guarded))
			b.ReportMetric(float64(g.Stats().Checks)/float64(n), "checks/op")
		})
	}
}
