package sqllock_test

import (
	"context"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// section is one critical section: when it ran, on which key or
// semaphore, and whether its lock was confirmed held throughout (its call
// returned no error).
type section struct {
	on         string
	start, end time.Time
	confirmed  bool
}

// TestChaos runs critical sections (Do and TryDo with random deadlines
// and cancellations, hold windows, a 2-slot semaphore) from many
// goroutines while a holder's backend is terminated every 100–400 ms and
// the server restarts once. No two confirmed sections of a key overlap,
// never more than 2 confirmed permits overlap, and nothing stays held.
// The run lasts at least run, and longer (up to a minute) on a loaded
// machine until enough sections were confirmed on each side of the
// restart: the claim is about chaos that happened, not about a duration.
func TestChaos(t *testing.T) {
	long(t)
	run := 8 * time.Second // the restart, in the middle, takes seconds on a small machine
	if os.Getenv("SQLLOCK_CHAOS") != "" {
		if d, err := time.ParseDuration(os.Getenv("SQLLOCK_CHAOS")); err == nil {
			run = d
		}
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			srv := pgtest.Private(t) // restarted below: a server of its own
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, drv, dsn)
			l := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond), sqllock.WithOrphanBound(4*time.Second))
			windowed := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
			sem := l.Semaphore("chaos", 2)
			keys := []sqllock.Key{sqllock.Int64(1), sqllock.Int64(2), sqllock.Pair(3, 4)}

			var mu sync.Mutex
			var sections []section
			record := func(s section) {
				mu.Lock()
				sections = append(sections, s)
				mu.Unlock()
			}
			stop := make(chan struct{})
			var calls, failed, confirmedBefore, confirmedAfter atomic.Int64
			var restartedAt atomic.Int64 // unix nanoseconds once the server is back
			var wg sync.WaitGroup
			for w := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for {
						select {
						case <-stop:
							return
						default:
						}
						calls.Add(1)
						ctx, cancel := context.WithTimeout(bg(), time.Duration(1+rng.IntN(200))*time.Millisecond)
						if rng.IntN(10) == 0 {
							time.AfterFunc(time.Duration(rng.IntN(20))*time.Millisecond, cancel)
						}
						k := keys[rng.IntN(len(keys))]
						var s section
						body := func(fctx context.Context) error {
							s.start = time.Now()
							select {
							case <-time.After(time.Duration(rng.IntN(5)) * time.Millisecond):
							case <-fctx.Done():
							}
							s.end = time.Now()
							return fctx.Err()
						}
						var err error
						switch rng.IntN(4) {
						case 0:
							s.on = k.String()
							err = l.Do(ctx, k, body)
						case 1:
							s.on = k.String()
							var ran bool
							ran, err = l.TryDo(ctx, k, body)
							if !ran && err == nil {
								err = sqllock.ErrNotAcquired
							}
						case 2:
							s.on = k.String()
							err = windowed.Do(ctx, k, body, sqllock.WithHoldAtLeast(30*time.Millisecond))
						case 3:
							s.on = "semaphore"
							var p *sqllock.Lock
							if p, err = sem.Acquire(ctx); err == nil {
								err = body(ctx)
								if uerr := p.Unlock(bg()); err == nil {
									err = uerr
								}
							}
						}
						cancel()
						if !s.start.IsZero() {
							s.confirmed = err == nil
							record(s)
							if s.confirmed {
								if at := restartedAt.Load(); at != 0 && s.start.UnixNano() > at {
									confirmedAfter.Add(1)
								} else {
									confirmedBefore.Add(1)
								}
							}
						}
						if err != nil {
							failed.Add(1)
						}
					}
				}()
			}
			// Terminations of holders, and one restart.
			admin := pgtest.Open(t, "pgx", srv.AdminDSNFor(pgtest.DatabaseOf(dsn)))
			var terminated atomic.Int64
			chaosDone := make(chan struct{})
			go func() {
				defer close(chaosDone)
				rng := rand.New(rand.NewPCG(99, 1))
				restartAt := time.Now().Add(run / 2)
				restarted := false
				for {
					select {
					case <-stop:
						return
					case <-time.After(time.Duration(100+rng.IntN(300)) * time.Millisecond):
					}
					if !restarted && time.Now().After(restartAt) {
						restarted = true
						ctx, cancel := context.WithTimeout(bg(), time.Minute)
						if err := srv.Restart(ctx); err != nil {
							t.Errorf("restart: %v", err)
						}
						cancel()
						restartedAt.Store(time.Now().UnixNano())
						continue
					}
					var n int64
					admin.QueryRow(`SELECT count(pg_terminate_backend(pid)) FROM (SELECT DISTINCT pid FROM pg_locks
						WHERE locktype = 'advisory' AND granted ORDER BY pid LIMIT 1) h`).Scan(&n)
					terminated.Add(n)
				}
			}()
			began := time.Now()
			time.Sleep(run)
			const enough = 50 // confirmed sections on each side of the restart
			for time.Since(began) < time.Minute &&
				(restartedAt.Load() == 0 || confirmedBefore.Load() < enough || confirmedAfter.Load() < enough || terminated.Load() < 3) {
				time.Sleep(100 * time.Millisecond)
			}
			ran := time.Since(began)
			close(stop)
			waitGroup(t, &wg, hangCeiling)
			<-chaosDone

			confirmed := 0
			byKey := map[string][]section{}
			for _, s := range sections {
				if s.confirmed {
					confirmed++
					byKey[s.on] = append(byKey[s.on], s)
				}
			}
			for on, ss := range byKey {
				limit := 1
				if on == "semaphore" {
					limit = 2
				}
				if n := maxOverlap(ss); n > limit {
					t.Errorf("%s: %d confirmed sections overlapped, want at most %d", on, n, limit)
				}
			}
			t.Logf("%s: %v, %d calls, %d sections (%d confirmed: %d before the restart, %d after), %d failed calls, %d backends terminated, 1 restart, %d connections discarded",
				drv, ran.Round(100*time.Millisecond), calls.Load(), len(sections), confirmed, confirmedBefore.Load(), confirmedAfter.Load(),
				failed.Load(), terminated.Load(), l.Stats().Discarded)
			if confirmedBefore.Load() < enough || confirmedAfter.Load() < enough || terminated.Load() < 3 {
				t.Fatalf("the chaos was not exercised in %v: %d confirmed sections before the restart, %d after, %d terminations",
					ran, confirmedBefore.Load(), confirmedAfter.Load(), terminated.Load())
			}
			waitNoLocks(t, db, 10*time.Second)
			if st := l.Stats(); st.Held != 0 {
				t.Fatalf("Stats().Held = %d after every call returned", st.Held)
			}
			deadline := time.Now().Add(5 * time.Second)
			for windowed.Stats().Held != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond) // the last windows end
			}
			if st := windowed.Stats(); st.Held != 0 || st.Windows != 0 {
				t.Fatalf("windowed Locker: %+v after every window ended", st)
			}
		})
	}
}

// maxOverlap returns the most sections of ss that overlap at one moment.
func maxOverlap(ss []section) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, s := range ss {
		edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta // ends before starts
		}
		return edges[i].at.Before(edges[j].at)
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.delta
		most = max(most, n)
	}
	return most
}
