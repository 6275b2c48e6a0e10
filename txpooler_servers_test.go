package sqllock_test

// A Locker WithTransactionPooler holds many locks on few of the pooler's
// server connections, and the pooler's other clients go on (see
// txpooler_invariants_test.go for the set-up).

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// selectOneLatencies runs SELECT 1 from each of clients, one after
// another, until ctx ends, and returns every latency.
func selectOneLatencies(ctx context.Context, clients []*sql.DB) ([]time.Duration, error) {
	var mu sync.Mutex
	var all []time.Duration
	var first error
	var wg sync.WaitGroup
	for _, db := range clients {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				began := time.Now()
				var one int
				if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						first = err
						mu.Unlock()
					}
					break
				}
				mine = append(mine, time.Since(began))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all, first
}

// quantile returns the q-quantile of sorted d.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(q*float64(len(d))))]
}

// TestTxPoolerFewServerConnections: behind a bouncer with
// default_pool_size 10, two Lockers WithTransactionPooler hold 100 locks
// at once (50 each, Lock and TryLock of distinct keys) on at most 4 of
// its server connections (the distinct backends holding them in
// pg_locks), while 20 other clients of the same bouncer run SELECT 1 one
// after another: their p99 latency is at most 50 ms, or, on a machine
// whose own latency without the locks is higher, at most twice that.
// Phases with and without the locks alternate (2 s each, twice); the
// p50 and p99 of each are reported.
func TestTxPoolerFewServerConnections(t *testing.T) {
	long(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			p := behindTxPooler(t, 10)
			var clients []*sql.DB
			for range 20 {
				db := pgtest.Open(t, "pgx", p.bdsn+"&default_query_exec_mode=simple_protocol")
				db.SetMaxOpenConns(1)
				clients = append(clients, db)
			}
			lockers := []*sqllock.Locker{p.locker(t, drv), p.locker(t, drv)}
			phase := func(hold bool) []time.Duration {
				t.Helper()
				var held []*sqllock.Lock
				if hold {
					for li, l := range lockers {
						for i := range 50 {
							k := sqllock.Int64(int64(8000 + 100*li + i))
							var lk *sqllock.Lock
							var err error
							if i%2 == 0 {
								lk, err = l.Lock(bg(), k)
							} else {
								lk, err = l.TryLock(bg(), k)
							}
							if err != nil {
								t.Fatalf("lock %d of 100: %v", len(held)+1, err)
							}
							held = append(held, lk)
						}
					}
					pids := map[int]bool{}
					n := 0
					for _, h := range p.strays(t) {
						if h.Key != trafficKey {
							pids[h.PID] = true
							n++
						}
					}
					t.Logf("%d locks held by %d server connections", n, len(pids))
					if n != 100 || len(pids) > 4 {
						t.Fatalf("%d locks held on %d server connections, want 100 on at most 4", n, len(pids))
					}
				}
				ctx, cancel := context.WithTimeout(bg(), 2*time.Second)
				lat, err := selectOneLatencies(ctx, clients)
				cancel()
				if err != nil {
					t.Fatalf("SELECT 1: %v", err)
				}
				for _, lk := range held {
					if err := lk.Err(); err != nil {
						t.Fatalf("a held lock: %v", err)
					}
					if err := lk.Unlock(bg()); err != nil {
						t.Fatalf("Unlock() = %v", err)
					}
				}
				return lat
			}
			var without, with []time.Duration
			for range 2 {
				without = append(without, phase(false)...)
				with = append(with, phase(true)...)
			}
			slices.Sort(without)
			slices.Sort(with)
			p50, p99 := quantile(with, 0.5), quantile(with, 0.99)
			b50, b99 := quantile(without, 0.5), quantile(without, 0.99)
			t.Logf("SELECT 1 of 20 clients of the bouncer: with 100 locks held, p50 %v, p99 %v (%d statements); without, p50 %v, p99 %v (%d)",
				p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), len(with), b50.Round(10*time.Microsecond), b99.Round(10*time.Microsecond), len(without))
			if limit := max(50*time.Millisecond, 2*b99); p99 > limit {
				t.Errorf("p99 of SELECT 1 with the locks held: %v, want at most %v", p99, limit)
			}
			p.waitNoStrays(t, 5*time.Second)
		})
	}
}

// TestTxPoolerPoolPinned: a Locker WithTransactionPooler whose own
// sessions pin every server connection of the bouncer (4 RLocks, each on
// a session of its own, with a pool of 4) reports no lock lost. Its
// keep-alive's statement, on another client connection, would wait in
// the bouncer's queue for a server connection, and two checks without an
// answer would make every lock lost: the keep-alive runs on one of the
// Locker's own pinned sessions instead.
func TestTxPoolerPoolPinned(t *testing.T) {
	long(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			p := behindTxPooler(t, 4)
			var ev txEvents
			l := p.locker(t, drv, sqllock.WithKeepAlive(200*time.Millisecond), sqllock.WithObserver(&ev))
			var held []*sqllock.Lock
			for i := range 4 {
				lk, err := l.RLock(bg(), sqllock.Int64(int64(8300+i)))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, lk)
			}
			pids := map[int]bool{}
			for _, lk := range held {
				pids[lk.PID()] = true
			}
			time.Sleep(5 * time.Second)
			lost := 0
			for _, lk := range held {
				if lk.Err() != nil {
					lost++
				}
			}
			t.Logf("4 RLocks on %d server connections of 4, 5 s: %d reported lost; %v", len(pids), lost, &ev)
			if lost > 0 {
				t.Errorf("%d of 4 locks reported lost with no fault", lost)
			}
		})
	}
}
