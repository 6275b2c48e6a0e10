package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestGrantedAsTimeoutFires: PostgreSQL's lock_timeout can fire as a lock
// is granted; the wait statement then fails with 55P03 and the session
// keeps the lock. To make it happen on demand, the waiter's backend is
// stopped (SIGSTOP) while it waits, the holder releases (the server grants
// the stopped waiter the lock), the wait's lock_timeout passes, and the
// backend is resumed. Every kind of wait must then come out right: the
// caller gets the lock, and no key stays held once it is unlocked (a retry
// would take the key a second time, re-entrantly; "not granted" would send
// a connection that holds it back to the pool).
func TestGrantedAsTimeoutFires(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	if !srv.Local() {
		pgtest.Unavailable(t, "a server whose backends this process can stop", errors.New("the test server is not local"))
	}
	t.Run("server", func(t *testing.T) {
		db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
		ctx := bg()
		holder := conn(t, db)
		waiter := conn(t, db)
		k := sqllock.Int64(41)
		if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_lock(41)"); err != nil {
			t.Fatal(err)
		}
		// Long enough for a loaded machine to see the wait before its
		// lock_timeout ends it.
		if _, err := waiter.ExecContext(ctx, "SET lock_timeout = '3s'"); err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			var ok bool
			errc <- waiter.QueryRowContext(ctx, "SELECT pg_advisory_lock(41) IS NOT NULL").Scan(&ok)
		}()
		grantWhileStopped(t, db, k, func() {
			if _, err := holder.ExecContext(ctx, "SELECT pg_advisory_unlock(41)"); err != nil {
				t.Error(err)
			}
		}, 3300*time.Millisecond)
		err := <-errc
		var st interface{ SQLState() string }
		if !errors.As(err, &st) || st.SQLState() != "55P03" {
			t.Fatalf("the resumed wait returned %v, want 55P03 (lock_timeout)", err)
		}
		var n int
		if err := waiter.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("the session that got 55P03 holds %d advisory locks, want 1 (the grant kept)", n)
		}
		t.Logf("the wait failed with %v, and its session holds the lock", err)
		waiter.ExecContext(ctx, "SELECT pg_advisory_unlock_all()")
	})

	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			// open returns a Locker on a database of its own, whose
			// sessions have deadlock_timeout dt (sliced waits last half
			// of it), and a log of its messages.
			open := func(t *testing.T, dt time.Duration) (*sqllock.Locker, *sql.DB, *messages) {
				dsn := srv.NewDatabase(t)
				setDeadlockTimeout(t, srv, dsn, dt)
				db := pgtest.Open(t, drv, dsn)
				db.SetMaxIdleConns(10) // a leaked lock stays in the pool, for the checks to find
				log := &messages{}
				return sqllock.New(db, sqllock.WithLogger(slog.New(log))), db, log
			}
			const late = "sqllock: granted as the wait's lock_timeout fired"

			t.Run("sliced wait", func(t *testing.T) {
				t.Parallel()
				l, db, log := open(t, 200*time.Millisecond) // slices of 100 ms
				k := sqllock.Int64(42)
				holder := takenBy(t, db, k)
				got := make(chan result, 1)
				go func() { lk, err := l.Lock(bg(), k); got <- result{lk, err} }()
				grantWhileStopped(t, db, k, holder, 300*time.Millisecond)
				r := <-got
				if r.err != nil {
					t.Fatalf("Lock() = %v, want the lock", r.err)
				}
				unlockAndCheck(t, db, r.lk, k)
				if !log.has(late) {
					t.Fatalf("the late grant was not noticed; log: %v", log.all())
				}
			})

			t.Run("semaphore", func(t *testing.T) {
				t.Parallel()
				l, db, log := open(t, 200*time.Millisecond)
				first, err := l.Semaphore("late", 1).Acquire(bg())
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan result, 1)
				go func() { lk, err := l.Semaphore("late", 1).Acquire(bg()); got <- result{lk, err} }()
				grantWhileStopped(t, db, first.Key(), func() {
					if err := first.Unlock(bg()); err != nil {
						t.Error(err)
					}
				}, 300*time.Millisecond)
				r := <-got
				if r.err != nil {
					t.Fatalf("Acquire() = %v, want the permit", r.err)
				}
				unlockAndCheck(t, db, r.lk, first.Key())
				if !log.has(late) {
					t.Fatalf("the late grant was not noticed; log: %v", log.all())
				}
			})

			// With a deadline shorter than a slice, the deadline is the
			// wait's lock_timeout (a little before it): the backend is
			// resumed once that has passed, before the deadline itself. (10
			// s, shorter than the 15 s slice: a loaded machine can take
			// seconds to set the wait up, and the wait must be caught
			// stopped in it before the deadline: it is not waited again.)
			deadlineTrial := func(t *testing.T, db *sql.DB, k sqllock.Key, holder func(), wait func(ctx context.Context) error) {
				ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
				defer cancel()
				dl, _ := ctx.Deadline()
				errc := make(chan error, 1)
				go func() { errc <- wait(ctx) }()
				grantWhileStopped(t, db, k, holder, time.Until(dl)-70*time.Millisecond)
				if err := <-errc; err != nil && !errors.Is(err, sqllock.ErrNotAcquired) {
					t.Fatalf("the wait returned %v", err)
				}
			}

			t.Run("deadline", func(t *testing.T) {
				t.Parallel()
				l, db, log := open(t, 30*time.Second)
				k := sqllock.Int64(43)
				var lk *sqllock.Lock
				deadlineTrial(t, db, k, takenBy(t, db, k), func(ctx context.Context) (err error) {
					lk, err = l.Lock(ctx, k)
					return err
				})
				t.Logf("Lock: got the lock %v, the late grant noticed %v", lk != nil, log.has(late))
				if lk != nil {
					unlockAndCheck(t, db, lk, k)
				} else {
					waitFree(t, db, k, 5*time.Second) // a discarded session ends
				}
			})

			t.Run("session", func(t *testing.T) {
				t.Parallel()
				l, db, log := open(t, 30*time.Second)
				k := sqllock.Int64(44)
				s, err := l.Session(bg())
				if err != nil {
					t.Fatal(err)
				}
				var lerr error
				deadlineTrial(t, db, k, takenBy(t, db, k), func(ctx context.Context) error {
					lerr = s.Lock(ctx, k)
					return lerr
				})
				held := slices.Contains(s.Held(), k)
				onServer := slices.Contains(holders(t, db, k), s.PID())
				t.Logf("Session.Lock = %v, the late grant noticed %v", lerr, log.has(late))
				if s.Err() == nil && held != onServer {
					t.Fatalf("the Session says it holds %v: %v; the server says its session does: %v", k, held, onServer)
				}
				if err := s.Close(bg()); err != nil && s.Err() == nil {
					t.Fatal(err)
				}
				waitFree(t, db, k, 5*time.Second)
			})
		})
	}
}

type result struct {
	lk  *sqllock.Lock
	err error
}

// conn returns a connection of db for t's life.
func conn(t *testing.T, db *sql.DB) *sql.Conn {
	t.Helper()
	c, err := db.Conn(bg())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// takenBy takes k on a connection of db of its own, and returns what
// releases it.
func takenBy(t *testing.T, db *sql.DB, k sqllock.Key) func() {
	t.Helper()
	c := conn(t, db)
	v, _ := k.Int64()
	if _, err := c.ExecContext(bg(), "SELECT pg_advisory_lock($1)", v); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := c.ExecContext(bg(), "SELECT pg_advisory_unlock($1)", v); err != nil {
			t.Error(err)
		}
	}
}

// grantWhileStopped stops the backend that waits for k, calls release
// (whose unlock grants that backend the lock), waits until the server
// shows it granted, and resumes the backend after pause, by which time
// its wait's lock_timeout has passed.
func grantWhileStopped(t *testing.T, db *sql.DB, k sqllock.Key, release func(), pause time.Duration) {
	t.Helper()
	// The ceilings only end a test that never gets there: a loaded
	// machine takes seconds to set a wait up, and a sliced wait can be
	// stopped between two slices many times before it is stopped in one.
	const ceiling = time.Minute
	waiter := func() int { return lockWaiterPID(t, db, k) }
	start := time.Now()
	pid, seen, between := 0, 0, 0
	for {
		if time.Since(start) > ceiling {
			t.Fatalf("no session stopped while it waits for %v in %v (seen waiting %d times, stopped between two slices %d times)", k, ceiling, seen, between)
		}
		if pid = waiter(); pid == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		seen++
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("stop backend %d: %v", pid, err)
		}
		if waiter() == pid {
			break // stopped in its wait (not between two slices)
		}
		between++
		syscall.Kill(pid, syscall.SIGCONT)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	stopped := time.Now()
	release()
	for !slices.Contains(holders(t, db, k), pid) {
		if time.Since(stopped) > ceiling {
			t.Fatalf("the stopped backend %d was not granted %v in %v", pid, k, ceiling)
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(time.Until(stopped.Add(pause)))
	resume()
}

// lockWaiterPID returns the pid that waits for k in the server's lock
// manager (not a waiter in k's line that holds a ticket and waits for
// another), or 0.
func lockWaiterPID(t *testing.T, db *sql.DB, k sqllock.Key) int {
	t.Helper()
	classid, objid, objsubid := int64(0), int64(0), 1
	if c, id, ok := k.Pair(); ok {
		classid, objid, objsubid = int64(uint32(c)), int64(uint32(id)), 2
	} else {
		v, _ := k.Int64()
		classid, objid = int64(uint64(v)>>32), int64(uint32(v))
	}
	var pid int
	err := db.QueryRowContext(bg(), `SELECT coalesce(min(pid), 0) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
 AND classid::int8 = $1 AND objid::int8 = $2 AND objsubid = $3`, classid, objid, objsubid).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// unlockAndCheck unlocks lk, which must be a lock of k, and fails t if
// anyone still holds k, or any other advisory lock of db's database.
func unlockAndCheck(t *testing.T, db *sql.DB, lk *sqllock.Lock, k sqllock.Key) {
	t.Helper()
	if lk.Key() != k {
		t.Fatalf("got a lock of %v, want %v", lk.Key(), k)
	}
	if err := lk.Unlock(bg()); err != nil {
		t.Fatalf("Unlock() = %v", err)
	}
	if h := holders(t, db, k); len(h) != 0 {
		t.Fatalf("%v is still held by %v after its Unlock", k, h)
	}
	if n := advisoryCount(t, db); n != 0 {
		t.Fatalf("%d advisory locks held after the Unlock of %v", n, k)
	}
}

// messages is a slog.Handler that keeps the messages it is given.
type messages struct {
	mu   sync.Mutex
	msgs []string
}

func (m *messages) Enabled(context.Context, slog.Level) bool { return true }
func (m *messages) Handle(_ context.Context, r slog.Record) error {
	m.mu.Lock()
	m.msgs = append(m.msgs, r.Message)
	m.mu.Unlock()
	return nil
}
func (m *messages) WithAttrs([]slog.Attr) slog.Handler { return m }
func (m *messages) WithGroup(string) slog.Handler      { return m }

func (m *messages) has(msg string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.msgs, msg)
}

func (m *messages) all() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.msgs, "; ")
}
