package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestDeadlineKeptByServer: a wait that reaches its context's deadline is
// ended by the server just before it, so its outcome is certain: the call
// returns ErrNotAcquired and DeadlineExceeded, the Locker's connection goes
// back to the pool (the next lock runs on the same backend), and a Session
// keeps the locks it held.
func TestDeadlineKeptByServer(t *testing.T) {
	long(t) // answers within the deadline's margin: not under the quick run's 8 tests per core
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(1)
		logs := &capture{}
		l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0), sqllock.WithLogger(slog.New(logs))) // a connection per lock: the pool's one
		holder := sqllock.New(pgtest.Open(t, "pgx", dsn))
		busy := sqllock.Int64(77)
		hl, err := holder.Lock(bg(), busy)
		if err != nil {
			t.Fatal(err)
		}
		defer hl.Unlock(bg())

		first, err := l.TryLock(bg(), sqllock.Int64(1))
		if err != nil {
			t.Fatal(err)
		}
		pid := first.PID()
		if err := first.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		// The server ends the wait a tenth of the time before the deadline
		// (50 to 100 ms); a loaded machine may answer later than that
		// (logged): of the waits at 1 s, one must keep its connection.
		reused := false
		for _, d := range []time.Duration{300 * time.Millisecond, time.Second, time.Second, time.Second} {
			ctx, cancel := context.WithTimeout(bg(), d)
			start := time.Now()
			_, err := l.Lock(ctx, busy)
			took := time.Since(start)
			cancel()
			if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock(deadline %v) = %v, want ErrNotAcquired and DeadlineExceeded", d, err)
			}
			if took > d+3*time.Second { // the grace, the cancel from another connection, and scheduling
				t.Errorf("Lock(deadline %v) returned after %v", d, took)
			}
			next, err := l.TryLock(bg(), sqllock.Int64(2))
			if err != nil {
				t.Fatal(err)
			}
			if next.PID() != pid {
				t.Logf("after a wait ended at its deadline (%v), the connection was discarded: %q", d, logs.reasons("sqllock: connection discarded"))
				pid = next.PID()
			} else if d == time.Second {
				reused = true
			}
			if err := next.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
		}
		if !reused {
			t.Errorf("every wait that reached its deadline (1 s) cost its connection")
		}

		db.SetMaxOpenConns(0)
		// A loaded machine can answer later than the 100 ms the server
		// leaves: up to three Sessions, one must keep its lock.
		kept := false
		for attempt := 1; attempt <= 3 && !kept; attempt++ {
			s, err := l.Session(bg())
			if err != nil {
				t.Fatal(err)
			}
			mine := sqllock.Int64(5)
			if err := s.Lock(bg(), mine); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg(), time.Second)
			err = s.Lock(ctx, busy)
			cancel()
			if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Session.Lock(deadline) = %v, want ErrNotAcquired and DeadlineExceeded", err)
			}
			if err := s.Err(); err != nil {
				t.Logf("attempt %d: Session.Err() = %v after a wait at its deadline (a late answer)", attempt, err)
				continue
			}
			if !slices.Contains(s.Held(), mine) || !slices.Contains(holders(t, db, mine), s.PID()) {
				t.Errorf("the Session no longer holds %v: Held() = %v", mine, s.Held())
			}
			kept = true
			if err := s.Close(bg()); err != nil {
				t.Fatal(err)
			}
		}
		if !kept {
			t.Errorf("three Sessions lost their locks to a wait that reached its deadline")
		}
	})
}

// TestDeadlineMarginGrows: a wait whose server answer came after the
// deadline (its backend stopped, SIGSTOP, past the deadline: a loaded
// server) costs its session, and the Locker leaves later waits a larger
// margin before their deadlines, so that their sessions are kept. Two such
// waits, then one on a running backend: the server ends it well before its
// deadline (the margin was 100 ms at first).
func TestDeadlineMarginGrows(t *testing.T) {
	long(t)
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		holder := sqllock.New(pgtest.Open(t, "pgx", dsn))
		busy := sqllock.Int64(78)
		hl, err := holder.Lock(bg(), busy)
		if err != nil {
			t.Fatal(err)
		}
		defer hl.Unlock(bg())
		const deadline = 3 * time.Second
		for i := range 2 {
			s, err := l.Session(bg())
			if err != nil {
				t.Fatal(err)
			}
			pid := s.PID()
			ctx, cancel := context.WithTimeout(bg(), deadline)
			go func() {
				time.Sleep(deadline / 2)
				syscall.Kill(pid, syscall.SIGSTOP)
				time.Sleep(deadline/2 + time.Second)
				syscall.Kill(pid, syscall.SIGCONT)
			}()
			err = s.Lock(ctx, busy)
			cancel()
			if !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("wait %d, its backend stopped past the deadline: %v, want ErrNotAcquired", i, err)
			}
			if s.Err() == nil {
				t.Errorf("wait %d: the answer came after the deadline, yet the Session is kept", i)
			}
			s.Close(bg())
			time.Sleep(deadline/2 + 1500*time.Millisecond) // the backend resumed
		}
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(bg())
		ctx, cancel := context.WithTimeout(bg(), deadline)
		defer cancel()
		start := time.Now()
		err = s.Lock(ctx, busy)
		took := time.Since(start)
		if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the next wait: %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		t.Logf("after two late answers, a wait with a %v deadline returned after %v", deadline, took.Round(time.Millisecond))
		if took > deadline-400*time.Millisecond {
			t.Errorf("after two late answers, a wait with a %v deadline returned after %v: the margin stayed small", deadline, took)
		}
		if err := s.Err(); err != nil {
			t.Errorf("a wait the server ended before the deadline lost its Session: %v", err)
		}
	})
}

// TestDeadlineLateAnswerKept: the server ends a Session's wait a margin
// before its deadline, and a loaded machine delivers that answer a little
// after it (here the waiting backend is stopped, SIGSTOP, from before its
// lock_timeout fires until 20 ms past the deadline). The answer is still
// read: the call returns ErrNotAcquired and DeadlineExceeded, late by
// less than the grace (250 ms), and the Session keeps its other lock. A
// machine so loaded that the answer comes later than the grace costs the
// Session, and one whose answer beat the deadline tried nothing (both
// logged): of five trials, each with a Locker of its own (whose margin has
// learnt nothing), one must keep its Session with an answer read late.
func TestDeadlineLateAnswerKept(t *testing.T) {
	long(t) // answers within 250 ms of a resumed backend: not under the quick run's 8 tests per core
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		holder := sqllock.New(pgtest.Open(t, "pgx", dsn))
		busy, mine := sqllock.Int64(79), sqllock.Int64(80)
		hl, err := holder.Lock(bg(), busy)
		if err != nil {
			t.Fatal(err)
		}
		defer hl.Unlock(bg())
		for trial := 1; ; trial++ {
			if lateAnswerKept(t, db, sqllock.New(db, sqllock.WithKeepAlive(0)), busy, mine) {
				return
			}
			if trial == 5 {
				t.Fatalf("a late but certain answer cost the Session in %d trials", trial)
			}
		}
	})
}

// lateAnswerKept runs one trial of TestDeadlineLateAnswerKept, and reports
// whether the Session kept its lock; a wrong outcome fails t.
func lateAnswerKept(t *testing.T, db *sql.DB, l *sqllock.Locker, busy, mine sqllock.Key) bool {
	t.Helper()
	s, err := l.Session(bg())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(bg())
	if err := s.Lock(bg(), mine); err != nil {
		t.Fatal(err)
	}
	const deadline = time.Second
	const resumeAfter = 20 * time.Millisecond
	pid := s.PID()
	ctx, cancel := context.WithTimeout(bg(), deadline)
	defer cancel()
	dl, _ := ctx.Deadline()
	resumed := make(chan time.Time, 1)
	go func() {
		// The server's lock_timeout fires about 100 ms before the
		// deadline: stop the backend 200 ms before it.
		time.Sleep(time.Until(dl.Add(-200 * time.Millisecond)))
		syscall.Kill(pid, syscall.SIGSTOP)
		time.Sleep(time.Until(dl.Add(resumeAfter)))
		syscall.Kill(pid, syscall.SIGCONT)
		resumed <- time.Now()
	}()
	err = s.Lock(ctx, busy)
	returned := time.Now()
	at := <-resumed
	t.Logf("backend resumed %v past the deadline; the call returned %v past it: %v",
		at.Sub(dl).Round(time.Millisecond), returned.Sub(dl).Round(time.Millisecond), err)
	if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Session.Lock = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if returned.Before(dl) {
		t.Logf("the call returned %v before its deadline: the answer was not late, no trial", dl.Sub(returned))
		return false
	}
	if err := s.Err(); err != nil {
		if late := returned.Sub(dl); late < 250*time.Millisecond {
			t.Fatalf("an answer read %v past the deadline cost the Session: %v", late, err)
		}
		t.Logf("the answer came later than the grace: %v", err)
		return false
	}
	if late := returned.Sub(dl); late > 350*time.Millisecond {
		t.Errorf("the call returned %v past its deadline", late)
	}
	if !slices.Contains(s.Held(), mine) || !slices.Contains(holders(t, db, mine), s.PID()) {
		t.Fatalf("the Session no longer holds %v: Held() = %v", mine, s.Held())
	}
	return true
}

// TestDeadlineNotEarly: the server ends a Lock's wait a margin (at least
// 50 ms) before ctx's deadline, so that its answer comes back in time;
// the call still reports no ErrNotAcquired while its context is live. A
// key released inside that margin is granted (a trial counts when the
// holder's unlock was confirmed before the deadline), and a wait that is
// refused returns no earlier than its deadline.
func TestDeadlineNotEarly(t *testing.T) {
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		holder := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		const deadline = time.Second
		const inMargin = 20 * time.Millisecond // before the deadline
		granted := 0
		for trial := range 3 {
			k := sqllock.Int64(int64(90 + trial))
			hl, err := holder.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg(), deadline)
			dl, _ := ctx.Deadline()
			released := make(chan time.Time, 1)
			go func() {
				time.Sleep(time.Until(dl.Add(-inMargin)))
				hl.Unlock(bg())
				released <- time.Now()
			}()
			lk, err := l.Lock(ctx, k)
			returned := time.Now()
			cancel()
			at := <-released
			if at.After(dl) {
				t.Logf("trial %d: the holder's unlock was confirmed %v past the deadline: no trial", trial, at.Sub(dl))
				if err == nil {
					lk.Unlock(bg())
				}
				continue
			}
			if err != nil {
				t.Errorf("trial %d: released %v before the deadline, Lock = %v (returned %v before the deadline)", trial, dl.Sub(at), err, dl.Sub(returned))
				continue
			}
			granted++
			t.Logf("trial %d: released %v before the deadline, granted %v before it", trial, dl.Sub(at), dl.Sub(returned))
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("granted in %d of 3 trials", granted)

		busy := sqllock.Int64(99)
		hl, err := holder.Lock(bg(), busy)
		if err != nil {
			t.Fatal(err)
		}
		defer hl.Unlock(bg())
		for _, d := range []time.Duration{300 * time.Millisecond, deadline} {
			ctx, cancel := context.WithTimeout(bg(), d)
			dl, _ := ctx.Deadline()
			_, err := l.Lock(ctx, busy)
			returned := time.Now()
			cancel()
			if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock(deadline %v) = %v, want ErrNotAcquired and DeadlineExceeded", d, err)
			}
			t.Logf("Lock(deadline %v) refused %v past the deadline", d, returned.Sub(dl))
			if returned.Before(dl) {
				t.Errorf("Lock(deadline %v) refused %v before its deadline", d, dl.Sub(returned))
			}
		}
	})
}
