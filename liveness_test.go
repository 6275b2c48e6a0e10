package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// terminate ends backend pid from a superuser session.
func terminate(t testing.TB, srv *pgtest.Server, pid int) {
	t.Helper()
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var ok bool
	if err := admin.QueryRow("SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
	}
}

func TestLostLockIsReported(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const keepAlive = 100 * time.Millisecond
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(keepAlive))
		lk, err := l.Lock(bg(), sqllock.Int64(5))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		terminate(t, srv, lk.PID())
		select {
		case <-lk.Done():
		case <-time.After(2*keepAlive + 3*time.Second):
			t.Fatal("Done() not closed after the backend was terminated")
		}
		t.Logf("loss reported after %v", time.Since(start))
		if time.Since(start) > 2*keepAlive+3*time.Second { // scheduling on a loaded quick run: seconds
			t.Errorf("loss reported after %v, want within 2× keep-alive (%v) plus scheduling", time.Since(start), 2*keepAlive)
		}
		if err := lk.Err(); !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Err() = %v, want ErrLockLost", err)
		}
		// No other session took the pid: the session ended, or was ending
		// as the check ran (a terminated backend releases its locks a
		// moment before it leaves pg_stat_activity).
		if msg := lk.Err().Error(); strings.Contains(msg, "reused") || !strings.Contains(msg, "ended") && !strings.Contains(msg, "its session ending") {
			t.Fatalf("Err() = %q, want its session ended or ending (and no word of a reused pid)", msg)
		}
		if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Unlock() of a lost lock = %v, want ErrLockLost", err)
		}
		if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrReleased) {
			t.Fatalf("second Unlock() = %v, want ErrReleased", err)
		}
		if st := l.Stats(); st.Lost != 1 || st.Held != 0 {
			t.Fatalf("Stats() = %+v", st)
		}
		// Do cancels fn's context when the lock is lost.
		err = l.Do(bg(), sqllock.Int64(6), func(ctx context.Context) error {
			locks, err := sqllock.Inspect(ctx, db, nil, sqllock.Int64(6))
			if err != nil || len(locks) != 1 {
				return errors.Join(errors.New("lock not visible"), err)
			}
			terminate(t, srv, locks[0].PID)
			select {
			case <-ctx.Done():
				if !errors.Is(context.Cause(ctx), sqllock.ErrLockLost) {
					t.Errorf("fn's context cause = %v, want ErrLockLost", context.Cause(ctx))
				}
				return ctx.Err()
			case <-time.After(5 * time.Second):
				return errors.New("fn's context was not cancelled")
			}
		})
		if !errors.Is(err, sqllock.ErrLockLost) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Do() = %v, want fn's context.Canceled joined with ErrLockLost", err)
		}
		if msg := err.Error(); strings.Count(msg, "lock lost") != 1 || strings.Contains(msg, "\n") {
			t.Fatalf("Do() error reads %q: want the loss said once, on one line", msg)
		}
	})
}

// TestKeepAliveNeverTouchesThePinnedConn: a holder runs 1,000 queries on
// Session.Conn() while a 5 ms keep-alive checks; the lock is never reported
// lost and its session never changes.
func TestKeepAliveNeverTouchesThePinnedConn(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(5*time.Millisecond))
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Lock(bg(), sqllock.Int64(8)); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 1000; i++ {
			var pid int
			if err := s.Conn().QueryRowContext(bg(), "SELECT pg_backend_pid() FROM pg_sleep(0)").Scan(&pid); err != nil {
				t.Fatalf("query %d on Conn(): %v", i, err)
			}
			if pid != s.PID() {
				t.Fatalf("query %d ran on backend %d, lock is on %d", i, pid, s.PID())
			}
		}
		if err := s.Err(); err != nil {
			t.Fatalf("Err() = %v after 1,000 queries", err)
		}
		if err := s.Close(bg()); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		if st := l.Stats(); st.Lost != 0 || st.Discarded != 0 {
			t.Fatalf("Stats() = %+v", st)
		}
	})
}

// TestKeepAliveIsOneQueryPerInterval: a Locker holding many locks checks
// them all with one query per interval, not one per lock.
func TestKeepAliveIsOneQueryPerInterval(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(50*time.Millisecond))
		var held []*sqllock.Lock
		for i := 0; i < 20; i++ {
			lk, err := l.Lock(bg(), sqllock.Pair(30, int32(i)))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, lk)
		}
		// Five checks, however long a loaded machine takes to run them
		// (it skips the ticks that came during one): at most one query
		// per interval that went by.
		const interval = 50 * time.Millisecond
		before := l.Stats().KeepAliveChecks
		start := time.Now()
		for l.Stats().KeepAliveChecks-before < 5 {
			if time.Since(start) > time.Minute {
				t.Fatalf("%d keep-alive queries in a minute", l.Stats().KeepAliveChecks-before)
			}
			time.Sleep(5 * time.Millisecond)
		}
		elapsed := time.Since(start)
		checks := l.Stats().KeepAliveChecks - before
		if most := int64(elapsed/interval) + 2; checks > most {
			t.Fatalf("%d keep-alive queries in %v at a %v interval for 20 locks; want at most %d, one per interval", checks, elapsed, interval, most)
		}
		for _, lk := range held {
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
		}
	})
}
