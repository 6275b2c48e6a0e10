package sqllock_test

import (
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestPoolRule: what docs/deployment.md ("The pool") says a Locker takes
// from a pool of 8. 200 locks on free keys are held on 2
// shared sessions (a quarter of the pool); 5 locks that waited for held
// keys keep a session each once granted, and the keep-alive still gets the
// connection left; a 6th fills the pool, and the keep-alive is skipped.
func TestPoolRule(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		db.SetMaxOpenConns(8)
		l := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
		var mu sync.Mutex
		var locks []*sqllock.Lock
		defer func() {
			for _, lk := range locks {
				lk.Unlock(bg())
			}
		}()
		take := func(n int, key func(i int) sqllock.Key) {
			t.Helper()
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					lk, err := l.Lock(bg(), key(i))
					if err != nil {
						t.Errorf("Lock(%v) = %v", key(i), err)
						return
					}
					mu.Lock()
					locks = append(locks, lk)
					mu.Unlock()
				})
			}
			waitGroup(t, &wg, hangCeiling)
			if t.Failed() {
				t.FailNow()
			}
		}
		take(200, func(i int) sqllock.Key { return sqllock.Pair(1, int32(i)) })
		// inUse is the pool's connections in use, but for one the
		// keep-alive may be using at that moment.
		inUse := func(want int) bool { n := db.Stats().InUse; return n == want || n == want+1 && want < 8 }
		if st := l.Stats(); st.SharedSessions != 2 || !inUse(2) {
			t.Fatalf("200 locks on free keys: %d shared sessions, %d connections in use; want 2 and 2", st.SharedSessions, db.Stats().InUse)
		}
		// checks returns the keep-alive's counts over a few intervals,
		// until two checks ran or were skipped (a loaded machine can take
		// longer than an interval to open the check's connection), for 5 s
		// at most.
		checks := func() (ran, skipped int64) {
			before := l.Stats()
			time.Sleep(600 * time.Millisecond)
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				after := l.Stats()
				ran, skipped = after.KeepAliveChecks-before.KeepAliveChecks, after.KeepAliveSkipped-before.KeepAliveSkipped
				if ran+skipped >= 2 || time.Now().After(end) {
					return ran, skipped
				}
			}
		}
		if ran, skipped := checks(); ran == 0 || skipped != 0 {
			t.Fatalf("200 locks on 2 shared sessions: %d keep-alive checks, %d skipped; want some, none skipped", ran, skipped)
		}
		// Locks that wait for held keys, granted when the holder lets go.
		holder := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
		observer := pgtest.Open(t, "pgx", dsn)
		waited := func(from, n int) {
			t.Helper()
			var keys []sqllock.Key
			var held []*sqllock.Lock
			for i := from; i < from+n; i++ {
				lk, err := holder.Lock(bg(), sqllock.Pair(2, int32(i)))
				if err != nil {
					t.Fatal(err)
				}
				keys, held = append(keys, lk.Key()), append(held, lk)
			}
			go func() {
				// Let go once every call waits in the server.
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					found, err := sqllock.Inspect(bg(), observer, nil, keys...)
					waiting := 0
					for _, h := range found {
						if !h.Granted {
							waiting++
						}
					}
					if err != nil || waiting == n {
						break
					}
				}
				for _, lk := range held {
					lk.Unlock(bg())
				}
			}()
			take(n, func(i int) sqllock.Key { return sqllock.Pair(2, int32(from+i)) })
		}
		waited(0, 5)
		if !inUse(7) {
			t.Fatalf("with 5 locks that waited: %d connections in use, want 7 (2 shared + 5)", db.Stats().InUse)
		}
		if ran, skipped := checks(); ran == 0 || skipped != 0 {
			t.Fatalf("with 7 of 8 connections in use: %d keep-alive checks, %d skipped; want some, none skipped", ran, skipped)
		}
		waited(5, 1)
		if !inUse(8) {
			t.Fatalf("with 6 locks that waited: %d connections in use, want 8", db.Stats().InUse)
		}
		if _, skipped := checks(); skipped == 0 {
			t.Fatal("with the pool full: no keep-alive check skipped")
		}
	})
}
