package sqllock_test

import (
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// TestWaitersServedInArrivalOrder: waiters on one key, each of its own
// Locker and pool (as separate processes are), are granted the lock in the
// order they started waiting, as PostgreSQL's queue grants plain
// pg_advisory_lock; and an election's candidates lead in the order they
// campaigned. Arrivals and the release come at random moments (a wait
// that left the queue and joined it again, as sliced waits did, would be
// served out of order).
func TestWaitersServedInArrivalOrder(t *testing.T) {
	t.Parallel()
	const waiters = 4
	rounds := 8
	if testkit.Short() {
		rounds = 3
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		lockers := make([]*sqllock.Locker, waiters)
		for i := range lockers {
			lockers[i] = sqllock.New(pgtest.Open(t, driverOf(db), dsn))
		}
		holder := sqllock.New(db)
		k := sqllock.Int64(9700)
		for _, how := range []string{"Lock", "Campaign"} {
			unfair := 0
			for r := range rounds {
				hl, err := holder.Lock(bg(), k)
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				var order []int
				var wg sync.WaitGroup
				for i, l := range lockers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var release func() error
						switch how {
						case "Lock":
							lk, err := l.Lock(bg(), k)
							if err != nil {
								t.Error(err)
								return
							}
							release = func() error { return lk.Unlock(bg()) }
						case "Campaign":
							ld, err := l.Election(k).Campaign(bg(), fmt.Sprintf("c%d", i))
							if err != nil {
								t.Error(err)
								return
							}
							release = func() error { return ld.Resign(bg()) }
						}
						mu.Lock()
						order = append(order, i)
						mu.Unlock()
						time.Sleep(5 * time.Millisecond)
						if err := release(); err != nil {
							t.Error(err)
						}
					}()
					testkit.WaitWaiters(t, db, k, i+1) // the next one starts waiting after this one
					time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
				}
				time.Sleep(time.Duration(rand.IntN(500)) * time.Millisecond)
				if err := hl.Unlock(bg()); err != nil {
					t.Fatal(err)
				}
				wg.Wait()
				if !slices.Equal(order, []int{0, 1, 2, 3}) {
					unfair++
					t.Logf("%s round %d: granted in order %v, want arrival order [0 1 2 3]", how, r, order)
				}
			}
			if unfair > 0 {
				t.Errorf("%s: %d of %d rounds out of arrival order", how, unfair, rounds)
			}
		}
	})
}
