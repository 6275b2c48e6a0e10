package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// settingsSQL reads the session settings a lock session changes.
const settingsSQL = `SELECT concat_ws(' ', current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'),
 current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout'), current_setting('application_name'),
 current_setting('idle_session_timeout', true), current_setting('client_connection_check_interval', true))`

type querier interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

func sessionSettings(t *testing.T, q querier) string {
	t.Helper()
	var s string
	if err := q.QueryRowContext(bg(), settingsSQL).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSessionLeavesAsItCame: the settings a lock session needs (orphan
// bound, idle_session_timeout, application_name) are in place while a lock
// is held, and a connection goes back to the pool with the settings it
// came with, whatever the path: unlock, a refused try, a semaphore permit,
// a Session, a shared session.
func TestSessionLeavesAsItCame(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		db.SetMaxOpenConns(1) // every statement below runs on the one connection
		db.SetMaxIdleConns(1)
		before := sessionSettings(t, db)
		l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithOrphanBound(4*time.Second), sqllock.WithKeepAlive(0), sqllock.WithApplicationName("leaves-as-it-came"))
		odb := pgtest.Open(t, "pgx", dsn)
		other := sqllock.New(odb, sqllock.WithKeepAlive(0))
		k := sqllock.Int64(81)
		lk, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		during := sessionSettings(t, sqllock.ConnOf(lk))
		if during == before || !strings.Contains(during, "4000") || !strings.Contains(during, "leaves-as-it-came") {
			t.Fatalf("settings while held = %q (before: %q): want the orphan bound's and the application name", during, before)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		if after := sessionSettings(t, db); after != before {
			t.Fatalf("after Unlock the pooled connection has %q, came with %q", after, before)
		}
		// A refused try changes nothing.
		held, err := other.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("TryLock of a held key = %v", err)
		}
		if after := sessionSettings(t, db); after != before {
			t.Fatalf("after a refused TryLock the pooled connection has %q, came with %q", after, before)
		}
		held.Unlock(bg())
		// A semaphore's permit, and a Session.
		p, err := l.Semaphore("leave", 2).Acquire(bg())
		if err != nil {
			t.Fatal(err)
		}
		p.Unlock(bg())
		if after := sessionSettings(t, db); after != before {
			t.Fatalf("after a permit the pooled connection has %q, came with %q", after, before)
		}
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.TryLock(bg(), k); len(got) != 1 || err != nil {
			t.Fatalf("Session.TryLock = %v, %v", got, err)
		}
		if err := s.Close(bg()); err != nil {
			t.Fatal(err)
		}
		if after := sessionSettings(t, db); after != before {
			t.Fatalf("after a Session the pooled connection has %q, came with %q", after, before)
		}
		// A shared session (the default): the settings are applied as it
		// opens, and set back as it goes back to the pool, a while after
		// its last lock.
		sl := sqllock.New(db, sqllock.WithOrphanBound(4*time.Second), sqllock.WithKeepAlive(0), sqllock.WithApplicationName("shared-leaves"))
		slk, err := sl.TryLock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		locks, err := sqllock.Inspect(bg(), odb, nil, k)
		if err != nil || len(locks) != 1 || locks[0].PID != slk.PID() || locks[0].ApplicationName != "shared-leaves" {
			t.Fatalf("Inspect of a lock on a shared session = %+v, %v: want its holder, named shared-leaves", locks, err)
		}
		if err := slk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); sl.Stats().SharedSessions != 0 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if after := sessionSettings(t, db); after != before {
			t.Fatalf("after a shared session the pooled connection has %q, came with %q", after, before)
		}
	})
}

// serverVersion returns the server's server_version_num.
func serverVersion(t *testing.T, db *sql.DB) int {
	t.Helper()
	var v int
	if err := db.QueryRow("SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// setForRole sets a setting for the test role in the test's database only,
// as a DBA or a hosted service would, for the sessions that start after.
func setForRole(t *testing.T, srv *pgtest.Server, dsn, setting string) {
	t.Helper()
	admin := pgtest.Open(t, "pgx", srv.AdminDSNFor(pgtest.DatabaseOf(dsn)))
	var role string
	if err := pgtest.Open(t, "pgx", dsn).QueryRow("SELECT current_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	q := fmt.Sprintf("ALTER ROLE %q IN DATABASE %q SET %s", role, pgtest.DatabaseOf(dsn), setting)
	if _, err := admin.Exec(q); err != nil {
		t.Fatal(err)
	}
}

// TestIdleSessionTimeoutSparesHolders: a role's idle_session_timeout
// (PostgreSQL 14 and later; hosted services set it to reap idle sessions)
// does not take a held lock: a session that holds one is idle by design.
func TestIdleSessionTimeoutSparesHolders(t *testing.T) {
	long(t) // waits through server timeouts on purpose
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		if v := serverVersion(t, db); v < 140000 {
			t.Logf("PostgreSQL %d has no idle_session_timeout: nothing to spare", v)
			return
		}
		setForRole(t, srv, dsn, "idle_session_timeout = '1s'")
		db.SetMaxIdleConns(0) // new sessions, with the setting
		db.SetMaxIdleConns(2)
		l := sqllock.New(db, sqllock.WithKeepAlive(200*time.Millisecond), sqllock.WithOrphanBound(4*time.Second))
		lk, err := l.Lock(bg(), sqllock.Int64(82))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // three idle timeouts
		if err := lk.Err(); err != nil {
			t.Fatalf("a held lock was taken by idle_session_timeout: %v", err)
		}
		if pids := holders(t, pgtest.Open(t, "pgx", dsn), sqllock.Int64(82)); len(pids) != 1 || pids[0] != lk.PID() {
			t.Fatalf("holders = %v, want backend %d", pids, lk.PID())
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatalf("Unlock after 3 s idle = %v", err)
		}
	})
}

// TestLockTimeoutRule: a role's lock_timeout does not end the waits that
// sqllock makes on sessions of its own (Locker.Lock, Session.Lock,
// Semaphore.Acquire): ctx does. Waits inside a transaction (InTx, LockTx)
// are statements of that transaction, and its lock_timeout ends them with
// an error matching ErrNotAcquired.
func TestLockTimeoutRule(t *testing.T) {
	long(t) // waits through server timeouts on purpose
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		setForRole(t, srv, dsn, "lock_timeout = '300ms'")
		db.SetMaxIdleConns(0) // no session from before the setting
		db.SetMaxIdleConns(2)
		holderL := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		k := sqllock.Int64(83)
		hold := func() {
			t.Helper()
			h, err := holderL.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			time.AfterFunc(900*time.Millisecond, func() { h.Unlock(bg()) })
		}
		ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
		defer cancel()
		hold()
		lk, err := l.Lock(ctx, k)
		if err != nil {
			t.Fatalf("Locker.Lock past the role's lock_timeout = %v, want the lock", err)
		}
		lk.Unlock(bg())
		hold()
		s, err := l.Session(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Lock(ctx, k); err != nil {
			t.Fatalf("Session.Lock past the role's lock_timeout = %v, want the lock", err)
		}
		s.Close(bg())
		hold()
		p, err := l.Semaphore("lt", 1).Acquire(ctx)
		if err != nil {
			t.Fatalf("Semaphore.Acquire = %v", err)
		}
		p.Unlock(bg())
		hold()
		start := time.Now()
		err = l.InTx(ctx, k, nil, func(*sql.Tx) error { return nil })
		if !errors.Is(err, sqllock.ErrNotAcquired) || time.Since(start) > 5*time.Second {
			t.Fatalf("InTx under a 300ms lock_timeout = %v after %v, want ErrNotAcquired from the 300ms lock_timeout (without it, the holder releases at 900ms and InTx succeeds)", err, time.Since(start))
		}
		waitFree(t, db, k, 5*time.Second)
	})
}

// TestWaitingSessionsNamed: with WithApplicationName, a Locker's waiting
// sessions carry the name, as its holding ones do (pg_stat_activity and
// Inspect tell whose waiters they are); a session whose DSN names it
// keeps that name while it waits.
func TestWaitingSessionsNamed(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		for _, tc := range []struct {
			name string
			db   *sql.DB
			want string
		}{
			{"option", db, "svc-waiters"},
			{"dsn", pgtest.Open(t, driverOf(db), withDSNParam(dsn, "application_name", "from-dsn")), "from-dsn"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				k := sqllock.Int64(96)
				if tc.name == "dsn" {
					k = sqllock.Int64(97)
				}
				holder, err := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0)).Lock(bg(), k)
				if err != nil {
					t.Fatal(err)
				}
				l := sqllock.New(tc.db, sqllock.WithKeepAlive(0), sqllock.WithApplicationName("svc-waiters"))
				const waiters = 5
				var wg sync.WaitGroup
				got := make(chan *sqllock.Lock, waiters)
				for range waiters {
					wg.Add(1)
					go func() {
						defer wg.Done()
						lk, err := l.Lock(bg(), k)
						if err != nil {
							t.Error(err)
							return
						}
						got <- lk
					}()
				}
				testkit.WaitWaiters(t, db, k, 1)
				locks, err := sqllock.Inspect(bg(), db, nil, k)
				if err != nil {
					t.Fatal(err)
				}
				waiting := 0
				for _, h := range locks {
					if h.Granted {
						continue
					}
					waiting++
					if h.ApplicationName != tc.want {
						t.Errorf("a waiting session (pid %d) is named %q, want %q", h.PID, h.ApplicationName, tc.want)
					}
				}
				if waiting == 0 {
					t.Fatal("no waiting session seen")
				}
				holder.Unlock(bg())
				for range waiters {
					lk := <-got
					if hs, err := sqllock.Inspect(bg(), db, nil, k); err != nil || len(hs) == 0 || !hs[0].Granted || hs[0].ApplicationName != tc.want {
						t.Errorf("the holder is %+v (%v), want one named %q", hs, err, tc.want)
					}
					lk.Unlock(bg())
				}
				waitGroup(t, &wg, hangCeiling)
			})
		}
	})
}

// withDSNParam returns dsn (a URL or key=value pairs) with one more
// parameter.
func withDSNParam(dsn, name, value string) string {
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		q := u.Query()
		q.Set(name, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + name + "=" + value
}
