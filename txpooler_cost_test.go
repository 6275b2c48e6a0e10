package sqllock_test

// The held transaction of a Locker WithTransactionPooler costs the
// database nothing else: no transaction id and no snapshot between
// statements, index builds elsewhere complete, fencing tokens increase
// (see txpooler_invariants_test.go for the set-up).

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// cicTrials builds an index concurrently on a direct connection of p,
// n times, each while during() holds what it sets up (and until the
// function it returns is called), and returns the longest build and the
// number that failed (30 s each at most).
func cicTrials(t *testing.T, p *txPooled, drv string, n int, during func(trial int) (after func())) (worst time.Duration, failed int) {
	t.Helper()
	direct := pgtest.Open(t, drv, p.dsn)
	if _, err := direct.Exec("CREATE TABLE IF NOT EXISTS items AS SELECT g AS id, md5(g::text) AS name FROM generate_series(1, 2000) g"); err != nil {
		t.Fatal(err)
	}
	for trial := range n {
		after := during(trial)
		ctx, cancel := context.WithTimeout(bg(), 30*time.Second)
		began := time.Now()
		// A build still running after 10 s logs the backends it waits for.
		tell := time.AfterFunc(10*time.Second, func() { logWaitedFor(t, direct) })
		_, err := direct.ExecContext(ctx, "CREATE INDEX CONCURRENTLY ON items (name)")
		took := time.Since(began)
		tell.Stop()
		cancel()
		worst = max(worst, took)
		if err != nil {
			failed++
			t.Logf("trial %d: CREATE INDEX CONCURRENTLY after %v: %v", trial, took.Round(time.Millisecond), err)
		}
		after()
	}
	return worst, failed
}

// logWaitedFor logs the backends whose transactions another backend waits
// for, as pg_stat_activity shows them, with the advisory locks they hold.
func logWaitedFor(t *testing.T, db *sql.DB) {
	rows, err := db.Query(`SELECT a.pid, a.state, coalesce(a.application_name, ''), now() - a.xact_start, left(a.query, 60) || ', holding ' || (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted)::text || ' advisory locks'
 FROM pg_locks w JOIN pg_locks m ON m.locktype = 'virtualxid' AND m.virtualxid = w.virtualxid AND m.granted
 JOIN pg_stat_activity a ON a.pid = m.pid WHERE w.locktype = 'virtualxid' AND NOT w.granted`)
	if err != nil {
		t.Logf("the backends waited for: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		var state, app, age, query string
		if err := rows.Scan(&pid, &state, &app, &age, &query); err != nil {
			t.Logf("the backends waited for: %v", err)
			return
		}
		t.Logf("waited for: backend %d, %s, application %q, in its transaction for %s, last statement %q", pid, state, app, age, query)
	}
}

// TestTxPoolerCIC: CREATE INDEX CONCURRENTLY on a direct connection
// completes while two Lockers WithTransactionPooler hold keys behind the
// bouncer (Lock, RLock, a semaphore's permit, on a shared session, on
// sessions of their own, and on a session that waited: four server
// connections), within 5 s, 5 builds each. The times are reported.
func TestTxPoolerCIC(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		a, b := p.locker(t, drv), p.locker(t, drv)
		worst, failed := cicTrials(t, p, drv, 5, func(trial int) func() {
			var held []*sqllock.Lock
			take := func(lk *sqllock.Lock, err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, lk)
			}
			take(a.Lock(bg(), sqllock.Int64(7900)))
			take(b.RLock(bg(), sqllock.Int64(7901)))
			take(a.Semaphore("cic", 2).Acquire(bg()))
			// A Lock that waited holds on the session it waited on.
			got := make(chan error, 1)
			go func() {
				lk, err := b.Lock(bg(), sqllock.Int64(7900))
				if err == nil {
					held = append(held, lk)
				}
				got <- err
			}()
			waitFor(t, "the waiter in the server", func() bool { return waitingPID(t, p.observer, sqllock.Int64(7900)) != 0 })
			held[0].Unlock(bg())
			if err := <-got; err != nil {
				t.Fatal(err)
			}
			held = held[1:]
			return func() {
				for _, lk := range held {
					if err := lk.Unlock(bg()); err != nil {
						t.Errorf("Unlock() = %v", err)
					}
				}
			}
		})
		t.Logf("5 index builds while 4 locks were held: the longest took %v, %d failed", worst.Round(time.Millisecond), failed)
		if failed > 0 || worst > 5*time.Second {
			t.Errorf("index builds while locks were held: %d failed, the longest took %v (want none failed, at most 5 s)", failed, worst)
		}
		p.waitNoStrays(t, 5*time.Second)
	})
}

// TestTxPoolerCICWhileBusy: an index build elsewhere completes while a
// Locker WithTransactionPooler waits for a key, or while its shared
// sessions are busy. CREATE INDEX CONCURRENTLY waits, in its last phase,
// for every transaction that had a snapshot as the phase began, until that
// transaction ends; a pinned session's transaction that ran a statement
// then (a wait's slice, a try, an unlock) would end only once the session
// holds nothing. A waiter that finds its transaction waited for leaves its
// line and waits on in a new session (errRestart); a shared session found
// so takes no new lock and closes once its locks are released
// (askWaitedOn), and every shared session retires after pinnedLife
// (4-6 s). Each build must finish within 30 s.
func TestTxPoolerCICWhileBusy(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		t.Run("a waiter waits", func(t *testing.T) {
			holder, waiter := p.locker(t, drv), p.locker(t, drv)
			k := sqllock.Int64(7910)
			worst, failed := cicTrials(t, p, drv, 3, func(int) func() {
				lk, err := holder.Lock(bg(), k)
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					w, err := waiter.Lock(bg(), k)
					if err == nil {
						err = w.Unlock(bg())
					}
					got <- err
				}()
				waitFor(t, "the waiter in the server", func() bool { return waitingPID(t, p.observer, k) != 0 })
				return func() {
					lk.Unlock(bg())
					if err := <-got; err != nil {
						t.Errorf("the waiter: %v", err)
					}
				}
			})
			t.Logf("3 index builds while a waiter waited: %d failed, the longest took %v", failed, worst.Round(time.Millisecond))
			if failed > 0 {
				t.Errorf("%d of 3 index builds failed while a waiter waited", failed)
			}
		})
		t.Run("shared sessions busy", func(t *testing.T) {
			ls := []*sqllock.Locker{p.locker(t, drv), p.locker(t, drv)}
			ctx, cancel := context.WithCancel(bg())
			var wg sync.WaitGroup
			var sections atomic.Int64
			for i, l := range ls {
				for g := range 8 {
					wg.Go(func() {
						for ctx.Err() == nil {
							lk, err := l.TryLock(bg(), sqllock.Int64(int64(7920+10*i+g)))
							if err != nil {
								continue
							}
							lk.Unlock(bg())
							sections.Add(1)
						}
					})
				}
			}
			worst, failed := cicTrials(t, p, drv, 10, func(int) func() {
				time.Sleep(time.Second) // the load under way
				return func() {}
			})
			cancel()
			waitGroup(t, &wg, hangCeiling)
			t.Logf("10 index builds while 16 goroutines took and released keys (%d sections): %d failed, the longest took %v", sections.Load(), failed, worst.Round(time.Millisecond))
			if failed > 0 {
				t.Errorf("%d of 10 index builds failed while shared sessions were busy", failed)
			}
		})
	})
}

// TestTxPoolerNoXidNoSnapshot: the backends of a Locker
// WithTransactionPooler that hold keys (a Lock and a TryLock on a shared
// session, and with a pool of 8 a permit and an election's term that
// proclaimed, each token taken) and of one that waits for a key have no
// transaction id and no snapshot between statements: sampled every 10 ms
// for 3 s from pg_stat_activity, every sample of them idle in
// transaction (or aborted, between a wait's slice and the rollback to its
// savepoint) shows backend_xid and backend_xmin null. The keep-alive
// (200 ms) and the lease's statements run meanwhile, and tokens are
// taken. The counts are reported.
func TestTxPoolerNoXidNoSnapshot(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		l := p.locker(t, drv, sqllock.WithKeepAlive(200*time.Millisecond), sqllock.WithOrphanBound(4*time.Second))
		other := p.locker(t, drv)
		var held []*sqllock.Lock
		take := func(lk *sqllock.Lock, err error) *sqllock.Lock {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, lk)
			return lk
		}
		take(l.Lock(bg(), sqllock.Int64(7930)))
		take(l.TryLock(bg(), sqllock.Int64(7931)))
		if p.pool >= 8 {
			// Each on a session of its own: with a pool of 4, they would
			// leave the bouncer no server connection for the keep-alive
			// and the other clients.
			take(l.Semaphore("xmin", 2).Acquire(bg()))
			el := l.Election(sqllock.Int64(7932))
			take(el.Campaign(bg(), "xmin"))
			if err := el.Proclaim(bg(), "xmin2"); err != nil {
				t.Fatal(err)
			}
		}
		// A Lock that waits for a key another Locker holds (which this
		// test keeps), and one that waited and holds.
		blocked := sqllock.Int64(7933)
		if _, err := other.Lock(bg(), blocked); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg())
		defer cancel()
		go l.Lock(ctx, blocked)
		var waiter int
		waitFor(t, "the waiter in the server", func() bool { waiter = waitingPID(t, p.observer, blocked); return waiter != 0 })
		pids := map[int]bool{waiter: true}
		for _, lk := range held {
			if _, err := lk.Token(bg()); err != nil {
				t.Fatalf("Token() = %v", err)
			}
			pids[lk.PID()] = true
		}
		var list []int64
		for pid := range pids {
			list = append(list, int64(pid))
		}
		idle, idleBad, aborted, active, activeXmin := 0, 0, 0, 0, 0
		var bad []string
		deadline := time.Now().Add(3 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			if i%20 == 0 {
				// Statements on the holders' sessions meanwhile.
				if _, err := held[i/20%len(held)].Token(bg()); err != nil {
					t.Fatalf("Token() = %v", err)
				}
			}
			rows, err := p.observer.Query(`SELECT pid, state, backend_xid::text, backend_xmin::text FROM pg_stat_activity WHERE pid = ANY($1)`, list)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var pid int
				var state string
				var xid, xmin sql.NullString
				if err := rows.Scan(&pid, &state, &xid, &xmin); err != nil {
					t.Fatal(err)
				}
				switch state {
				case "idle in transaction", "idle in transaction (aborted)":
					// Aborted: a wait's slice that ended with its
					// lock_timeout, before the rollback to its savepoint.
					idle++
					if state != "idle in transaction" {
						aborted++
					}
					if xid.Valid || xmin.Valid {
						idleBad++
						bad = append(bad, fmt.Sprintf("backend %d: xid %v, xmin %v", pid, xid.String, xmin.String))
					}
				case "active":
					active++
					if xmin.Valid {
						activeXmin++
					}
				default:
					var q string
					p.observer.QueryRow("SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&q)
					t.Fatalf("backend %d (waiter %d) is %q, want idle in transaction or active; its last statement: %s", pid, waiter, state, q)
				}
			}
			rows.Close()
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%d backends (%d holders, 1 waiter): %d samples idle in transaction (%d aborted: a wait's slice, before its rollback to the savepoint), %d with a transaction id or a snapshot; %d samples mid-statement (%d with a snapshot)",
			len(list), len(list)-1, idle, aborted, idleBad, active, activeXmin)
		if idleBad > 0 {
			t.Errorf("%d samples idle in transaction had a transaction id or a snapshot: %v", idleBad, bad[:min(len(bad), 5)])
		}
		if idle < 100 {
			t.Errorf("%d samples idle in transaction, want at least 100", idle)
		}
	})
}
