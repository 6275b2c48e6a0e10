package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// poolerTraffic runs plain clients of bdsn (the bouncer) until the test
// ends: each takes key k for the length of one statement
// (pg_try_advisory_xact_lock) in a loop, the way an application's own
// transactions pass through a pooler. While held reports true, a grant is
// counted in grantedWhileHeld: a client that was granted a key a Locker
// reported held.
type poolerTraffic struct {
	grants, grantedWhileHeld atomic.Int64
	held                     atomic.Bool
	// Each statement runs under a read lock of pause: while it is locked
	// (paused), no client runs one, and none holds the key.
	pause sync.RWMutex
}

// paused runs f while no plain client runs a statement: a key a backend
// holds then is not a plain client's transaction lock (held for the
// length of its statement), but a session-level lock left behind.
func (tr *poolerTraffic) paused(f func()) {
	tr.pause.Lock()
	defer tr.pause.Unlock()
	f()
}

func startPoolerTraffic(t *testing.T, bdsn string, k sqllock.Key, clients int) *poolerTraffic {
	t.Helper()
	tr := &poolerTraffic{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	v, _ := k.Int64()
	for range clients {
		db := pgtest.Open(t, "pgx", bdsn+"&default_query_exec_mode=simple_protocol")
		db.SetMaxOpenConns(1)
		wg.Go(func() {
			for ctx.Err() == nil {
				var got bool
				tr.pause.RLock()
				err := db.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock($1)", v).Scan(&got)
				tr.pause.RUnlock()
				if err != nil {
					time.Sleep(time.Millisecond) // a terminated server session, or the end
					continue
				}
				if got {
					tr.grants.Add(1)
					if tr.held.Load() {
						tr.grantedWhileHeld.Add(1)
					}
				}
			}
		})
	}
	return tr
}

// TestPoolerLeavesNothing: behind PgBouncer in transaction mode, with
// other clients on the bouncer, a Locker without WithTransactionPooler
// refuses its lock calls before it grants one (ErrSessionChanged, naming
// the option), no plain client is granted a key while a Locker reports
// it held, and no key is held by any backend 3 s after a Locker's last
// call. Each run is a new Locker (a new pool of client connections)
// making 20 lock and unlock calls; pgx keeps its default statement cache.
func TestPoolerLeavesNothing(t *testing.T) {
	// A bouncer and a database of its own, a key per driver: most of it
	// is the 3 s waits, which run beside other tests' work.
	t.Parallel()
	dsn, bdsn := behindPgBouncer(t, "transaction", 2)
	observer := pgtest.Open(t, "pgx", dsn)
	runs := 10
	if testing.Short() {
		runs = 2
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			k := sqllock.Int64(7100 + int64(len(drv)))
			tr := startPoolerTraffic(t, bdsn, k, 3)
			var granted, refused int
			errs := map[string]int{}
			for run := range runs {
				db := pgtest.Open(t, drv, bdsn)
				l := sqllock.New(db)
				for range 20 {
					ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
					lk, err := l.Lock(ctx, k)
					cancel()
					if err != nil {
						refused++
						switch {
						case errors.Is(err, sqllock.ErrSessionChanged) && strings.Contains(err.Error(), "WithTransactionPooler"):
							errs["ErrSessionChanged naming WithTransactionPooler"]++
						default:
							errs[err.Error()]++
						}
						continue
					}
					granted++
					tr.held.Store(true)
					time.Sleep(2 * time.Millisecond)
					tr.held.Store(false)
					if err := lk.Unlock(bg()); err != nil {
						errs["Unlock: "+err.Error()]++
					}
				}
				db.Close()
				time.Sleep(3 * time.Second)
				// The plain clients hold k for the length of each of their
				// statements: looked for between them.
				tr.paused(func() {
					if h := holders(t, observer, k); len(h) != 0 {
						t.Errorf("run %d: %v held by backends %v 3 s after the Locker's last call", run, k, h)
					}
				})
			}
			t.Logf("%d runs of 20 Lock calls: %d granted, %d refused; errors: %v; plain clients' grants: %d, %d of them while a Locker reported the key held",
				runs, granted, refused, errs, tr.grants.Load(), tr.grantedWhileHeld.Load())
			if granted != 0 {
				t.Errorf("%d Lock calls granted behind a transaction pooler, want every call refused", granted)
			}
			if n := errs["ErrSessionChanged naming WithTransactionPooler"]; n != refused {
				t.Errorf("%d of %d refusals were ErrSessionChanged naming WithTransactionPooler: %v", n, refused, errs)
			}
			if n := tr.grantedWhileHeld.Load(); n != 0 {
				t.Errorf("plain clients were granted %v %d times while a Locker reported it held", k, n)
			}
			if tr.grants.Load() == 0 {
				t.Error("the plain clients were never granted the key: the traffic did not run")
			}
		})
	}
}

// TestPoolerDetection measures how reliably a Locker tells a transaction
// pooler from a direct connection before its first lock, with and without
// other clients' traffic on the bouncer: every new Locker behind the
// bouncer must refuse its first call, and every new Locker on the
// direct connection must grant it.
func TestPoolerDetection(t *testing.T) {
	dsn, bdsn := behindPgBouncer(t, "transaction", 4)
	rounds := 50
	if testing.Short() {
		rounds = 10
	}
	if n, err := strconv.Atoi(os.Getenv("SQLLOCK_POOLER_ROUNDS")); err == nil {
		rounds = n // a longer measure
	}
	// pgx in the simple protocol prepares nothing: the probe alone tells.
	for _, drv := range []string{"postgres", "pgx", "pgx-simple"} {
		for _, traffic := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/traffic=%v", drv, traffic), func(t *testing.T) {
				k := sqllock.Int64(7200 + int64(len(drv)))
				driver, opts := drv, ""
				if drv == "pgx-simple" {
					driver, opts = "pgx", "&default_query_exec_mode=simple_protocol"
				}
				if traffic {
					startPoolerTraffic(t, bdsn, sqllock.Int64(7299), 6)
				}
				var missed, falseAlarms int
				evidence := map[string]int{}
				var direct, pooled time.Duration
				for range rounds {
					for _, target := range []string{bdsn, dsn} {
						db, err := sql.Open(driver, target+opts)
						if err != nil {
							t.Fatal(err)
						}
						ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
						began := time.Now()
						lk, err := sqllock.New(db).Lock(ctx, k)
						cancel()
						if target == dsn {
							direct += time.Since(began)
						} else {
							pooled += time.Since(began)
						}
						if err != nil {
							evidence[poolerEvidence(err)]++
						}
						switch {
						case target == bdsn && err == nil:
							missed++
							t.Logf("missed: Lock() granted on backend %d; Unlock() = %v", lk.PID(), lk.Unlock(bg()))
						case target == bdsn && !errors.Is(err, sqllock.ErrSessionChanged):
							t.Errorf("Lock() behind the pooler = %v, want ErrSessionChanged", err)
						case target == dsn && err != nil:
							falseAlarms++
							t.Errorf("Lock() on a direct connection = %v", err)
						case target == dsn:
							lk.Unlock(bg())
						}
						db.Close()
					}
				}
				t.Logf("%d Lockers each way: the pooler missed %d times, a direct connection taken for a pooler %d times; evidence %v; first Lock %v on average behind the pooler, %v direct",
					rounds, missed, falseAlarms, evidence, pooled/time.Duration(rounds), direct/time.Duration(rounds))
				if missed != 0 {
					t.Errorf("the pooler was missed %d times in %d", missed, rounds)
				}
			})
		}
	}
}

// TestPoolerStrandedFreed: a Locker that takes locks behind a
// transaction pooler before it knows (its probe turned off) frees what
// it left on the pooler's server sessions: no key is held by any backend
// 3 s after its last call, whatever its calls answered.
func TestPoolerStrandedFreed(t *testing.T) {
	t.Parallel() // a bouncer of its own; its runs mostly wait out their 3 s
	dsn, bdsn := behindPgBouncer(t, "transaction", 2)
	observer := pgtest.Open(t, "pgx", dsn)
	runs := 10
	if testing.Short() {
		runs = 3
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			k := sqllock.Int64(7300 + int64(len(drv)))
			startPoolerTraffic(t, bdsn, sqllock.Int64(7399), 3)
			var granted, unlocked int
			errs := map[string]int{}
			for run := range runs {
				db := pgtest.Open(t, drv, bdsn)
				l := sqllock.New(db, sqllock.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
				sqllock.SkipPoolerProbe(l)
				for range 20 {
					ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
					lk, err := l.Lock(ctx, k)
					cancel()
					if err != nil {
						errs[errClass(err)]++
						continue
					}
					granted++
					time.Sleep(time.Millisecond)
					if err := lk.Unlock(bg()); err != nil {
						errs["Unlock: "+errClass(err)]++
					} else {
						unlocked++
					}
				}
				db.Close()
				time.Sleep(3 * time.Second)
				if h := holders(t, observer, k); len(h) != 0 {
					t.Errorf("run %d: %v held by backends %v 3 s after the Locker's last call", run, k, h)
				}
			}
			t.Logf("%d runs of 20 Lock calls, no probe: %d granted, %d unlocked; errors: %v", runs, granted, unlocked, errs)
		})
	}
}

// errClass names err's kind for the tallies of the pooler tests.
func errClass(err error) string {
	switch {
	case errors.Is(err, sqllock.ErrSessionChanged) && strings.Contains(err.Error(), "WithTransactionPooler"):
		return "ErrSessionChanged naming WithTransactionPooler"
	case errors.Is(err, sqllock.ErrSessionChanged):
		return "ErrSessionChanged"
	case errors.Is(err, sqllock.ErrLockLost):
		return "ErrLockLost: " + err.Error()
	}
	return err.Error()
}

// poolerEvidence names the evidence a pooler error gives.
func poolerEvidence(err error) string {
	for _, e := range []string{"outlived its client connection", "two client connections", "answered from backend", "ran a lock statement on backend", "prepared statement", "already carries another client", "from backend"} {
		if strings.Contains(err.Error(), e) {
			return e
		}
	}
	return err.Error()
}

// TestPoolerFreedBeforeReturn: a call refused for a pooler it just found
// returns once the sessions it discarded are freed on the server, so that
// a program that closes its pool at once leaves no lock behind. A
// Locker with no probe holds a key in a Session on the bouncer's only
// server session; a second Session lands on that server session too,
// which is the evidence: every session of the Locker is discarded, the
// call fails, and the pool is closed at once.
func TestPoolerFreedBeforeReturn(t *testing.T) {
	t.Parallel() // a bouncer of its own; mostly the 3 s waits
	dsn, bdsn := behindPgBouncer(t, "transaction", 1)
	observer := pgtest.Open(t, "pgx", dsn)
	runs := 3
	if testing.Short() {
		runs = 1
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			k := sqllock.Int64(7400 + int64(len(drv)))
			for run := range runs {
				db := pgtest.Open(t, drv, bdsn)
				l := sqllock.New(db)
				sqllock.SkipPoolerProbe(l)
				ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
				s, err := l.Session(ctx)
				if err == nil {
					err = s.Lock(ctx, k)
				}
				if err != nil {
					cancel()
					t.Fatalf("run %d: the first Session's Lock: %v", run, err)
				}
				if len(holders(t, observer, k)) != 1 {
					cancel()
					t.Fatalf("run %d: %v not held after Lock", run, k)
				}
				s2, err := l.Session(ctx)
				cancel()
				if !errors.Is(err, sqllock.ErrSessionChanged) {
					if s2 != nil {
						s2.Close(bg())
					}
					t.Fatalf("run %d: a second Session on the bouncer's only server session: %v, want ErrSessionChanged", run, err)
				}
				db.Close()
				// The call returned once the termination was done; the
				// server ends the backend a moment later.
				held := holders(t, observer, k)
				for end := time.Now().Add(3 * time.Second); len(held) != 0 && time.Now().Before(end); held = holders(t, observer, k) {
					time.Sleep(50 * time.Millisecond)
				}
				if len(held) != 0 {
					t.Errorf("run %d: %v held by backends %v 3 s after the pool was closed", run, k, held)
				}
			}
		})
	}
}
