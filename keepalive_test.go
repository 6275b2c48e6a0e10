package sqllock_test

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKeepAliveNotBlockedBySessionWait: a Session of the Locker waiting in
// Session.Lock must not stop the keep-alive from reporting another lock of
// the same Locker lost, nor make Session.Err wait.
func TestKeepAliveNotBlockedBySessionWait(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const keepAlive = 200 * time.Millisecond
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(keepAlive))
		a, b := sqllock.Int64(101), sqllock.Int64(102)
		lkA, err := l.Lock(bg(), a)
		if err != nil {
			t.Fatal(err)
		}
		other := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		lkB, err := other.Lock(bg(), b)
		if err != nil {
			t.Fatal(err)
		}
		// A lock of l on a session of its own, which A's loss leaves held:
		// the keep-alive has it to watch after the loss, during the wait.
		kept, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer kept.Close(bg())
		if err := kept.Lock(bg(), sqllock.Int64(103)); err != nil {
			t.Fatal(err)
		}
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		waitDone := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(bg(), 8*time.Second)
			defer cancel()
			waitDone <- s.Lock(ctx, b)
		}()
		testkit.WaitWaiters(t, db, b, 1)

		checks := l.Stats().KeepAliveChecks
		start := time.Now()
		terminate(t, srv, lkA.PID())
		select {
		case <-lkA.Done():
		case <-time.After(2*keepAlive + 2*time.Second):
			t.Fatalf("lock A's loss not reported within %v while a Session waits", 2*keepAlive+2*time.Second)
		}
		t.Logf("loss reported after %v while a Session waited", time.Since(start))
		if !errors.Is(lkA.Err(), sqllock.ErrLockLost) {
			t.Fatalf("A.Err() = %v, want ErrLockLost", lkA.Err())
		}
		// (The loss may have been found by a check that was already under
		// way, counted before: the next ones, for the kept lock, must run
		// too, while the Session still waits.)
		for until := time.Now().Add(5 * keepAlive); l.Stats().KeepAliveChecks <= checks && time.Now().Before(until); {
			time.Sleep(keepAlive / 10)
		}
		if got := l.Stats().KeepAliveChecks; got <= checks {
			t.Fatalf("KeepAliveChecks = %d, was %d: no check ran during the wait", got, checks)
		}
		errc := make(chan error, 1)
		go func() { errc <- s.Err() }()
		select {
		case err := <-errc:
			if err != nil {
				t.Fatalf("Session.Err() = %v during its wait, want nil", err)
			}
		case <-time.After(time.Second):
			t.Fatal("Session.Err() blocked during Session.Lock's wait")
		}
		if held := s.Held(); len(held) != 0 {
			t.Fatalf("Session.Held() = %v during the wait", held)
		}
		if err := lkB.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		if err := <-waitDone; err != nil {
			t.Fatalf("Session.Lock after the holder left = %v", err)
		}
		if err := s.Close(bg()); err != nil {
			t.Fatal(err)
		}
		if err := kept.Close(bg()); err != nil {
			t.Fatal(err)
		}
		lkA.Unlock(bg())
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestKeepAliveBusyPoolIsNotLoss: a pool whose every connection is taken by
// the Locker's own waiters (each the first of its queue, for a key another
// Locker holds) is not evidence that the holder's lock is lost.
func TestKeepAliveBusyPoolIsNotLoss(t *testing.T) {
	long(t)
	const keepAlive = 100 * time.Millisecond
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		t.Run("waiters take the pool", func(t *testing.T) {
			db.SetMaxOpenConns(20)
			defer db.SetMaxOpenConns(0)
			var logs syncBuffer
			l := sqllock.New(db, sqllock.WithKeepAlive(keepAlive),
				sqllock.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))))
			k := sqllock.Int64(201)
			const waiters = 60
			other := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
			var held []*sqllock.Lock
			for i := 0; i < waiters; i++ {
				lk, err := other.Lock(bg(), sqllock.Pair(201, int32(i)))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, lk)
			}
			ctx, cancel := context.WithCancel(bg())
			defer cancel()
			var wg sync.WaitGroup
			var waitErrs sync.Map
			holding := make(chan struct{})
			err := l.Do(bg(), k, func(fctx context.Context) error {
				for i := 0; i < waiters; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						lk, err := l.Lock(ctx, sqllock.Pair(201, int32(i)))
						if err != nil {
							waitErrs.Store(i, err)
							return
						}
						if err := lk.Unlock(bg()); err != nil {
							waitErrs.Store(i, err)
						}
					}()
				}
				close(holding)
				select {
				case <-fctx.Done():
					return context.Cause(fctx)
				case <-time.After(30 * keepAlive):
					for _, lk := range held {
						lk.Unlock(bg())
					}
					return nil
				}
			})
			<-holding
			if err != nil {
				t.Fatalf("Do() = %v: the holder was told its lock was lost while the pool was busy", err)
			}
			waitGroup(t, &wg, hangCeiling)
			waitErrs.Range(func(k, v any) bool {
				t.Errorf("waiter %v: %v", k, v)
				return true
			})
			st := l.Stats()
			t.Logf("Stats after the busy pool: %+v", st)
			if st.Lost != 0 {
				t.Fatalf("Stats().Lost = %d, want 0", st.Lost)
			}
			if st.KeepAliveSkipped == 0 {
				t.Fatalf("Stats().KeepAliveSkipped = 0: the pool was never full?")
			}
			if !strings.Contains(logs.String(), "keep-alive skipped") {
				t.Fatalf("no warning about the full pool in the log: %q", logs.String())
			}
		})
		t.Run("pool of one", func(t *testing.T) {
			db.SetMaxOpenConns(1)
			defer db.SetMaxOpenConns(0)
			l := sqllock.New(db, sqllock.WithKeepAlive(keepAlive))
			lk, err := l.Lock(bg(), sqllock.Int64(202))
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-lk.Done():
				t.Fatalf("lock reported lost with a pool of one: %v", lk.Err())
			case <-time.After(15 * keepAlive):
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			if st := l.Stats(); st.Lost != 0 || st.KeepAliveSkipped == 0 {
				t.Fatalf("Stats() = %+v, want Lost 0 and KeepAliveSkipped > 0", st)
			}
			// The skipped checks never kept the only connection from the
			// caller: the next lock comes (a connection kept would keep
			// it waiting for good; 10 s, for a loaded machine).
			start := time.Now()
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			lk, err = l.TryLock(ctx, sqllock.Int64(202))
			cancel()
			if err != nil {
				t.Fatalf("TryLock after Unlock on a pool of one = %v after %v", err, time.Since(start))
			}
			t.Logf("TryLock after Unlock on a pool of one: %v", time.Since(start))
			lk.Unlock(bg())
		})
	})
}

// TestUnlockAfterTerminateIsLost: a session terminated before the keep-alive
// noticed makes Unlock return an error matching ErrLockLost, not a bare
// driver error.
func TestUnlockAfterTerminateIsLost(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		k := sqllock.Int64(301)
		lk, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		terminate(t, srv, lk.PID())
		waitFree(t, db, k, 5*time.Second)
		err = lk.Unlock(bg())
		if !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Unlock() after the session was terminated = %v, want ErrLockLost", err)
		}
		if !errors.Is(lk.Err(), sqllock.ErrLockLost) {
			t.Fatalf("Err() = %v, want ErrLockLost", lk.Err())
		}
		if st := l.Stats(); st.Lost != 1 || st.Held != 0 {
			t.Fatalf("Stats() = %+v, want Lost 1, Held 0", st)
		}
		// Do reports it the same way.
		err = l.Do(bg(), k, func(ctx context.Context) error {
			locks, err := sqllock.Inspect(ctx, db, nil, k)
			if err != nil || len(locks) != 1 {
				return errors.Join(errors.New("lock not visible"), err)
			}
			terminate(t, srv, locks[0].PID)
			waitFree(t, db, k, 5*time.Second)
			return nil
		})
		if !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Do() = %v, want ErrLockLost", err)
		}
	})
}

// TestOrphanBoundSettings: a lock's session carries the orphan bound's TCP
// settings, and none when the bound is off.
func TestOrphanBoundSettings(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		for _, tc := range []struct {
			db        *sql.DB
			opt       sqllock.Option
			idle, utm string
		}{
			{db, sqllock.WithOrphanBound(sqllock.DefaultOrphanBound), "10", "30000"},
			{pgtest.Open(t, "pgx", dsn), sqllock.WithOrphanBound(0), "", "0"}, // the server's own
		} {
			l := sqllock.New(tc.db, tc.opt, sqllock.WithDedicatedSessions())
			lk, err := l.Lock(bg(), sqllock.Int64(55))
			if err != nil {
				t.Fatal(err)
			}
			var idle, utm string
			if err := sqllock.ConnOf(lk).QueryRowContext(bg(), "SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_user_timeout')").Scan(&idle, &utm); err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			if (tc.idle != "" && idle != tc.idle) || (tc.idle == "" && idle == "10") || utm != tc.utm {
				t.Errorf("tcp_keepalives_idle %s, tcp_user_timeout %s; want %s and %s", idle, utm, tc.idle, tc.utm)
			}
		}
	})
}

// hiddenValidity is a connector whose connections hide the driver's
// validity from database/sql (as some driver wrappers do), so that a
// connection the driver closed stays in the pool.
type hiddenValidity struct{ driver.Connector }

func (h hiddenValidity) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := h.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return hiddenConn{c.(plainConn)}, nil
}

// plainConn is what hiddenConn passes on of the driver's connection.
type plainConn interface {
	driver.Conn
	driver.QueryerContext
	driver.ExecerContext
}

type hiddenConn struct{ plainConn }

// keepAliveEvents counts the keep-alive checks, and records those that
// failed on a bad connection.
type keepAliveEvents struct {
	mu   sync.Mutex
	errs []error
	n    int
}

func (o *keepAliveEvents) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	return nil
}

func (o *keepAliveEvents) Event(_ context.Context, e sqllock.Event) {
	if e.Kind != sqllock.EventKeepAlive {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n++
	if errors.Is(e.Err, driver.ErrBadConn) {
		o.errs = append(o.errs, e.Err) // a loaded machine's slow connection setup is another matter
	}
}

// TestKeepAliveSkipsClosedPoolConn: a pooled connection that the driver
// closed (pgx, after a statement outlived its context) and that
// database/sql hands out again, because a wrapper hides its validity, is
// no evidence against the server: the keep-alive check runs again on
// another connection, and reports no error.
func TestKeepAliveSkipsClosedPoolConn(t *testing.T) {
	t.Parallel()
	db := sql.OpenDB(hiddenValidity{pgxConnector(t)})
	t.Cleanup(func() { db.Close() })
	events := &keepAliveEvents{}
	l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(100*time.Millisecond), sqllock.WithObserver(events))
	lk, err := l.Lock(bg(), sqllock.Int64(91))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(bg())
	// The pool's idle connection, closed by pgx under the pool's nose: a
	// statement that outlives its context.
	c, err := db.Conn(bg())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg(), 20*time.Millisecond)
	_, err = c.ExecContext(ctx, "SELECT pg_sleep(1)")
	cancel()
	if err == nil {
		t.Fatal("pg_sleep(1) under a 20 ms context returned no error")
	}
	c.Close()
	if st := db.Stats(); st.Idle != 1 {
		t.Fatalf("the pool keeps %d idle connections, want the closed one", st.Idle)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		events.mu.Lock()
		n, errs := events.n, append([]error(nil), events.errs...)
		events.mu.Unlock()
		if len(errs) > 0 {
			t.Fatalf("a keep-alive check reported %v", errs[0])
		}
		if n >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keep-alive checks in 5 s", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := lk.Err(); err != nil {
		t.Fatalf("Err() = %v", err)
	}
}

// slowDial is a connector whose connections after the first take d to set
// up (a loaded server), giving up when the caller's context ends.
type slowDial struct {
	driver.Connector
	d     time.Duration
	dials atomic.Int64
}

func (s *slowDial) Connect(ctx context.Context) (driver.Conn, error) {
	if s.dials.Add(1) > 1 {
		select {
		case <-time.After(s.d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.Connector.Connect(ctx)
}

// TestKeepAliveSlowConnectionSetup: when setting up a connection takes
// longer than a keep-alive check may (1 s), the setup goes on after its
// check gave up, and the next check uses it; a check still without a
// connection at half its time asks on the lock's own session (user code
// cannot reach it) instead. The lock is not reported lost, however long
// the setups take: a check that aborted its own setup never got a
// connection, and two of them reported the lock lost; so did two checks
// that waited for one setup that took longer than both (a loaded machine).
func TestKeepAliveSlowConnectionSetup(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{1500 * time.Millisecond, 10 * time.Second} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			keepAliveSlowSetup(t, d)
		})
	}
}

// keepAliveSlowSetup runs TestKeepAliveSlowConnectionSetup with setups
// that take d.
func keepAliveSlowSetup(t *testing.T, d time.Duration) {
	db := sql.OpenDB(&slowDial{Connector: pgxConnector(t), d: d})
	t.Cleanup(func() { db.Close() })
	l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(200*time.Millisecond))
	lk, err := l.Lock(bg(), sqllock.Int64(92)) // the first connection: no delay
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(bg())
	deadline := time.Now().Add(8 * time.Second)
	for l.Stats().KeepAliveChecks < 3 {
		if err := lk.Err(); err != nil {
			t.Fatalf("the keep-alive reported the lock lost while its connection was set up: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keep-alive checks in 8 s", l.Stats().KeepAliveChecks)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := lk.Err(); err != nil {
		t.Fatalf("Err() = %v", err)
	}
}

// pgxConnector returns a pgx connector to a database of t's own, for a
// pool built on a wrapper of it.
func pgxConnector(t *testing.T) driver.Connector {
	t.Helper()
	dsn := pgtest.Start(t).NewDatabase(t)
	probe := pgtest.Open(t, "pgx", dsn)
	inner, err := probe.Driver().(driver.DriverContext).OpenConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return inner
}

// TestKeepAliveHungIdleConn: one idle pooled connection whose backend
// stopped answering (stopped with SIGSTOP: its kernel still answers TCP,
// as with a half-open connection) says nothing of the server. The
// keep-alive asks again on another connection, and a held lock and a
// Session are not reported lost, whatever the driver does with a read
// whose context ended (lib/pq goes on reading).
func TestKeepAliveHungIdleConn(t *testing.T) {
	t.Parallel()
	const keepAlive = 100 * time.Millisecond
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(keepAlive))
		lk, err := l.Lock(bg(), sqllock.Int64(93))
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Unlock(bg())
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(bg())
		if _, err := s.TryLock(bg(), sqllock.Int64(94)); err != nil {
			t.Fatal(err)
		}
		// The pool's one idle connection: the next check's. (A check under
		// way may have opened another meanwhile: the pool is trimmed to
		// one, and looked at again.)
		var pid int
		for attempt := 1; ; attempt++ {
			c, err := db.Conn(bg())
			if err != nil {
				t.Fatal(err)
			}
			pid = backendPID(t, c)
			c.Close()
			st := db.Stats()
			if st.Idle == 1 {
				break
			}
			if attempt == 50 {
				t.Fatalf("the pool keeps %d idle connections, want 1", st.Idle)
			}
			db.SetMaxIdleConns(1)
			db.SetMaxIdleConns(2)
			time.Sleep(10 * time.Millisecond)
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				syscall.Kill(pid, syscall.SIGCONT)
			}
		}
		defer resume()
		// Several checks' worth: each finds the hung connection busy with
		// the first one's query, or takes it and asks again elsewhere.
		time.Sleep(20*keepAlive + 2*time.Second)
		if err := lk.Err(); err != nil {
			t.Errorf("Lock.Err() = %v, want nil (the server holds it)", err)
		}
		if err := s.Err(); err != nil {
			t.Errorf("Session.Err() = %v, want nil (the server holds it)", err)
		}
		if st := l.Stats(); st.Lost != 0 {
			t.Errorf("Stats().Lost = %d, want 0", st.Lost)
		}
		if got := holders(t, pgtest.Open(t, "pgx", dsn), sqllock.Int64(93)); len(got) != 1 || got[0] != lk.PID() {
			t.Errorf("holders of 93 = %v, want [%d]", got, lk.PID())
		}
		resume()
	})
}
