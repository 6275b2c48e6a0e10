package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestServerRestart: every held lock reports lost within the keep-alive
// bound, new locks work once the server is back, and no goroutine leaks.
func TestServerRestart(t *testing.T) {
	long(t)
	ignore := goleak.IgnoreCurrent()
	// Registered first, so it runs last: after the server is stopped.
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	srv := pgtest.Private(t)
	const keepAlive = 100 * time.Millisecond
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, err := sql.Open(drv, srv.DSN())
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			l := sqllock.New(db, sqllock.WithKeepAlive(keepAlive))
			var held []*sqllock.Lock
			for i := 0; i < 20; i++ {
				lk, err := l.Lock(bg(), sqllock.Pair(9, int32(i)))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, lk)
			}
			start := time.Now()
			if err := srv.Restart(bg()); err != nil {
				t.Fatal(err)
			}
			restarted := time.Since(start)
			for i, lk := range held {
				select {
				case <-lk.Done():
				case <-time.After(3*keepAlive + 5*time.Second):
					t.Fatalf("lock %d not reported lost %v after the restart began", i, time.Since(start))
				}
				if !errors.Is(lk.Err(), sqllock.ErrLockLost) {
					t.Fatalf("lock %d: Err() = %v", i, lk.Err())
				}
			}
			t.Logf("restart took %v; all 20 locks reported lost after %v", restarted, time.Since(start))
			for _, lk := range held {
				if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
					t.Fatalf("Unlock() of a lost lock = %v", err)
				}
			}
			var again []*sqllock.Lock
			for i := 0; i < 20; i++ {
				lk, err := l.Lock(bg(), sqllock.Pair(9, int32(i)))
				if err != nil {
					t.Fatalf("lock %d after the restart: %v", i, err)
				}
				again = append(again, lk)
			}
			for _, lk := range again {
				if err := lk.Unlock(bg()); err != nil {
					t.Fatal(err)
				}
			}
			if st := l.Stats(); st.Lost != 20 || st.Held != 0 || st.Acquired != 40 {
				t.Fatalf("Stats() = %+v", st)
			}
		})
	}
}

// TestStandby: locks on a hot standby do not conflict with the primary's,
// so they are refused, and nothing is left held on the standby.
func TestStandby(t *testing.T) {
	long(t)
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	sdsn, sdb := startStandby(t, srv, dsn)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db := pgtest.Open(t, drv, sdsn)
			l := sqllock.New(db)
			k := sqllock.Int64(31)
			if _, err := l.Lock(bg(), k); !errors.Is(err, sqllock.ErrStandby) {
				t.Fatalf("Lock() on a standby = %v, want ErrStandby", err)
			}
			if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrStandby) {
				t.Fatalf("TryLock() on a standby = %v, want ErrStandby", err)
			}
			if n := advisoryCount(t, sdb); n != 0 {
				t.Fatalf("%d advisory locks left on the standby", n)
			}
			// Why: with the check off, the standby grants a lock the primary
			// also grants.
			risky := sqllock.New(db, sqllock.WithAllowStandby())
			onStandby, err := risky.TryLock(bg(), k)
			if err != nil {
				t.Fatalf("TryLock() with WithAllowStandby = %v", err)
			}
			onPrimary, err := sqllock.New(pgtest.Open(t, "pgx", dsn)).TryLock(bg(), k)
			if err != nil {
				t.Fatalf("primary TryLock() while the standby holds the key = %v (standby locks do not conflict)", err)
			}
			onStandby.Unlock(bg())
			onPrimary.Unlock(bg())
		})
	}
}

// startStandby starts a hot standby of srv for t, and returns the DSN of
// database dsn on it and a pgx pool of it, once the database has
// replicated.
func startStandby(t *testing.T, srv *pgtest.Server, dsn string) (string, *sql.DB) {
	t.Helper()
	if !srv.Local() {
		pgtest.Unavailable(t, "a local cluster (for a standby)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	standby := pgtest.StartStandby(t, srv)
	sdsn := standby.DSNFor(pgtest.DatabaseOf(dsn))
	deadline := time.Now().Add(30 * time.Second)
	for { // wait until the new database has replicated
		sdb := pgtest.Open(t, "pgx", sdsn)
		if sdb.Ping() == nil {
			return sdsn, sdb
		}
		sdb.Close()
		if time.Now().After(deadline) {
			t.Fatal("database did not reach the standby")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestStandbyTxLocks: transaction-level locks on a hot standby do not
// conflict with the primary's either, so LockTx and kin, and InTx, are
// refused with ErrStandby while the primary holds the key, whatever the
// context, and the standby is granted nothing: its pg_locks shows no
// advisory lock, even while the transaction is still open. (A standby
// refuses some BEGINs: lib/pq's READ WRITE, anyone's SERIALIZABLE; InTx
// says ErrStandby there too.)
func TestStandbyTxLocks(t *testing.T) {
	long(t)
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	sdsn, sdb := startStandby(t, srv, dsn)
	k := sqllock.Int64(32)
	holder, err := pgtest.Open(t, "pgx", dsn).Conn(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(bg(), "SELECT pg_advisory_lock(32)"); err != nil {
		t.Fatal(err)
	}
	defer holder.ExecContext(bg(), "SELECT pg_advisory_unlock_all()")
	contexts := []struct {
		name string
		ctx  func(t *testing.T) context.Context
	}{
		{"background", func(*testing.T) context.Context { return bg() }},
		{"cancellable", func(t *testing.T) context.Context { return t.Context() }},
		{"deadline", func(t *testing.T) context.Context {
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			t.Cleanup(cancel)
			return ctx
		}},
	}
	calls := []struct {
		name string
		call func(ctx context.Context, tx *sql.Tx) error
	}{
		{"LockTx", func(ctx context.Context, tx *sql.Tx) error { return sqllock.LockTx(ctx, tx, k) }},
		{"RLockTx", func(ctx context.Context, tx *sql.Tx) error { return sqllock.RLockTx(ctx, tx, k) }},
		{"TryLockTx", func(ctx context.Context, tx *sql.Tx) error {
			ok, err := sqllock.TryLockTx(ctx, tx, k)
			if ok && err == nil {
				return errors.New("granted")
			}
			return err
		}},
		{"TryRLockTx", func(ctx context.Context, tx *sql.Tx) error {
			ok, err := sqllock.TryRLockTx(ctx, tx, k)
			if ok && err == nil {
				return errors.New("granted")
			}
			return err
		}},
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db := pgtest.Open(t, drv, sdsn)
			for _, c := range contexts {
				for _, call := range calls {
					t.Run(call.name+"/"+c.name, func(t *testing.T) {
						tx, err := db.BeginTx(bg(), &sql.TxOptions{ReadOnly: true})
						if err != nil {
							t.Fatal(err)
						}
						defer tx.Rollback()
						if err := call.call(c.ctx(t), tx); !errors.Is(err, sqllock.ErrStandby) {
							t.Fatalf("%s() on a standby while the primary holds the key = %v, want ErrStandby", call.name, err)
						}
						// The transaction is still open: a lock it took would show.
						if n := advisoryCount(t, sdb); n != 0 {
							t.Fatalf("%d advisory locks on the standby", n)
						}
					})
				}
				// nil: lib/pq's BEGIN READ WRITE is refused; read-only: the
				// lock statement is; serializable: BEGIN is, whatever the
				// driver.
				for i, opts := range []*sql.TxOptions{nil, {ReadOnly: true}, {ReadOnly: true, Isolation: sql.LevelSerializable}} {
					t.Run(fmt.Sprintf("InTx/%s/%s", c.name, []string{"default", "readonly", "serializable"}[i]), func(t *testing.T) {
						ran := false
						err := sqllock.New(db).InTx(c.ctx(t), k, opts, func(*sql.Tx) error {
							ran = true
							return nil
						})
						if !errors.Is(err, sqllock.ErrStandby) || ran {
							t.Fatalf("InTx() on a standby while the primary holds the key = %v (fn ran: %v), want ErrStandby", err, ran)
						}
						if n := advisoryCount(t, sdb); n != 0 {
							t.Fatalf("%d advisory locks on the standby", n)
						}
					})
				}
			}
		})
	}
}

// TestStandbyInTxAllowed: a Locker made WithAllowStandby takes InTx's lock
// on a standby, as it takes its session locks there: the standby's
// pg_locks shows it while fn runs (and the primary's holder holds the key
// all the same: the danger the option names).
func TestStandbyInTxAllowed(t *testing.T) {
	long(t)
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	sdsn, sdb := startStandby(t, srv, dsn)
	k := sqllock.Int64(33)
	holder, err := pgtest.Open(t, "pgx", dsn).Conn(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(bg(), "SELECT pg_advisory_lock(33)"); err != nil {
		t.Fatal(err)
	}
	defer holder.ExecContext(bg(), "SELECT pg_advisory_unlock_all()")
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			l := sqllock.New(pgtest.Open(t, drv, sdsn), sqllock.WithAllowStandby())
			ran := false
			err := l.InTx(t.Context(), k, &sql.TxOptions{ReadOnly: true}, func(*sql.Tx) error {
				ran = true
				if got := holders(t, sdb, k); len(got) != 1 {
					t.Errorf("holders on the standby inside InTx = %v, want one", got)
				}
				return nil
			})
			if err != nil || !ran {
				t.Fatalf("InTx() with WithAllowStandby = %v (fn ran: %v), want nil", err, ran)
			}
			if n := advisoryCount(t, sdb); n != 0 {
				t.Fatalf("%d advisory locks left on the standby", n)
			}
		})
	}
}

// TestPgBouncerTransactionMode: behind a transaction pooler a client's
// statements land on different backends. Session locks cannot work there;
// sqllock must notice the swap instead of reporting success, and
// transaction-scoped locks must still exclude each other.
func TestPgBouncerTransactionMode(t *testing.T) {
	long(t)
	_, bdsn := behindPgBouncer(t, "transaction", 2)

	t.Run("session locks: swap detected", func(t *testing.T) {
		db := pgtest.Open(t, "postgres", bdsn)
		l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
		var ok, detected, other atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					lk, err := l.TryLock(bg(), sqllock.Pair(50, int32(g)))
					if err != nil {
						switch {
						case errors.Is(err, sqllock.ErrNotAcquired):
							// A leaked lock from an earlier swap holds it.
						case errors.Is(err, sqllock.ErrSessionChanged):
							detected.Add(1) // refused before anyone was told "held"
						default:
							other.Add(1)
						}
						continue
					}
					sqllock.ConnOf(lk).ExecContext(bg(), "SELECT pg_sleep(0.001)")
					err = lk.Unlock(bg())
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, sqllock.ErrSessionChanged) || errors.Is(err, sqllock.ErrLockLost):
						detected.Add(1)
					default:
						other.Add(1)
					}
				}
			}()
		}
		waitGroup(t, &wg, hangCeiling)
		t.Logf("through PgBouncer (transaction mode): %d confirmed unlocks, %d swaps detected, %d other errors", ok.Load(), detected.Load(), other.Load())
		if detected.Load() == 0 {
			t.Fatal("no session swap detected under concurrent load: the pooler's swaps went unnoticed")
		}
	})

	// A shared session sends its statements prepared once it is busy
	// (lib/pq, see TestPreparedStatements): one that runs on another
	// server session than it was prepared on is a swap too.
	t.Run("shared sessions: swap detected/postgres", func(t *testing.T) {
		db := pgtest.Open(t, "postgres", bdsn)
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		var ok, detected atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 40 {
					lk, err := l.TryLock(bg(), sqllock.Pair(52, int32(100*g+i)))
					if err != nil {
						switch {
						case errors.Is(err, sqllock.ErrSessionChanged):
							detected.Add(1)
						case errors.Is(err, sqllock.ErrNotAcquired):
						default:
							t.Errorf("TryLock() = %v", err)
						}
						continue
					}
					switch err := lk.Unlock(bg()); {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, sqllock.ErrSessionChanged) || errors.Is(err, sqllock.ErrLockLost):
						detected.Add(1)
					default:
						t.Errorf("Unlock() = %v", err)
					}
				}
			})
		}
		waitGroup(t, &wg, hangCeiling)
		t.Logf("through PgBouncer (transaction mode), shared sessions: %d confirmed unlocks, %d swaps detected", ok.Load(), detected.Load())
		if detected.Load() == 0 {
			t.Fatal("no session swap detected under concurrent load: the pooler's swaps went unnoticed")
		}
	})

	for _, drv := range drivers {
		t.Run("LockTx mutual exclusion/"+drv, func(t *testing.T) {
			d := bdsn
			if drv == "pgx" {
				d += "&default_query_exec_mode=simple_protocol"
			}
			db := pgtest.Open(t, drv, d)
			k := sqllock.Int64(51)
			var inside, maxInside, runs atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 10; i++ {
						tx, err := db.BeginTx(bg(), nil)
						if err != nil {
							t.Error(err)
							return
						}
						if err := sqllock.LockTx(bg(), tx, k); err != nil {
							t.Error(err)
							tx.Rollback()
							return
						}
						n := inside.Add(1)
						if n > maxInside.Load() {
							maxInside.Store(n)
						}
						tx.ExecContext(bg(), "SELECT pg_sleep(0.001)")
						inside.Add(-1)
						runs.Add(1)
						if err := tx.Commit(); err != nil {
							t.Error(err)
						}
					}
				}()
			}
			waitGroup(t, &wg, hangCeiling)
			if maxInside.Load() != 1 || runs.Load() != 80 {
				t.Fatalf("max inside %d, runs %d; want 1 and 80", maxInside.Load(), runs.Load())
			}
		})
	}
}

// TestPgBouncerSessionMode: session locks work, and a client that
// disconnects releases its locks (PgBouncer's server_reset_query).
func TestPgBouncerSessionMode(t *testing.T) {
	long(t)
	dsn, bdsn := behindPgBouncer(t, "session", 4)
	observer := pgtest.Open(t, "pgx", dsn)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db := pgtest.Open(t, drv, bdsn)
			l := sqllock.New(db)
			k := sqllock.Int64(61)
			for i := 0; i < 20; i++ {
				lk, err := l.Lock(bg(), k)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
					t.Fatalf("TryLock() of a held key = %v", err)
				}
				if err := lk.Unlock(bg()); err != nil {
					t.Fatalf("Unlock() through PgBouncer session mode = %v", err)
				}
			}
			// A client that disconnects while holding a lock frees it.
			client, err := sql.Open(drv, bdsn)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.Exec("SELECT pg_advisory_lock(62)"); err != nil {
				t.Fatal(err)
			}
			if len(holders(t, observer, sqllock.Int64(62))) != 1 {
				t.Fatal("lock 62 not held through PgBouncer")
			}
			client.Close()
			waitFree(t, observer, sqllock.Int64(62), 5*time.Second)
		})
	}
}

// TestPgBouncerNoTwoHolders: behind PgBouncer in transaction mode, two
// Lockers that take one key one after another land on one server
// session, where advisory locks are re-entrant: the second must be
// refused (held, or ErrSessionChanged), never granted, with both drivers,
// shared and dedicated sessions, and pools of 1 and 4 server sessions.
func TestPgBouncerNoTwoHolders(t *testing.T) {
	long(t)
	srv := pgtest.Start(t)
	if !srv.Local() {
		pgtest.Unavailable(t, "a local cluster (for PgBouncer)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	dsn := srv.NewDatabase(t)
	observer := pgtest.Open(t, "pgx", dsn)
	const rounds = 20
	for _, pool := range []int{1, 4} {
		b := pgtest.StartPgBouncer(t, srv, "transaction", pool)
		bdsn := b.DSNFor(pgtest.DatabaseOf(dsn))
		for _, drv := range drivers {
			for _, sessions := range []string{"shared", "dedicated"} {
				t.Run(fmt.Sprintf("pool %d/%s/%s", pool, drv, sessions), func(t *testing.T) {
					d := bdsn
					if drv == "pgx" {
						d += "&default_query_exec_mode=simple_protocol"
					}
					opts := []sqllock.Option{sqllock.WithKeepAlive(0)}
					if sessions == "dedicated" {
						opts = append(opts, sqllock.WithDedicatedSessions())
					}
					two, refused, sessionChanged := 0, 0, 0
					for r := range rounds {
						k := sqllock.Int64(int64(91000 + 100*pool + r))
						la := sqllock.New(pgtest.Open(t, drv, d), opts...)
						lb := sqllock.New(pgtest.Open(t, drv, d), opts...)
						ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
						a, errA := la.Lock(ctx, k)
						cancel()
						bl, errB := lb.TryLock(bg(), k)
						switch {
						case errA == nil && errB == nil:
							two++
							t.Errorf("round %d: both Lockers hold %v (backends %d and %d)", r, k, a.PID(), bl.PID())
						case errors.Is(errB, sqllock.ErrSessionChanged) || errors.Is(errA, sqllock.ErrSessionChanged):
							sessionChanged++
						case errB != nil:
							refused++
						}
						if a != nil {
							a.Unlock(bg())
						}
						if bl != nil {
							bl.Unlock(bg())
						}
					}
					left := advisoryCount(t, observer)
					t.Logf("%d rounds: %d with two holders, %d refused as held, %d refused with ErrSessionChanged; %d advisory locks left on the server", rounds, two, refused, sessionChanged, left)
				})
			}
		}
	}
}

// TestPgBouncerPreparedSwap: a busy lib/pq shared session runs its
// statements prepared on its server session (see TestPreparedStatements).
// Behind PgBouncer in transaction mode, once another client holds that
// server session, the next statement lands on another, where the
// statement does not exist: a swap, reported as ErrSessionChanged, with
// nothing taken, and the session's other lock reported lost.
func TestPgBouncerPreparedSwap(t *testing.T) {
	long(t)
	dsn, bdsn := behindPgBouncer(t, "transaction", 2)
	observer := pgtest.Open(t, "pgx", dsn)
	db := pgtest.Open(t, "postgres", bdsn)
	db.SetMaxOpenConns(4)
	l := sqllock.New(db, sqllock.WithKeepAlive(0))
	sqllock.IgnorePooler(l) // the statements' own checks are the subject here
	// One client alone: PgBouncer gives it the server session it used last,
	// so that the shared session stays on one backend until it is busy.
	pid, run := 0, 0
	for i := 0; run < 8; i++ {
		if i == 100 {
			t.Fatalf("no 8 locks in a row on one backend through PgBouncer in 100 tries")
		}
		lk, err := l.TryLock(bg(), sqllock.Int64(int64(93000+i)))
		if err != nil {
			if !errors.Is(err, sqllock.ErrSessionChanged) {
				t.Fatalf("TryLock() = %v", err)
			}
			run = 0
			continue
		}
		if lk.PID() != pid {
			pid, run = lk.PID(), 0
		}
		if err := lk.Unlock(bg()); err != nil {
			if !errors.Is(err, sqllock.ErrSessionChanged) {
				t.Fatalf("Unlock() = %v", err)
			}
			run = 0
			continue
		}
		run++
	}
	pin, err := l.TryLock(bg(), sqllock.Int64(93998))
	if err != nil || pin.PID() != pid {
		t.Fatalf("TryLock() = %v on the shared session (backend %d)", err, pid)
	}
	defer pin.Unlock(bg())
	// Another client takes the server session the shared one used last.
	other := pgtest.Open(t, "pgx", bdsn+"&default_query_exec_mode=simple_protocol")
	tx, err := other.BeginTx(bg(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var otherPID int
	if err := tx.QueryRowContext(bg(), "SELECT pg_backend_pid()").Scan(&otherPID); err != nil {
		t.Fatal(err)
	}
	if otherPID != pid {
		t.Fatalf("the other client got backend %d, not the shared session's %d", otherPID, pid)
	}
	// As the swap is found, the other client gives the server session
	// back: whatever the session sends next lands on its own backend
	// again, and must not make it look whole.
	var once sync.Once
	defer sqllock.SetAfterBlindStatement(func(_ context.Context, err error, _ func() bool) {
		if errors.Is(err, sqllock.ErrSessionChanged) {
			once.Do(func() { tx.Commit() })
		}
	})()
	k := sqllock.Int64(93999)
	lk, err := l.TryLock(bg(), k)
	if err == nil {
		lk.Unlock(bg())
		t.Fatalf("TryLock() on another server session than its statements were prepared on succeeded (backend %d)", lk.PID())
	}
	if !errors.Is(err, sqllock.ErrSessionChanged) {
		t.Fatalf("TryLock() = %v, want ErrSessionChanged", err)
	}
	if h := holders(t, observer, k); len(h) != 0 {
		t.Fatalf("%v held by %v after the swap, want no one", k, h)
	}
	// The session is gone: its lock too, as its holder is told (the
	// pooler's server session keeps it, as after any swap).
	if err := pin.Err(); !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("Err() of the session's other lock = %v, want ErrLockLost", err)
	}
}

// behindPgBouncer starts a PgBouncer in mode, with pool server connections,
// in front of a database of its own on the test server, and returns the
// database's DSN and PgBouncer's for it.
func behindPgBouncer(t *testing.T, mode string, pool int) (dsn, bdsn string) {
	t.Helper()
	srv := pgtest.Start(t)
	if !srv.Local() {
		pgtest.Unavailable(t, "a local cluster (for PgBouncer)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	dsn = srv.NewDatabase(t)
	b := pgtest.StartPgBouncer(t, srv, mode, pool)
	return dsn, b.DSNFor(pgtest.DatabaseOf(dsn))
}
