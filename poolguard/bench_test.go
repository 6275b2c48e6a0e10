package poolguard_test

import (
	"database/sql"
	"slices"
	"testing"
	"time"

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
			var p, q []time.Duration
			i := 0
			run := func(db *sql.DB) time.Duration {
				t := time.Now()
				if err := op(db, i); err != nil {
					b.Fatal(err)
				}
				return time.Since(t)
			}
			for b.Loop() {
				// Alternate which goes first, so neither always follows the other.
				i++
				if i%2 == 0 {
					p = append(p, run(plain))
					q = append(q, run(guarded))
				} else {
					q = append(q, run(guarded))
					p = append(p, run(plain))
				}
			}
			mp, mq := median(p), median(q)
			b.ReportMetric(float64(mp.Nanoseconds()), "plain-ns/op")
			b.ReportMetric(float64(mq.Nanoseconds()), "guarded-ns/op")
			b.ReportMetric(float64(mp)/float64(mq), "ratio")
			b.ReportMetric(float64(g.Stats().Checks)/float64(i), "checks/op")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
