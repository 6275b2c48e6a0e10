package sqllock_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// TestWaitOrder: waiters are served in the order they arrived, every
// round, the guide's promise under "First come, first served": four waiters, each a Locker on a pool of its own (as four
// processes), arrive one after another (each once the one before is seen
// waiting), a slice apart (half deadlock_timeout, the length of a wait
// statement), or at random moments 50 to 250 ms apart; the holder releases
// at a random moment up to a second after the last arrival, and each
// waiter, once granted, holds the key 10 ms. Every round must grant every
// waiter once, one at a time, in arrival order. A Session's waits (one
// statement each) keep their places in the server's own queue.
func TestWaitOrder(t *testing.T) {
	long(t) // seconds of waiting per round
	t.Parallel()
	srv := pgtest.Start(t)
	rounds := 8
	if testkit.Short() {
		rounds = 3
	}
	for _, mode := range []string{"one after another", "a slice apart", "random arrivals", "sessions, one after another"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, "pgx", dsn)
			const n = 4
			waiters := make([]*sqllock.Locker, n)
			for i := range waiters {
				waiters[i] = sqllock.New(pgtest.Open(t, "pgx", dsn))
			}
			holder := sqllock.New(db)
			k := sqllock.Hash("wait-order:" + mode)
			sessions := strings.HasPrefix(mode, "sessions")
			r := rand.New(rand.NewPCG(uint64(len(mode)), 7))
			inOrder, firstFirst, inversions := 0, 0, 0
			for round := range rounds {
				hl, err := holder.Lock(bg(), k)
				if err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				var arrived []int // waiter indexes in the order they called Lock
				var served []int  // in the order they were granted
				var holding atomic.Int32
				var wg sync.WaitGroup
				start := func(i int) {
					mu.Lock()
					arrived = append(arrived, i)
					mu.Unlock()
					wg.Add(1)
					go func() {
						defer wg.Done()
						unlock, err := lockAs(waiters[i], k, sessions)
						if err != nil {
							t.Errorf("waiter %d: %v", i, err)
							return
						}
						if holding.Add(1) != 1 {
							t.Errorf("waiter %d granted while another holds the key", i)
						}
						mu.Lock()
						served = append(served, i)
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
						holding.Add(-1)
						if err := unlock(); err != nil {
							t.Errorf("waiter %d: Unlock: %v", i, err)
						}
					}()
				}
				order := r.Perm(n)
				switch mode {
				case "one after another", "sessions, one after another":
					for j, i := range order {
						start(i)
						testkit.WaitWaiters(t, db, k, j+1)
					}
				case "a slice apart":
					// Half the server's deadlock_timeout (1 s): each starts
					// as the one before begins its second statement.
					for j, i := range order {
						start(i)
						testkit.WaitWaiters(t, db, k, j+1)
						time.Sleep(500 * time.Millisecond)
					}
				default:
					// Arrival is the server's: calls a few milliseconds
					// apart may reach it in either order.
					at := make([]time.Duration, n)
					for j := 1; j < n; j++ {
						at[j] = at[j-1] + time.Duration(50+r.IntN(201))*time.Millisecond
					}
					began := time.Now()
					for j, i := range order {
						time.Sleep(time.Until(began.Add(at[j])))
						start(i)
					}
					testkit.WaitWaiters(t, db, k, n)
				}
				time.Sleep(time.Duration(r.IntN(1000)) * time.Millisecond)
				if err := hl.Unlock(bg()); err != nil {
					t.Fatal(err)
				}
				waitGroup(t, &wg, hangCeiling)
				if t.Failed() {
					t.FailNow()
				}
				if len(served) != n {
					t.Fatalf("round %d: served %v, want each of %d waiters once", round, served, n)
				}
				inv := 0
				pos := make([]int, n)
				for p, i := range arrived {
					pos[i] = p
				}
				for a := range served {
					for b := a + 1; b < n; b++ {
						if pos[served[a]] > pos[served[b]] {
							inv++
						}
					}
				}
				if inv == 0 {
					inOrder++
				}
				if served[0] == arrived[0] {
					firstFirst++
				}
				inversions += inv
				t.Logf("round %d: arrived %v, served %v (%d pairs out of order)", round, arrived, served, inv)
				if inv != 0 {
					t.Errorf("round %d: arrived %v, served %v (%d pairs out of order)", round, arrived, served, inv)
				}
				if !slices.Contains(served, arrived[0]) {
					t.Fatalf("round %d: the first arrival was never served", round)
				}
			}
			t.Logf("%s: %d of %d rounds served in arrival order; the first arrival served first in %d; %s pairs out of order per round (of %d)",
				mode, inOrder, rounds, firstFirst, fmt.Sprintf("%.1f", float64(inversions)/float64(rounds)), n*(n-1)/2)
		})
	}
}

// lockAs takes k with l, in a Session of its own when sessions is set,
// and returns the function that releases it.
func lockAs(l *sqllock.Locker, k sqllock.Key, sessions bool) (func() error, error) {
	if !sessions {
		lk, err := l.Lock(bg(), k)
		if err != nil {
			return nil, err
		}
		return func() error { return lk.Unlock(bg()) }, nil
	}
	s, err := l.Session(bg())
	if err != nil {
		return nil, err
	}
	if err := s.Lock(bg(), k); err != nil {
		s.Close(bg())
		return nil, err
	}
	return func() error { return s.Close(bg()) }, nil
}
