package sqllock_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestLeaseKeepsIdleHolders: a live holder that sends nothing keeps its
// locks past the lease (the keep-alive touches its sessions: a shared
// session, a session of its own, a Session), and a session handed to the
// caller (Session.Conn) is not leased any more: the server
// would never end it for being idle.
func TestLeaseKeepsIdleHolders(t *testing.T) {
	long(t)
	t.Parallel()
	// A bound of 10 s: the keep-alive's checks then have 2 s each. At the
	// least bound (3 s), whose checks have 1 s, a loaded machine (a Docker
	// server beside the root package's tests) missed two in a row, and the
	// holder was told its lock lost, as it must be when it cannot reach
	// the server: that is the keep-alive's doing, not the lease's, which
	// this test is about.
	const bound = 10 * time.Second
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		shared := sqllock.New(db, sqllock.WithOrphanBound(bound))
		dedicated := sqllock.New(db, sqllock.WithOrphanBound(bound), sqllock.WithDedicatedSessions())
		a, err := shared.Lock(bg(), sqllock.Int64(9600))
		if err != nil {
			t.Fatal(err)
		}
		b, err := dedicated.Lock(bg(), sqllock.Int64(9601))
		if err != nil {
			t.Fatal(err)
		}
		c, err := dedicated.Session(bg()) // its session handed out below
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Lock(bg(), sqllock.Int64(9602)); err != nil {
			t.Fatal(err)
		}
		s, err := shared.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Lock(bg(), sqllock.Int64(9603)); err != nil {
			t.Fatal(err)
		}
		var version int
		if err := c.Conn().QueryRowContext(bg(), "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
			t.Fatal(err)
		}
		if version >= 140000 { // idle_session_timeout, and so the lease, came with PostgreSQL 14
			var timeout string
			if err := c.Conn().QueryRowContext(bg(), "SHOW idle_session_timeout").Scan(&timeout); err != nil {
				t.Fatal(err)
			}
			if timeout != "0" {
				t.Errorf("idle_session_timeout of a session handed out by Session.Conn() = %q, want 0", timeout)
			}
		}
		time.Sleep(2*bound + time.Second)
		if err := c.Err(); err != nil || len(holders(t, db, sqllock.Int64(9602))) != 1 {
			t.Errorf("handed-out Session idle for twice the lease: Err() = %v", err)
		}
		if err := c.Close(bg()); err != nil {
			t.Errorf("handed-out Session: Close() = %v", err)
		}
		for i, lk := range []*sqllock.Lock{a, b} {
			if err := lk.Err(); err != nil {
				t.Errorf("lock %d idle for twice the lease: Err() = %v", i, err)
			}
			if len(holders(t, db, lk.Key())) != 1 {
				t.Errorf("lock %d idle for twice the lease: not held on the server", i)
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Errorf("lock %d: Unlock() = %v", i, err)
			}
		}
		if err := s.Err(); err != nil || len(holders(t, db, sqllock.Int64(9603))) != 1 {
			t.Errorf("Session idle for twice the lease: Err() = %v", err)
		}
		if err := s.Close(bg()); err != nil {
			t.Fatal(err)
		}
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestLeaseIdleWhenTold: a statement's outcome is recorded on the lease
// before its caller hears it. A holder told "done" and stopped right
// after (SIGSTOP) must find, resumed, a lease that counts from that
// statement, never one still marked busy (a busy lease never expires, and
// Err would call a lock held that the server has already freed).
func TestLeaseIdleWhenTold(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		var version int
		if err := db.QueryRow("SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
			t.Fatal(err)
		}
		opts := []sqllock.Option{sqllock.WithOrphanBound(time.Minute), sqllock.WithKeepAlive(10 * time.Second)} // no touch within the test
		for _, dedicated := range []bool{false, true} {
			o := opts
			if dedicated {
				o = append(o, sqllock.WithDedicatedSessions())
			}
			l := sqllock.New(db, o...)
			lk, err := l.Lock(bg(), sqllock.Int64(9610))
			if err != nil {
				t.Fatal(err)
			}
			if busy := sqllock.LeaseBusy(lk); version < 140000 {
				if busy != -1 {
					t.Errorf("dedicated %v: a lease on PostgreSQL %d, which has no idle_session_timeout", dedicated, version)
				}
			} else {
				// Each lock's first Token runs a statement (later ones are
				// cached); on a shared session, the lock and its neighbour
				// share one lease.
				for i := 0; i < 200; i++ {
					m, err := l.Lock(bg(), sqllock.Int64(9611))
					if err != nil {
						t.Fatal(err)
					}
					if busy := sqllock.LeaseBusy(m); busy != 0 {
						t.Errorf("dedicated %v: Lock %d returned with the lease counting %d statements in flight", dedicated, i, busy)
					}
					if _, err := m.Token(bg()); err != nil {
						t.Fatal(err)
					}
					if busy := sqllock.LeaseBusy(m); busy != 0 {
						t.Errorf("dedicated %v: Token %d returned with the lease counting %d statements in flight", dedicated, i, busy)
					}
					if err := m.Unlock(bg()); err != nil {
						t.Fatal(err)
					}
					if t.Failed() {
						break
					}
				}
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// TestSemaphorePermitLease: a permit granted by the semaphore's first try
// is leased from that statement, like any lock. In a process older than
// the orphan bound, a permit whose lease began at the process's start was
// reported lost at the keep-alive's first tick.
func TestSemaphorePermitLease(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	var v int
	if err := db.QueryRow("SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v < 140000 {
		pgtest.Unavailable(t, "PostgreSQL 14 or later (the lease needs idle_session_timeout)", nil)
	}
	const bound = sqllock.MinOrphanBound
	if wait := bound + time.Second - time.Since(processStart); wait > 0 {
		time.Sleep(wait) // the process is older than the bound
	}
	l := sqllock.New(db, sqllock.WithOrphanBound(bound), sqllock.WithKeepAlive(200*time.Millisecond))
	p, err := l.Semaphore("leased", 2).TryAcquire(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Unlock(bg())
	time.Sleep(time.Second) // five keep-alive ticks
	if err := p.Err(); err != nil {
		t.Fatalf("a permit a second old: Err() = %v", err)
	}
	if pids := holders(t, db, p.Key()); len(pids) != 1 || pids[0] != p.PID() {
		t.Fatalf("the permit's key is held by %v, want backend %d", pids, p.PID())
	}
}
