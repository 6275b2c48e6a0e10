package sqllock_test

import (
	"context"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestRoundTrips counts, through a proxy that reads the protocol, the
// messages each operation sends that wait for the server's answer (Sync,
// simple Query): a regression in the number of round trips fails here.
func TestRoundTrips(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			proxy := pgtest.StartProxy(t, srv.Addr(), 0)
			db := pgtest.Open(t, drv, proxy.DSN(dsn))
			l := sqllock.New(db, sqllock.WithKeepAlive(0))
			perOp := func(name string, want float64, op func() error) {
				t.Helper()
				for range 3 { // warm up: prepared statements, session settings
					if err := op(); err != nil {
						t.Fatal(err)
					}
				}
				const n = 50
				before := proxy.RoundTrips()
				for range n {
					if err := op(); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
				}
				got := float64(proxy.RoundTrips()-before) / n
				t.Logf("%s: %.2f round trips", name, got)
				if got != want {
					t.Errorf("%s: %.2f round trips per operation, want %v", name, got, want)
				}
			}
			k := sqllock.Int64(31)
			perOp("TryLock + Unlock", 2, func() error {
				lk, err := l.TryLock(bg(), k)
				if err != nil {
					return err
				}
				return lk.Unlock(bg())
			})
			perOp("Lock + Unlock (free)", 2, func() error {
				lk, err := l.Lock(bg(), k)
				if err != nil {
					return err
				}
				return lk.Unlock(bg())
			})
			perOp("RLock + Unlock", 2, func() error {
				lk, err := l.RLock(bg(), k)
				if err != nil {
					return err
				}
				return lk.Unlock(bg())
			})
			perOp("TryDo", 2, func() error {
				_, err := l.TryDo(bg(), k, func(context.Context) error { return nil })
				return err
			})
			keys := make([]sqllock.Key, 100)
			for i := range keys {
				keys[i] = sqllock.Pair(32, int32(i))
			}
			s, err := l.Session(bg())
			if err != nil {
				t.Fatal(err)
			}
			perOp("Session TryLockMany(100) + UnlockMany(100)", 2, func() error {
				got, err := s.TryLockMany(bg(), keys...)
				if err != nil {
					return err
				}
				return s.UnlockMany(bg(), got...)
			})
			s.Close(bg())

			// The keep-alive: one round trip per interval for all locks.
			kl := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
			var held []*sqllock.Lock
			for i := range 20 {
				lk, err := kl.Lock(bg(), sqllock.Pair(33, int32(i)))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, lk)
			}
			time.Sleep(250 * time.Millisecond)
			before, checks := proxy.RoundTrips(), kl.Stats().KeepAliveChecks
			time.Sleep(time.Second)
			trips, ran := proxy.RoundTrips()-before, kl.Stats().KeepAliveChecks-checks
			t.Logf("keep-alive: %d round trips, %d checks in 1 s for 20 locks", trips, ran)
			if ran < 5 || trips != ran {
				t.Errorf("keep-alive: %d round trips for %d checks; want one per check", trips, ran)
			}
			for _, lk := range held {
				lk.Unlock(bg())
			}
		})
	}
}
