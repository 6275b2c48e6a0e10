package wait

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The waiting engine. Every lock call that may wait goes through it (a
// Pool's exclusive tries are first sent on a shared session, the core's share.go,
// and come here only to wait), on one of three kinds of session:
//
//   - a session of the Pool's (a lock's, a permit's): try, then wait in
//     statements shorter than half the server's deadlock_timeout (sliced:
//     the session holds nothing but its wait, so no deadlock is lost, and
//     a holder's CREATE INDEX CONCURRENTLY never waits on an old snapshot
//     of it);
//   - an Owned's (Owned.Lock): one wait statement, since it holds other
//     locks and its waits must stay visible to PostgreSQL's deadlock
//     detector;
//   - a transaction: InTx's (try, then one wait statement, for the same
//     reason: the transaction may hold other locks), or the caller's
//     (LockTx and kin: try, then a wait without a pool to cancel from; the
//     caller's rollback ends it). Every transaction-level call starts with
//     the same try, whatever its context: it reports the backend and
//     whether the server is a standby, and takes nothing there.
//
// In every case a wait knows its backend's pid, and when ctx ends during
// it, the backend is taken out of the queue (stopWait); the owner then
// applies the one rule for an uncertain outcome: ctx ended means the
// session is discarded (the core's settle, Owned.lose) or the transaction
// rolled back (InTx).

// Engine is the acquisition engine: a value, which a Pool holds (and
// feeds with its statements and keys), and which the transaction locks
// (LockTx and kin) use with no Pool at all.
type Engine struct {
	// DB is the pool an abandoned wait is cancelled from (stopWait);
	// nil for LockTx and kin, which have none. Budget counts the
	// connections taken from it outside sessions (see stmt's budget.go).
	DB     *sql.DB
	Budget *stmt.Budget
	Mode   sqltext.Mode
	// Abandoned is non-nil for drivers that do not give up a read when its
	// context ends (lib/pq): their statements are bounded by stmt.BoundedRaw,
	// and it holds the connections left to finish alone.
	Abandoned *stmt.AbandonSet
	rtt       atomic.Int64           // recent round trip, ns (see ObserveRTT)
	slice     atomic.Pointer[string] // see waitSlice
	// SnapshotWaits counts waits that a holder's CREATE INDEX
	// CONCURRENTLY found (Stats.SnapshotWaits).
	SnapshotWaits atomic.Int64
	// SimpleFor, when set, prepares a connection of db for the engine's
	// statements behind a transaction pooler (see the core's Pool.simpleFor).
	SimpleFor func(conn *sql.Conn) (done func())
	// Trace receives the engine's debug messages (nil: none), warn its
	// warnings.
	Trace func(ctx context.Context, msg string, k sqltext.Key, attrs ...slog.Attr)
	Warn  func(ctx context.Context, msg string, k sqltext.Key, attrs ...slog.Attr)
	// bypassed is set once a waiter waited without its place in line
	// (see bypass): the first is logged.
	bypassed atomic.Bool
}

// pinned reports whether the engine's sessions are transactions kept open
// behind a transaction pooler (see the core's Pool.simpleFor).
func (e *Engine) pinned() bool { return e.SimpleFor != nil }

// Debug hands a debug message to Trace.
func (e *Engine) Debug(ctx context.Context, msg string, k sqltext.Key, attrs ...slog.Attr) {
	if e.Trace != nil {
		e.Trace(ctx, msg, k, attrs...)
	}
}

// Waiter is a session the engine runs statements on.
type Waiter interface {
	QueryRow(ctx context.Context, q string, args []any, dest ...any) error
	// mark is the session's owner mark (see sqltext.Statements; "" for a
	// transaction's).
	mark() string
}

// ConnWaiter is a connection of the Pool's, marked m: statements run on
// the driver connection, bounded for drivers that ignore their context
// (lib/pq). On a pinned session (pinned: see the core's pinned.go) each statement of
// a wait runs in a savepoint, which its error rolls back: a lock_timeout,
// a deadlock or a cancel must not abort the transaction that holds the
// session's other locks.
type ConnWaiter struct {
	Conn   *sql.Conn
	Blind  *stmt.AbandonSet
	Mark   string
	Pinned bool
}

func (w ConnWaiter) mark() string { return w.Mark }

func (w ConnWaiter) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	if !w.Pinned || !sqltext.Waits(q) {
		return stmt.QueryRow(ctx, w.Blind, w.Conn, q, args, dest...)
	}
	if err := TxExecOn(ctx, w.Blind, w.Conn, sqltext.SavepointSQL); err != nil {
		return err
	}
	err := stmt.QueryRow(ctx, w.Blind, w.Conn, q, args, dest...)
	end := sqltext.ReleaseSavepointSQL
	if err != nil && stmt.SQLState(err) != "" {
		// The server's error aborted the savepoint only. (A lock the
		// statement was granted before its error stays: session-level
		// locks outlive a rolled-back savepoint, as its callers know.)
		end = sqltext.RollbackToSavepointSQL
	}
	// The answer is read already, whatever ctx: this runs on, bounded.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelWaitTimeout)
	defer cancel()
	if eerr := TxExecOn(ectx, w.Blind, w.Conn, end); eerr != nil && (err == nil || stmt.SQLState(err) != "") {
		return eerr // the transaction is in doubt: so is the session
	}
	return err
}

// Level is where an advisory lock lives: a session or a transaction.
type Level uint8

const (
	SessionLevel Level = iota // pg_advisory_lock and kin, on a session
	XactLevel                 // pg_advisory_xact_lock and kin, in a transaction
)

// TryOn runs the non-waiting statement of kind for k on w: one round trip,
// which also reports the backend's pid. Its answer is read for up to
// stmt.AbandonGrace past ctx's end (see WithGrace): a backend that runs the
// statement late, on a loaded machine, still tells the call whether it
// was granted, rather than taking the key after the call returned. An
// answer read so is certain (o.Certain) on a session: the caller judges
// it; a transaction's is not (see the core's settleTx).
func (e *Engine) TryOn(ctx context.Context, w Waiter, lv Level, st *sqltext.Statements, kind sqltext.Kind, k sqltext.Key) Outcome {
	var o Outcome
	gctx := ctx
	if ctx.Done() != nil {
		var cancel context.CancelFunc
		gctx, cancel = WithGrace(ctx)
		defer cancel()
	}
	if lv == XactLevel {
		// The same statement for every call, whatever ctx: it takes
		// nothing on a standby.
		q, args := e.Mode.XactTrySQL(kind, k)
		o.Err = w.QueryRow(gctx, q, args, &o.OK, &o.PID, &o.Standby)
		return o
	}
	q, args := st.TrySQL(kind|sqltext.Try, k, w.mark())
	if !kind.IsTry() {
		// A call that will wait: it passes no one in the key's line.
		q, args = st.PoliteTrySQL(kind, k, sqltext.TicketClass(k), w.mark())
	}
	o.Sent = stmt.MonoNow()
	var ok sql.NullBool
	o.Err = w.QueryRow(gctx, q, args, &ok, &o.PID, &o.Standby)
	o.OK = ok.Bool
	if o.Err == nil && !ok.Valid {
		o.Err = stmt.ForeignSession() // nothing was tried
	}
	if o.Err == nil {
		e.ObserveRTT(time.Duration(stmt.MonoNow() - o.Sent))
		o.Certain = gctx.Err() == nil
	}
	return o
}

// WaitOn waits for k on w, backend pid, in one statement, until the lock
// is granted, the statement fails, or ctx ends: a Session's wait, a
// transaction's (they may hold other locks: PostgreSQL's deadlock
// detector sees the wait whole). No lock_timeout of the role or database
// ends it, ctx's deadline does (the server keeps it too). When ctx ends
// during the wait, the backend leaves the queue before WaitOn returns.
// (A Locker's waits are sliced, in a line: see WaitInLine.)
func (e *Engine) WaitOn(ctx context.Context, w Waiter, lv Level, st *sqltext.Statements, kind sqltext.Kind, k sqltext.Key, pid int64) Outcome {
	o := Outcome{PID: pid}
	e.Debug(ctx, "sqllock: waiting", k, slog.Bool("shared", kind.IsShared()), slog.Int64("pid", pid))
	// The server keeps ctx's deadline too: a cancel that never reaches
	// it cannot leave the wait running past the deadline.
	slice, margin := e.deadlineSlice(ctx, "0")
	byDeadline := margin > 0
	// A session-level wait that the server ends before ctx's deadline
	// is read a little past it (pastDeadline).
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if byDeadline && lv == SessionLevel {
		sctx, cancel = pastDeadline(ctx)
	}
	// A driver's own cancel can reach the server before the statement
	// starts, and be lost (lib/pq sends one on a connection of its
	// own): should the statement still run stmt.AbandonGrace after its
	// context ended, the backend is cancelled from here. The statement
	// and that cancel each claim the end of the statement; one wins.
	var returned atomic.Bool
	stop := context.AfterFunc(sctx, func() {
		time.AfterFunc(stmt.AbandonGrace, func() {
			if returned.CompareAndSwap(false, true) {
				e.stopWait(ctx, pid, k)
			}
		})
	})
	if lv == XactLevel {
		q, args := e.Mode.XactLockSQL(kind&^sqltext.Try, k)
		if dl, ok := ctx.Deadline(); ok {
			// However close the deadline: in a transaction, no one
			// else can cancel a wait whose cancel was lost.
			margin = e.deadlineMargin(time.Until(dl))
			slice = strconv.FormatInt(max(time.Until(dl)-margin, time.Millisecond).Milliseconds(), 10) + "ms"
			byDeadline = true
			q, args = e.Mode.XactDeadlineLockSQL(kind&^sqltext.Try, k, slice)
		}
		began := time.Now()
		o.Err = w.QueryRow(ctx, q, args, &o.OK)
		if byDeadline && stmt.LockTimedOut(o.Err) && !stmt.CtxEnded(ctx) && ranInto(began, slice) {
			// The server ended the wait at the deadline (not at a
			// shorter lock_timeout of the transaction's own): not
			// granted; the transaction is aborted, and the caller
			// rolls it back.
			o.Err = ErrDeadline
		}
	} else {
		q, args := st.WaitSQL(kind&^sqltext.Try, k, slice, w.mark())
		o.Sent = stmt.MonoNow()
		o.Err = w.QueryRow(sctx, q, args, &o.OK, &o.PID, &o.Standby)
		if errors.Is(o.Err, sql.ErrNoRows) {
			o.Err = stmt.ForeignSession() // nothing was waited for
		}
		// The server's own answer (granted, or its lock_timeout), read
		// before the statement's context ended and not after a cancel
		// of ctx, is certain, however late for ctx's deadline.
		o.Certain = sctx != ctx && sctx.Err() == nil && !errors.Is(ctx.Err(), context.Canceled) &&
			(o.Err == nil || stmt.LockTimedOut(o.Err))
	}
	if !returned.CompareAndSwap(false, true) {
		o.Certain = false // a cancel of this backend is on its way: its next statement may meet it
	}
	stop()
	cancel()
	if byDeadline && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The server was to end the wait before the deadline, and its
		// answer did not come in time (a loaded machine or server; the
		// driver gave up, or the answer came once ctx had ended): the
		// session is lost to the uncertainty. Leave later waits a
		// larger margin (deadlineMargin counts three recent round
		// trips; this one took the whole margin and more).
		e.ObserveRTT(margin)
	}
	if lv == SessionLevel && stmt.LockTimedOut(o.Err) && (!stmt.CtxEnded(ctx) || o.Certain) {
		// The statement's lock_timeout (the deadline's) can come as the
		// lock is granted: PostgreSQL then keeps the grant and reports the
		// error all the same. "Not granted" would leave it held by a
		// connection going back to the pool: ask the session.
		if !e.grantedAfterTimeout(ctx, w, st, kind, k, &o) && byDeadline {
			// The server ended the wait just before ctx's deadline: not
			// granted, for sure, and the session is intact.
			o.Err = ErrDeadline
		}
	}
	switch {
	case stmt.CtxEnded(ctx) && errors.Is(o.Err, stmt.ErrAbandoned):
		e.stopAbandoned(ctx, pid, k)
	case stmt.CtxEnded(ctx) && (o.Err == nil || stmt.SQLState(o.Err) != "" || errors.Is(o.Err, ErrDeadline)):
		// The server answered the statement (granted, an error of its
		// own, or the deadline's lock_timeout and "not held"): the backend
		// is in no queue; the owner's discard ends it, or, not held for
		// sure, it goes back to the pool.
	case stmt.CtxEnded(ctx):
		// The abandoned backend may still be queued for k (a driver that
		// closes the socket sends no cancel request): take it out of the
		// queue before anyone can grant it the lock.
		e.stopWait(ctx, pid, k)
	}
	return o
}

// grantedAfterTimeout asks w's session, after its wait for k ended in
// 55P03, whether it holds k all the same, and reports whether o is now the
// outcome (granted, or the check failed: uncertain).
func (e *Engine) grantedAfterTimeout(ctx context.Context, w Waiter, st *sqltext.Statements, kind sqltext.Kind, k sqltext.Key, o *Outcome) bool {
	c, ob, sub := stmt.Tag(k)
	q, args := st.GrantedSQL(kind&^sqltext.Try, int64(c), int64(ob), sub, w.mark())
	g := Outcome{PID: o.PID, Sent: stmt.MonoNow()}
	// After a wait the server ended at the deadline, the question comes
	// within the deadline's margin, or, when the wait's answer was read
	// late, past the deadline; a loaded server may answer later still. It
	// gets stmt.AbandonGrace from whichever is later, not cut short with ctx (a
	// driver that gives a statement up poisons its connection): the call
	// returns at most that late, with a certain answer.
	gctx := ctx
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < stmt.AbandonGrace {
		var cancel context.CancelFunc
		gctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), later(dl, time.Now()).Add(stmt.AbandonGrace))
		defer cancel()
	}
	err := w.QueryRow(gctx, q, args, &g.OK, &g.PID, &g.Standby)
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		if e := gctx.Err(); e != nil {
			// Answered once its context had ended: lib/pq reads the
			// answer, then closes the connection, and the session's locks
			// with it. Nothing is certain.
			err = e
		}
	}
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false // not held: the 55P03 stands
	case err != nil:
		o.Err, o.Certain = err, false // the wait's answer was certain; this one is not
	default:
		e.Debug(ctx, LateGrant, k, slog.Int64("pid", g.PID))
		g.Certain = true
		*o = g
	}
	return true
}

// Outcome is what the server answered to an acquisition.
type Outcome struct {
	Sent    int64 // stmt.MonoNow when the statement that answered was sent (the lease)
	OK      bool  // granted
	PID     int64 // the backend
	Slot    int32 // a semaphore's slot granted
	Standby bool  // the server is a standby
	Err     error
	// Certain: the driver read the answer before the statement's context
	// ended (a wait bounded by ctx's deadline reads it a little past it),
	// so ctx's end does not make it uncertain.
	Certain bool
}
