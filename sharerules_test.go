package sqllock_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// The rules of sharing, as users meet them.

// TestSharedColdStartSpreads: many calls at once on a fresh Locker spread
// over its shared sessions, so that losing one loses few of them.
func TestSharedColdStartSpreads(t *testing.T) {
	t.Parallel()
	const calls = 400
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		var wg sync.WaitGroup
		locks := make([]*sqllock.Lock, calls)
		for i := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lk, err := l.TryLock(bg(), sqllock.Int64(int64(50000+i)))
				if err != nil {
					t.Error(err)
				}
				locks[i] = lk
			}()
		}
		waitGroup(t, &wg, hangCeiling)
		per := map[int]int{}
		most := 0
		for _, lk := range locks {
			if lk != nil {
				per[lk.PID()]++
				most = max(most, per[lk.PID()])
			}
		}
		t.Logf("%d locks at once on %d shared sessions, at most %d on one", calls, len(per), most)
		if most > calls/2 {
			t.Errorf("%d of %d locks taken at once on one shared session (of %d): losing it would lose them all", most, calls, len(per))
		}
		for _, lk := range locks {
			lk.Unlock(bg())
		}
	})
}

// TestSharedAgainAfterContention: keys that were each contended once go
// back to the shared sessions once they are free: held at once later, they
// take a few sessions, not one each.
func TestSharedAgainAfterContention(t *testing.T) {
	long(t)
	t.Parallel()
	const keys = 60
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		other := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
		for i := range keys {
			k := sqllock.Int64(int64(60000 + i))
			hl, err := other.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *sqllock.Lock)
			go func() {
				lk, err := l.Lock(bg(), k)
				if err != nil {
					t.Error(err)
				}
				got <- lk
			}()
			testkit.WaitWaiters(t, db, k, 1)
			hl.Unlock(bg())
			(<-got).Unlock(bg())
		}
		time.Sleep(1500 * time.Millisecond) // past the contention memory
		var wg sync.WaitGroup
		locks := make([]*sqllock.Lock, keys)
		for i := range locks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lk, err := l.Lock(bg(), sqllock.Int64(int64(60000+i)))
				if err != nil {
					t.Error(err)
				}
				locks[i] = lk
			}()
		}
		waitGroup(t, &wg, hangCeiling)
		pids := map[int]bool{}
		for _, lk := range locks {
			pids[lk.PID()] = true
		}
		t.Logf("%d keys contended once, then held at once: %d server sessions (%d shared)", keys, len(pids), l.Stats().SharedSessions)
		if len(pids) > 16 {
			t.Errorf("%d keys contended once, free again and held at once, took %d server sessions", keys, len(pids))
		}
		for _, lk := range locks {
			lk.Unlock(bg())
		}
	})
}

// TestSmallPoolNotStarved: with a pool of one connection, churning
// TryLocks leave the connection to waiting Locks and to the application's
// own queries.
func TestSmallPoolNotStarved(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		db.SetMaxOpenConns(1)
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		ctx, stop := context.WithCancel(bg())
		var wg sync.WaitGroup
		var churned atomic.Int64
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					if lk, err := l.TryLock(ctx, sqllock.Int64(int64(70000+g*100000+i%50))); err == nil {
						lk.Unlock(bg())
						churned.Add(1)
					}
				}
			}()
		}
		// Each waiting Lock and each query of the application's must get
		// the connection (in a few seconds: a loaded machine is slow, a
		// starved caller never gets it).
		for churned.Load() < 20 {
			time.Sleep(time.Millisecond)
		}
		began, before := time.Now(), churned.Load()
		var slowest time.Duration
		for i := range 5 {
			wctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			t0 := time.Now()
			lk, err := l.Lock(wctx, sqllock.Int64(79999))
			if err != nil {
				cancel()
				t.Fatalf("waiting Lock %d under churning TryLocks, pool of 1: %v after %v", i, err, time.Since(t0))
			}
			lk.Unlock(bg())
			slowest = max(slowest, time.Since(t0))
			t0 = time.Now()
			var one int
			if err := db.QueryRowContext(wctx, "SELECT 1").Scan(&one); err != nil {
				cancel()
				t.Fatalf("the application's query %d under churning TryLocks, pool of 1: %v after %v", i, err, time.Since(t0))
			}
			slowest = max(slowest, time.Since(t0))
			cancel()
		}
		during := churned.Load() - before
		stop()
		waitGroup(t, &wg, hangCeiling)
		t.Logf("pool of 1 under churning TryLocks (%d meanwhile): 5 waiting Locks and 5 queries of the application's own in %v (slowest %v)",
			during, time.Since(began).Round(time.Millisecond), slowest.Round(time.Millisecond))
		if during == 0 {
			t.Fatal("no TryLock ran while the Locks and queries did: the trial did not happen")
		}
	})
}

// TestSeveralLockersOnOnePool: six Lockers on one pool without a limit,
// used one after another in quick succession (each one's shared sessions
// still pinned, lingering, when the next begins), each by 200 concurrent
// TryLock + Unlock calls, against a database that admits 40 connections:
// every call succeeds. Each Locker opening its own 16 shared sessions
// would need 96; a Locker opens more than one only while the pool has
// room.
func TestSeveralLockersOnOnePool(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			dsn := srv.NewDatabase(t)
			limitConnections(t, srv, dsn, 40)
			db := pgtest.Open(t, drv, dsn)
			var failed atomic.Int64
			var first error
			var once sync.Once
			for n := range 6 {
				l := sqllock.New(db, sqllock.WithKeepAlive(0))
				var wg sync.WaitGroup
				for i := range 200 {
					wg.Go(func() {
						lk, err := l.TryLock(bg(), sqllock.Pair(int32(60+n), int32(i)))
						if err == nil {
							err = lk.Unlock(bg())
						}
						if err != nil {
							failed.Add(1)
							once.Do(func() { first = err })
						}
					})
				}
				waitGroup(t, &wg, hangCeiling)
			}
			t.Logf("6 Lockers × 200 calls on one pool: %d failed; %d connections open at the end", failed.Load(), db.Stats().OpenConnections)
			if failed.Load() != 0 {
				t.Fatalf("%d of 1,200 calls failed; the first: %v", failed.Load(), first)
			}
		})
	}
}
