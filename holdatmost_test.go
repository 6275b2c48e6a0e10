package sqllock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// lockedLog is a log buffer that a Locker's logger and a test share.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// serverRelease returns, by the server's clock, when backend pid took
// its current state (its lock statement's end, for a holder that ran
// nothing since), then polls pg_locks until pid no longer holds the
// bigint key k and returns that moment too (the server's clock at the
// first poll that found it free). It fails t after limit.
func serverRelease(t *testing.T, db *sql.DB, pid int, k int64, limit time.Duration) (granted, freed time.Time) {
	t.Helper()
	if err := db.QueryRow(`SELECT state_change FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&granted); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		var held bool
		err := db.QueryRow(`SELECT clock_timestamp(), EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND pid = $1 AND classid::int8 = $2 AND objid::int8 = $3 AND objsubid = 1)`, pid, k>>32, k&0xffffffff).Scan(&freed, &held)
		if err != nil {
			t.Fatal(err)
		}
		if !held {
			return granted, freed
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("backend %d still holds %d after %v", pid, k, limit)
	return
}

// TestHoldAtMostJobIgnoresContext: a job that outlives its bound d and
// ignores its context loses its lock within d plus the unlock timeout,
// as the server's pg_locks and clock show, and no sooner than d. Its
// context ends at d with a cause matching ErrLockLost and
// DeadlineExceeded; another process takes the lock while the job still
// runs; Do waits for the job, then returns an error matching both; the
// logger is told at the bound and when the job outlives the release.
func TestHoldAtMostJobIgnoresContext(t *testing.T) {
	const d, unlockTimeout = time.Second, 2 * time.Second
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		var logged lockedLog
		l := sqllock.New(db, sqllock.WithUnlockTimeout(unlockTimeout),
			sqllock.WithLogger(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))))
		other := sqllock.New(pgtest.Open(t, "pgx", dsn))
		watch := pgtest.Open(t, "pgx", dsn)
		const key = 7_000_000_001
		k := sqllock.Int64(key)

		started, finish := make(chan struct{}), make(chan struct{})
		var ctxEnded bool
		var ctxErr, cause error
		var doErr error
		doReturned := make(chan struct{})
		go func() {
			defer close(doReturned)
			doErr = l.Do(bg(), k, func(ctx context.Context) error {
				close(started)
				<-ctx.Done()
				ctxEnded = true
				ctxErr, cause = ctx.Err(), context.Cause(ctx)
				<-finish // the job goes on, ignoring its context
				return nil
			}, sqllock.WithHoldAtMost(d))
		}()
		<-started
		pids := holders(t, watch, k)
		if len(pids) != 1 {
			t.Fatalf("holders of %v while the job runs: %v", k, pids)
		}
		granted, freed := serverRelease(t, watch, pids[0], key, 10*time.Second)
		held := freed.Sub(granted)
		t.Logf("server: lock statement ended %s, lock free at %s: held %v (bound %v, unlock timeout %v)",
			granted.Format("15:04:05.000000"), freed.Format("15:04:05.000000"), held, d, unlockTimeout)
		if held < d {
			t.Errorf("released %v after it was granted, before the bound %v", held, d)
		}
		if held > d+unlockTimeout {
			t.Errorf("released %v after it was granted, past the bound %v plus the unlock timeout %v", held, d, unlockTimeout)
		}

		// The job still runs: the lock is another's to take, and Do waits.
		lk, err := other.TryLock(bg(), k)
		if err != nil {
			t.Fatalf("another Locker's TryLock while the job ignores its bound = %v, want the lock", err)
		}
		lk.Unlock(bg())
		select {
		case <-doReturned:
			t.Fatal("Do returned while its job still ran")
		default:
		}
		// The second warning comes at d plus the unlock timeout.
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(logged.String(), "still runs after its upper bound") && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		close(finish)
		<-doReturned

		if !errors.Is(ctxErr, context.DeadlineExceeded) || !errors.Is(cause, sqllock.ErrLockLost) || !errors.Is(cause, context.DeadlineExceeded) {
			t.Errorf("the job's context ended with %v, cause %v; want DeadlineExceeded, a cause matching ErrLockLost and DeadlineExceeded", ctxErr, cause)
		}
		if !ctxEnded {
			t.Error("the job's context never ended")
		}
		if !errors.Is(doErr, sqllock.ErrLockLost) || !errors.Is(doErr, context.DeadlineExceeded) || !strings.Contains(doErr.Error(), "WithHoldAtMost(1s)") {
			t.Errorf("Do = %v, want an error matching ErrLockLost and DeadlineExceeded that names WithHoldAtMost(1s)", doErr)
		}
		for _, msg := range []string{"reached its upper bound", "still runs after its upper bound"} {
			if !strings.Contains(logged.String(), msg) {
				t.Errorf("the logger was not told %q; it got:\n%s", msg, logged.String())
			}
		}
		if st := l.Stats(); st.Held != 0 {
			t.Errorf("Stats().Held = %d after Do, want 0", st.Held)
		}
		waitNoLocks(t, watch, 5*time.Second)
	})
}

// TestHoldAtMostWithHoldAtLeast: the bound and the window together. A
// job shorter than the window keeps the lock to the window's end; one
// between the two releases as it returns; one that heeds its context and
// runs past the bound ends at the bound, its lock released there, and
// TryDo reports it ran with an error matching ErrLockLost and
// DeadlineExceeded.
func TestHoldAtMostWithHoldAtLeast(t *testing.T) {
	const least, most = 400 * time.Millisecond, 1200 * time.Millisecond
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		watch := pgtest.Open(t, "pgx", dsn)
		opts := []sqllock.DoOption{sqllock.WithHoldAtLeast(least), sqllock.WithHoldAtMost(most)}

		t.Run("short job", func(t *testing.T) {
			k := sqllock.Int64(7_000_000_002)
			start := time.Now()
			ran, err := l.TryDo(bg(), k, func(context.Context) error { return nil }, opts...)
			if !ran || err != nil {
				t.Fatalf("TryDo = %v, %v", ran, err)
			}
			if len(holders(t, watch, k)) != 1 && time.Since(start) < least-100*time.Millisecond {
				t.Fatal("the lock was released before the hold window's end")
			}
			waitFree(t, watch, k, least+5*time.Second)
			if el := time.Since(start); el < least {
				t.Fatalf("the lock was free %v after TryDo began, before the window %v", el, least)
			}
		})

		t.Run("job between", func(t *testing.T) {
			k := sqllock.Int64(7_000_000_003)
			ran, err := l.TryDo(bg(), k, func(ctx context.Context) error {
				select {
				case <-time.After(least + 100*time.Millisecond):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, opts...)
			if !ran || err != nil {
				t.Fatalf("TryDo = %v, %v; want true, nil", ran, err)
			}
			if len(holders(t, watch, k)) != 0 {
				t.Fatal("the lock is held after a job that ended between the window and the bound")
			}
		})

		t.Run("long job", func(t *testing.T) {
			k := sqllock.Int64(7_000_000_004)
			start := time.Now()
			var ended time.Duration
			ran, err := l.TryDo(bg(), k, func(ctx context.Context) error {
				<-ctx.Done()
				ended = time.Since(start)
				return ctx.Err()
			}, opts...)
			if !ran || !errors.Is(err, sqllock.ErrLockLost) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("TryDo = %v, %v; want true and an error matching ErrLockLost and DeadlineExceeded", ran, err)
			}
			if ended < most {
				t.Fatalf("the job's context ended %v after TryDo began, before the bound %v", ended, most)
			}
			if len(holders(t, watch, k)) != 0 {
				t.Fatal("the lock is held after TryDo returned")
			}
		})
	})
}

// TestHoldAtMostRefused: a bound that is not positive, or shorter than
// the hold window, is an error of the call, before any lock is taken or
// fn runs.
func TestHoldAtMostRefused(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	l := sqllock.New(db)
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	for _, c := range []struct {
		opts []sqllock.DoOption
		want string
	}{
		{[]sqllock.DoOption{sqllock.WithHoldAtMost(0)}, "WithHoldAtMost(0s): the bound must be positive"},
		{[]sqllock.DoOption{sqllock.WithHoldAtMost(-time.Second)}, "WithHoldAtMost(-1s): the bound must be positive"},
		{[]sqllock.DoOption{sqllock.WithHoldAtLeast(2 * time.Second), sqllock.WithHoldAtMost(time.Second)}, "WithHoldAtMost(1s) is shorter than WithHoldAtLeast(2s)"},
	} {
		if err := l.Do(bg(), sqllock.Int64(1), fn, c.opts...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Do = %v, want %q", err, c.want)
		}
		if did, err := l.TryDo(bg(), sqllock.Int64(1), fn, c.opts...); did || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TryDo = %v, %v, want false and %q", did, err, c.want)
		}
	}
	if ran {
		t.Error("fn ran")
	}
	if st := l.Stats(); st.Acquired != 0 {
		t.Errorf("Stats().Acquired = %d, want 0", st.Acquired)
	}
	// A bound equal to the window is fine.
	if err := l.Do(bg(), sqllock.Int64(1), fn, sqllock.WithHoldAtLeast(time.Millisecond), sqllock.WithHoldAtMost(time.Millisecond)); err != nil && !errors.Is(err, sqllock.ErrLockLost) {
		t.Errorf("Do with a bound equal to the window = %v", err)
	}
}

// TestHoldAtMostTaskReturnsAtOnce: a task that returns the moment its
// bound ends its context still has the bound reported, and its lock
// released by it. A context's Done closes before its AfterFunc starts, and
// a task that returned in between stopped it: the bound went unreported
// (TryDo returned the task's DeadlineExceeded alone). The test stops the
// watch first and ends the context right after, as that task did.
func TestHoldAtMostTaskReturnsAtOnce(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Int64(7_000_000_005)
		lk, err := sqllock.New(db).Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		if !sqllock.EndBoundStoppedLate(lk, time.Second) {
			t.Fatal("a bound that ended the task's context as the task returned: not reported")
		}
		if err := lk.Err(); !errors.Is(err, sqllock.ErrReleased) {
			t.Fatalf("Err() after the bound = %v, want ErrReleased", err)
		}
		waitFree(t, db, k, 5*time.Second)
	})
}
