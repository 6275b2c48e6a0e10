package wait

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Deadlines: a wait ends at its context's deadline, kept by the server
// too (lock_timeout), and reads its answer a little past it.

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// deadlineMargin is how long before ctx's deadline, left away, a wait
// bounded by it asks the server to end: time for the server's answer to
// come back before the driver gives the statement up. A tenth of what is
// left, from 50 to 100 ms, but at least three of the Pool's recent round
// trips (a loaded server or machine answers later), and at most half of
// what is left.
func (e *Engine) deadlineMargin(left time.Duration) time.Duration {
	m := min(max(left/10, 50*time.Millisecond), 100*time.Millisecond)
	return min(max(m, 3*time.Duration(e.rtt.Load())), left/2)
}

// ObserveRTT feeds the Pool's recent round trip with one statement that
// took d: a moving average that follows a slower server at once, and a
// faster one gradually.
func (e *Engine) ObserveRTT(d time.Duration) {
	old := time.Duration(e.rtt.Load())
	if d > old {
		e.rtt.Store(int64(d))
		return
	}
	e.rtt.Store(int64(old - (old-d)/8))
}

// pastDeadline returns the context of a wait statement that the server
// ends (its lock_timeout) a margin before ctx's deadline: cancelled with
// ctx, but with a deadline answerGrace past ctx's, so that the server's
// answer, when a loaded machine delivers it a little past the deadline, is
// still read, a certain outcome, instead of costing the session.
func pastDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, _ := ctx.Deadline()
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl.Add(answerGrace))
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel() // cancelled, not timed out: the wait ends now
		}
	})
	return sctx, func() { stop(); cancel() }
}

// answerGrace is how long past ctx's deadline the answer to a wait that
// the server was to end before it is still read. On a blind driver
// (lib/pq) whose server stopped answering, the statement is abandoned
// stmt.AbandonGrace after that.
const answerGrace = stmt.AbandonGrace

// ranInto reports whether a statement that began at began ran for about
// its lock_timeout, timeout (as deadlineSlice wrote it).
func ranInto(began time.Time, timeout string) bool {
	d, err := time.ParseDuration(timeout)
	return err == nil && time.Since(began) >= d*9/10
}

// ErrDeadline is the outcome of a wait that the server ended (lock_timeout)
// just before ctx's deadline: not granted, the session intact.
var ErrDeadline = errors.New("the wait ended at the context's deadline")

// deadlineSlice bounds a wait's lock_timeout, slice ("0": none), by ctx's
// deadline less deadlineMargin, and returns the margin when the deadline
// is the bound (0 otherwise). A wait that runs into its deadline in the client leaves its
// outcome uncertain, which costs the session (a driver that gives a
// statement up may close the connection anyway); one that the server ends
// first is a certain "not granted", and the connection stays usable: a
// wait always has a server-side bound when ctx has a deadline.
func (e *Engine) deadlineSlice(ctx context.Context, slice string) (string, time.Duration) {
	dl, ok := ctx.Deadline()
	if !ok {
		return slice, 0
	}
	left := time.Until(dl)
	margin := e.deadlineMargin(left)
	left -= margin
	if left < time.Millisecond {
		// Too near the deadline (or past it) for the server to end the
		// wait before it: the server ends it a millisecond on, and its
		// answer is read a little past the deadline (pastDeadline),
		// where a statement cut at the deadline would cost the session
		// and a cancel of its backend. (A margin of at least the recent
		// round trip leaves ObserveRTT's average as it is.)
		return "1ms", max(margin, time.Duration(e.rtt.Load()), time.Millisecond)
	}
	if slice != "0" {
		if d, err := time.ParseDuration(slice); err == nil && d <= left {
			return slice, 0
		}
	}
	return strconv.FormatInt(left.Milliseconds(), 10) + "ms", margin
}

// waitSlice returns the lock_timeout of a wait statement (see sqltext's
// WaitSQL and SliceSQL), as "<n>ms": half the server's deadlock_timeout, asked on w at the
// Pool's first wait and again after a wait was reported a deadlock
// (which says the setting was lowered since).
func (e *Engine) waitSlice(ctx context.Context, w Waiter) (string, error) {
	if s := e.slice.Load(); s != nil {
		return *s, nil
	}
	var ms int64
	// Read for up to stmt.AbandonGrace past ctx's end, as the server check
	// is: a question cut short costs its session, and a Pool whose
	// callers' deadlines are shorter than a round trip or two would
	// never learn the answer, and lose a session at each wait.
	gctx, cancel := WithGrace(ctx)
	defer cancel()
	if err := w.QueryRow(gctx, sqltext.WaitSliceSQL, nil, &ms); err != nil {
		return "", err
	}
	s := strconv.FormatInt(ms, 10) + "ms"
	e.slice.Store(&s)
	return s, nil
}
