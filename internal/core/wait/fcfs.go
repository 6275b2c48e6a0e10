package wait

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Waiting in line: the first waiter of a Pool's queue for a key takes a
// ticket, by the server's clock, in the key's line, which every process's
// waiters share (a waiter queued behind it took one as it queued, on
// another of the Pool's sessions: see the core's place.go), and waits only for the
// ticket before its own; with none left, for the key (see sqltext's
// tickets). Waiters of every process are
// so served in the order they arrived, while every wait stays a statement
// shorter than half the server's deadlock_timeout, which a holder's CREATE
// INDEX CONCURRENTLY never waits on for long.
//
// The line's tags are advisory locks that any program can take: a
// stranger that holds them (its own pair keys in a negative class, or a
// semaphore's slots whose class is the line's) costs the line its order,
// never its progress. A ticket held by a backend that does not ring the
// doorbell is no predecessor; a waiter that cannot ring the doorbell
// within a slice, or finds no free ticket, waits for the key without a
// ticket (bypass, logged once per Pool).

// Line is what a waiter waits for in its line: a key, in kind's mode, or
// any slot of a semaphore (slots).
type Line struct {
	kind  sqltext.Kind
	k     sqltext.Key // the key; a semaphore's: its slots' class, for logs
	slots int         // a semaphore's number of slots (0: a key's line)
	class int32       // the line's ticket class
	// place is the ticket of the waiter's place in line, held on another
	// of its Pool's sessions since it queued (see the core's place.go; 0: none): it
	// registers without a ticket of its own, and waits with that one.
	// tell, when set, is told once the registration is over, the ticket
	// it took, and says whether the waiter may wait with it (see
	// the core's place.tell).
	place int32
	tell  func(ticket int32) (keep bool)
}

// At returns ln for a waiter whose place in line is ticket (0: none),
// told by tell of its registration (nil: not told; see Line.tell).
func (ln Line) At(ticket int32, tell func(ticket int32) (keep bool)) Line {
	ln.place, ln.tell = ticket, tell
	return ln
}

// KeyLine returns the line of k, waited for in kind's mode.
func KeyLine(kind sqltext.Kind, k sqltext.Key) Line {
	return Line{kind: kind, k: k, class: sqltext.TicketClass(k)}
}

// SlotLine returns the line of the permits of a semaphore of n slots in
// class.
func SlotLine(class int32, n int) Line {
	return Line{k: sqltext.Key{Pair: true, Class: class}, slots: n, class: sqltext.SemaphoreTicketClass(class)}
}

// sliceSQL returns one slice of a wait in ln (see sqltext's SliceSQL):
// for a semaphore, one that waits for a slot picked at random when none
// is free.
func (ln Line) sliceSQL(st *sqltext.Statements, mine int32, slice, mark string) (string, []any) {
	if ln.slots > 0 {
		return st.SemaphoreSliceSQL(ln.class, mine, ln.k.Class, ln.slots, int32(rand.IntN(ln.slots)), slice, mark)
	}
	return st.SliceSQL(ln.kind, ln.k, ln.class, mine, slice, mark)
}

// leaveSQL returns the statement that takes a waiter out of ln.
func (ln Line) leaveSQL(st *sqltext.Statements, mark string) (string, []any) {
	if ln.slots > 0 {
		return st.SemaphoreLeaveLineSQL(ln.class, ln.k.Class, mark)
	}
	return st.LeaveLineSQL(ln.kind, ln.k, ln.class, mark)
}

// ErrLeft is the outcome of a wait that left the line as its ctx ended,
// not granted, for sure: its session is intact.
var ErrLeft = errors.New("the wait left the line as the context ended")

// ErrRestart is the outcome of a wait on a pinned session that left its
// line, not granted, for sure, because another backend waits for the end
// of the session's transaction (a CREATE INDEX CONCURRENTLY that began its
// last phase as one of the wait's slices ran: it waits for the whole
// transaction, which a waiter would keep open until granted and
// released). The session holds nothing and closes, which ends its
// transaction; the call waits on in a new session, at the end of the line.
var ErrRestart = errors.New("sqllock: the wait left the line to end its transaction, which another backend waits for")

// waitedOnMe reports whether another backend waits for the end of w's
// transaction (sqltext.WaitedOnMeSQL). A question that fails reports
// false: the next slice asks again.
func (e *Engine) waitedOnMe(ctx context.Context, w Waiter) bool {
	var waited bool
	return w.QueryRow(ctx, sqltext.WaitedOnMeSQL, nil, &waited) == nil && waited
}

// WaitInLine waits for k (kind: exclusive or shared) on w, a session of
// backend pid that holds nothing of k's, in k's line: it registers, then
// waits in slices until it is granted, a statement fails, or ctx ends (its
// deadline is kept by the server too). Whatever it returns, the session
// holds no ticket of the line unless the outcome is uncertain (the session
// then ends, and with it its tickets).
func (e *Engine) WaitInLine(ctx context.Context, w Waiter, st *sqltext.Statements, ln Line, pid int64) Outcome {
	o := Outcome{PID: pid}
	kind, k, class := ln.kind, ln.k, ln.class
	e.Debug(ctx, "sqllock: waiting", k, slog.Bool("shared", kind.IsShared()), slog.Int64("pid", pid))
	slice, err := e.waitSlice(ctx, w)
	if err != nil {
		o.Err = err
		return o
	}
	var mine int64
	ring := ln.place == 0 // a waiter with a place rings its doorbell there
	for {
		var ok bool
		q, args := st.RegisterSQL(class, kind.IsShared(), slice, w.mark(), ring)
		o.Sent = stmt.MonoNow()
		// The registration takes a moment: it runs on for up to
		// stmt.AbandonGrace past ctx's end, so that a call whose ctx ends
		// meanwhile leaves the line for sure, rather than with a session
		// that may hold a ticket (which would end it).
		rctx, cancel := WithGrace(ctx)
		o.Err = w.QueryRow(rctx, q, args, &mine, &o.PID, &o.Standby, &ok)
		cancel()
		switch {
		case o.Err == nil && !ok:
			o.Err = stmt.ForeignSession() // nothing was taken
		case o.Err == nil && stmt.CtxEnded(ctx):
			return e.leaveLine(ctx, w, st, ln, o, false)
		case o.Err == nil && mine == 0 && ring:
			// Every ticket it tried is held: by a stranger (64 waiters
			// in one millisecond are not a line's). It waits without one.
			e.bypass(ctx, ln, "no free ticket")
		case stmt.LockTimedOut(o.Err) && ring && !stmt.CtxEnded(ctx):
			// The doorbell was held exclusively for a whole slice: not by
			// a holder asking whether anyone waits (a moment), but by a
			// stranger. It waits without a ticket.
			e.bypass(ctx, ln, "the doorbell is held")
			ring = false
			continue
		}
		if o.Err != nil {
			return o
		}
		break
	}
	if ln.place != 0 {
		mine = int64(ln.place)
	}
	if ln.tell != nil && !ln.tell(int32(mine)) {
		// A caller queued behind it in its Pool holds an earlier ticket
		// (it registered again, in a new session): were it to wait for
		// that ticket, each would wait for the other. It waits for the
		// key itself (its ticket goes with its first slice).
		e.Debug(ctx, "sqllock: waiting without a place in line: a caller queued behind holds an earlier ticket", k)
		mine = 0
	}
	// final: the server ended the wait a margin before ctx's deadline, and
	// the last slice runs until the deadline itself (see untilDeadline).
	final := false
	for {
		o.Certain = false
		sl, margin := e.deadlineSlice(ctx, slice)
		if final {
			sl, margin = e.untilDeadline(ctx)
		}
		byDeadline := margin > 0
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); ok {
			// Every slice of a call with a deadline ends on the server
			// before it (a slice shorter than what is left, or the
			// deadline's own): its answer, which a loaded machine reads a
			// little past the deadline, is read, certain, rather than cut
			// at the deadline, which would cost the session.
			sctx, cancel = pastDeadline(ctx)
		}
		// A cancel that reached the server before the statement started is
		// lost: should the statement still run stmt.AbandonGrace after its
		// context ended, the backend is cancelled from here (see WaitOn).
		var returned atomic.Bool
		pid := o.PID // the statement writes o.PID as the cancel may read it
		stop := context.AfterFunc(sctx, func() {
			time.AfterFunc(stmt.AbandonGrace, func() {
				if returned.CompareAndSwap(false, true) {
					e.stopWait(ctx, pid, k)
				}
			})
		})
		var got, others int64
		var late bool
		q, args := ln.sliceSQL(st, int32(mine), sl, w.mark())
		o.Sent = stmt.MonoNow()
		o.Err = w.QueryRow(sctx, q, args, &got, &o.PID, &o.Standby, &others, &late)
		o.OK, o.Slot = o.Err == nil && got >= 0, int32(got)
		if errors.Is(o.Err, sql.ErrNoRows) {
			o.Err = stmt.ForeignSession() // nothing was waited for
		}
		o.Certain = sctx != ctx && sctx.Err() == nil && !errors.Is(ctx.Err(), context.Canceled) &&
			(o.Err == nil || stmt.LockTimedOut(o.Err))
		if !returned.CompareAndSwap(false, true) {
			o.Certain = false // a cancel of this backend is on its way
		}
		stop()
		cancel()
		if byDeadline && !final && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			e.ObserveRTT(margin) // see WaitOn
		}
		timedOut := stmt.LockTimedOut(o.Err)
		cancelled := stmt.QueryCanceled(o.Err) && !stmt.CtxEnded(ctx)
		switch {
		case o.Err == nil && o.OK:
			if late {
				e.Debug(ctx, LateGrant, k, slog.Int64("pid", o.PID))
			}
			return o // granted: its ticket and doorbell went in the same statement
		case o.Err == nil && !stmt.CtxEnded(ctx):
			continue // its predecessor left: look again
		case o.Err == nil:
			// Its predecessor left as ctx ended: not granted, for sure.
			return e.leaveLine(ctx, w, st, ln, o, false)
		case timedOut && byDeadline && !final && !stmt.CtxEnded(ctx):
			// The server ended the wait a margin before ctx's deadline:
			// the call is not refused while ctx is live. Once more, until
			// the deadline itself: a key released meanwhile is granted.
			final = true
			continue
		case timedOut && (byDeadline && (o.Certain || !stmt.CtxEnded(ctx)) || o.Certain && stmt.CtxEnded(ctx)):
			// The server ended the wait at ctx's deadline (or a slice
			// before it, answered once ctx had ended): not granted,
			// unless granted as it ended; the line is left either way.
			o = e.leaveLine(ctx, w, st, ln, o, true)
			if errors.Is(o.Err, ErrDeadline) && final {
				// The server's clock ended it a moment before the
				// client's: no refusal before the deadline.
				<-ctx.Done()
			}
			return o
		case (timedOut || cancelled) && !stmt.CtxEnded(ctx):
			// The slice ended (or a stray cancel): the next one looks
			// again, unless the session's transaction is waited for.
			if e.pinned() && e.waitedOnMe(ctx, w) {
				o = e.leaveLine(ctx, w, st, ln, o, false)
				if errors.Is(o.Err, ErrLeft) {
					e.Debug(ctx, "sqllock: a backend waits for the end of the waiting session's transaction: the wait goes on in a new one", k, slog.Int64("pid", o.PID))
					o.Err = ErrRestart
				}
				return o
			}
			continue
		case stmt.Deadlocked(o.Err) && !stmt.CtxEnded(ctx):
			// A holder's CREATE INDEX CONCURRENTLY, should the server's
			// deadlock_timeout have been lowered since it was read, waited
			// for this statement's snapshot and was reported a deadlock:
			// this session holds nothing but its wait. Read the slice
			// again, and wait on.
			e.SnapshotWaits.Add(1)
			e.slice.Store(nil)
			if slice, err = e.waitSlice(ctx, w); err != nil {
				o.Err = err
				return o
			}
			continue
		}
		// A failure, or ctx's end with no certain answer: the session ends
		// (see the core's judge), and its tickets with it. When ctx ended, the
		// abandoned backend is first taken out of the queue, as WaitOn does.
		switch {
		case stmt.CtxEnded(ctx) && errors.Is(o.Err, stmt.ErrAbandoned):
			e.stopAbandoned(ctx, pid, k)
		case stmt.CtxEnded(ctx) && stmt.SQLState(o.Err) == "":
			e.stopWait(ctx, pid, k)
		}
		return o
	}
}

// leaveLine takes w's session out of k's line, once its wait ended with
// ctx (last is the outcome of its last slice): it gives back its tickets
// and its doorbell, and reports whether the session holds k after all
// (granted as the last slice's lock_timeout fired: then the outcome is
// that grant). deadline says the server ended the wait at ctx's deadline:
// not granted, for sure (ErrDeadline), when the session does not hold k.
// When the question cannot be answered, the outcome is uncertain (the
// session ends).
func (e *Engine) leaveLine(ctx context.Context, w Waiter, st *sqltext.Statements, ln Line, last Outcome, deadline bool) Outcome {
	// After a wait the server ended at the deadline, the question comes
	// within the deadline's margin, or past it; it gets stmt.AbandonGrace from
	// whichever is later (see grantedAfterTimeout).
	gctx := context.WithoutCancel(ctx)
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		gctx, cancel = context.WithDeadline(gctx, later(dl, time.Now()).Add(stmt.AbandonGrace))
	} else {
		gctx, cancel = context.WithTimeout(gctx, stmt.AbandonGrace)
	}
	defer cancel()
	var have, pid, released int64
	q, args := ln.leaveSQL(st, w.mark())
	err := w.QueryRow(gctx, q, args, &have, &pid, &released, stmt.Skip)
	o := Outcome{PID: last.PID, Sent: last.Sent}
	switch {
	case err != nil || gctx.Err() != nil || pid != last.PID:
		if err == nil {
			err = fmt.Errorf("sqllock: leaving the line: %w", stmt.CtxErr(gctx))
		}
		o.Err = err // uncertain: the session ends
	case have >= 0:
		e.Debug(ctx, LateGrant, ln.k, slog.Int64("pid", pid))
		o.OK, o.Certain, o.Slot = true, true, int32(have)
	case deadline:
		o.Err = ErrDeadline
	default:
		o.Err = ErrLeft
	}
	return o
}

// WithGrace returns a context that ends stmt.AbandonGrace after ctx does, for a
// statement that takes a moment and whose answer, read past ctx's end, is
// certain: the call then knows what its session holds.
func WithGrace(ctx context.Context) (context.Context, context.CancelFunc) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(stmt.AbandonGrace, cancel) })
	return gctx, func() { stop(); cancel() }
}

// LateGrant is the debug message of a wait granted as its statement's
// lock_timeout fired: the statement failed, and the session holds the key.
const LateGrant = "sqllock: granted as the wait's lock_timeout fired"

// bypass records that a waiter in ln waits without its place in line, as
// a stranger holds the line's tags (why says which): the first time in
// the Pool, it is logged, as a warning.
func (e *Engine) bypass(ctx context.Context, ln Line, why string) {
	e.Debug(ctx, "sqllock: waiting without a place in line", ln.k, slog.String("why", why))
	if e.Warn == nil || !e.bypassed.CompareAndSwap(false, true) {
		return
	}
	e.Warn(ctx, "sqllock: another program holds advisory locks in a line's ticket class (negative pair keys): its waiters are served without their order in line", ln.k,
		slog.String("why", why), slog.Int("ticket_class", int(ln.class)))
}

// untilDeadline is deadlineSlice for the last slice of a wait: one that
// the server ends at ctx's deadline itself, not a margin before it (at
// least a millisecond on), and whose answer is read a little past it
// (pastDeadline). It returns the lock_timeout, and a margin above 0.
func (e *Engine) untilDeadline(ctx context.Context) (string, time.Duration) {
	dl, _ := ctx.Deadline()
	ms := (time.Until(dl) + time.Millisecond - 1) / time.Millisecond
	return strconv.FormatInt(max(int64(ms), 1), 10) + "ms", max(time.Duration(e.rtt.Load()), time.Millisecond)
}
