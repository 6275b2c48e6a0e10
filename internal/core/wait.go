package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"github.com/sqllock/sqllock/internal/core/stmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The waiting engine. Every lock call that may wait goes through it (a
// Pool's exclusive tries are first sent on a shared session, share.go,
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
// session is discarded (settle, Owned.lose) or the transaction
// rolled back (InTx).

// engine is the acquisition engine: a value, which a Pool holds (and
// feeds with its statements and keys), and which the transaction locks
// (LockTx and kin) use with no Pool at all.
type engine struct {
	// db is the pool an abandoned wait is cancelled from (stopWait);
	// nil for LockTx and kin, which have none. budget counts the
	// connections taken from it outside sessions (see budget.go).
	db     *sql.DB
	budget *stmt.Budget
	mode   sqltext.Mode
	// abandoned is non-nil for drivers that do not give up a read when its
	// context ends (lib/pq): their statements are bounded by boundedRaw,
	// and it holds the connections left to finish alone.
	abandoned *stmt.AbandonSet
	rtt       atomic.Int64           // recent round trip, ns (see observeRTT)
	slice     atomic.Pointer[string] // see waitSlice
	// snapshotWaits counts waits that a holder's CREATE INDEX
	// CONCURRENTLY found (Stats.SnapshotWaits).
	snapshotWaits atomic.Int64
	// simpleFor, when set, prepares a connection of db for the engine's
	// statements behind a transaction pooler (see Pool.simpleFor).
	simpleFor func(conn *sql.Conn) (done func())
	// trace receives the engine's debug messages (nil: none), warn its
	// warnings.
	trace func(ctx context.Context, msg string, k Key, attrs ...slog.Attr)
	warn  func(ctx context.Context, msg string, k Key, attrs ...slog.Attr)
	// bypassed is set once a waiter waited without its place in line
	// (see bypass): the first is logged.
	bypassed atomic.Bool
}

// pinned reports whether the engine's sessions are transactions kept open
// behind a transaction pooler (see Pool.simpleFor).
func (e *engine) pinned() bool { return e.simpleFor != nil }

// debug hands a debug message to trace.
func (e *engine) debug(ctx context.Context, msg string, k Key, attrs ...slog.Attr) {
	if e.trace != nil {
		e.trace(ctx, msg, k, attrs...)
	}
}

// waiter is a session the engine runs statements on.
type waiter interface {
	queryRow(ctx context.Context, q string, args []any, dest ...any) error
	// mark is the session's owner mark (see sqltext.Statements; "" for a
	// transaction's).
	mark() string
}

// connWaiter is a connection of the Pool's, marked m: statements run on
// the driver connection, bounded for drivers that ignore their context
// (lib/pq). On a pinned session (pinned: see pinned.go) each statement of
// a wait runs in a savepoint, which its error rolls back: a lock_timeout,
// a deadlock or a cancel must not abort the transaction that holds the
// session's other locks.
type connWaiter struct {
	conn   *sql.Conn
	blind  *stmt.AbandonSet
	m      string
	pinned bool
}

// waiterOf returns s's connection as a waiter.
func (cs *connections) waiterOf(s *session) connWaiter {
	p := cs.p
	return connWaiter{conn: s.conn, blind: p.abandoned, m: s.mark, pinned: p.cfg.TxPooler}
}

func (w connWaiter) mark() string { return w.m }

func (w connWaiter) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	if !w.pinned || !sqltext.Waits(q) {
		return stmt.QueryRow(ctx, w.blind, w.conn, q, args, dest...)
	}
	if err := txExecOn(ctx, w.blind, w.conn, sqltext.SavepointSQL); err != nil {
		return err
	}
	err := stmt.QueryRow(ctx, w.blind, w.conn, q, args, dest...)
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
	if eerr := txExecOn(ectx, w.blind, w.conn, end); eerr != nil && (err == nil || stmt.SQLState(err) != "") {
		return eerr // the transaction is in doubt: so is the session
	}
	return err
}

// TxQuerier is what the engine needs of a transaction: *sql.Tx and
// *sqlx.Tx have it.
type TxQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// txWaiter is a transaction.
type txWaiter struct{ tx TxQuerier }

func (txWaiter) mark() string { return "" }

// queryRow runs q in the transaction, bounded by ctx (see bounded): the
// row is read into values of its own, so that a statement left to finish
// alone writes nothing of the caller's.
func (w txWaiter) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	vals, err := stmt.Bounded(ctx, func() ([]driver.Value, error) {
		raw := make([]any, len(dest))
		ptrs := make([]any, len(dest))
		for i := range raw {
			ptrs[i] = &raw[i]
		}
		if err := w.tx.QueryRowContext(ctx, q, args...).Scan(ptrs...); err != nil {
			return nil, err
		}
		vals := make([]driver.Value, len(raw))
		for i, v := range raw {
			vals[i] = v
		}
		return vals, nil
	}, nil)
	if err != nil {
		return err
	}
	return stmt.Assign(dest, vals)
}

// outcome is what the server answered to an acquisition.
type level uint8

const (
	sessionLevel level = iota // pg_advisory_lock and kin, on a session
	xactLevel                 // pg_advisory_xact_lock and kin, in a transaction
)

// tryOn runs the non-waiting statement of kind for k on w: one round trip,
// which also reports the backend's pid. Its answer is read for up to
// abandonGrace past ctx's end (see withGrace): a backend that runs the
// statement late, on a loaded machine, still tells the call whether it
// was granted, rather than taking the key after the call returned. An
// answer read so is certain (o.certain) on a session: the caller judges
// it; a transaction's is not (see settleTx).
func (e *engine) tryOn(ctx context.Context, w waiter, lv level, st *statements, kind Kind, k Key) outcome {
	var o outcome
	gctx := ctx
	if ctx.Done() != nil {
		var cancel context.CancelFunc
		gctx, cancel = withGrace(ctx)
		defer cancel()
	}
	if lv == xactLevel {
		// The same statement for every call, whatever ctx: it takes
		// nothing on a standby.
		q, args := e.mode.XactTrySQL(kind, k)
		o.err = w.queryRow(gctx, q, args, &o.ok, &o.pid, &o.standby)
		return o
	}
	q, args := st.TrySQL(kind|sqltext.Try, k, w.mark())
	if !kind.IsTry() {
		// A call that will wait: it passes no one in the key's line.
		q, args = st.PoliteTrySQL(kind, k, sqltext.TicketClass(k), w.mark())
	}
	o.sent = stmt.MonoNow()
	var ok sql.NullBool
	o.err = w.queryRow(gctx, q, args, &ok, &o.pid, &o.standby)
	o.ok = ok.Bool
	if o.err == nil && !ok.Valid {
		o.err = stmt.ForeignSession() // nothing was tried
	}
	if o.err == nil {
		e.observeRTT(time.Duration(stmt.MonoNow() - o.sent))
		o.certain = gctx.Err() == nil
	}
	return o
}

// waitOn waits for k on w, backend pid, in one statement, until the lock
// is granted, the statement fails, or ctx ends: a Session's wait, a
// transaction's (they may hold other locks: PostgreSQL's deadlock
// detector sees the wait whole). No lock_timeout of the role or database
// ends it, ctx's deadline does (the server keeps it too). When ctx ends
// during the wait, the backend leaves the queue before waitOn returns.
// (A Locker's waits are sliced, in a line: see waitInLine.)
func (e *engine) waitOn(ctx context.Context, w waiter, lv level, st *statements, kind Kind, k Key, pid int64) outcome {
	o := outcome{pid: pid}
	e.debug(ctx, "sqllock: waiting", k, slog.Bool("shared", kind.IsShared()), slog.Int64("pid", pid))
	// The server keeps ctx's deadline too: a cancel that never reaches
	// it cannot leave the wait running past the deadline.
	slice, margin := e.deadlineSlice(ctx, "0")
	byDeadline := margin > 0
	// A session-level wait that the server ends before ctx's deadline
	// is read a little past it (pastDeadline).
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if byDeadline && lv == sessionLevel {
		sctx, cancel = pastDeadline(ctx)
	}
	// A driver's own cancel can reach the server before the statement
	// starts, and be lost (lib/pq sends one on a connection of its
	// own): should the statement still run abandonGrace after its
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
	if lv == xactLevel {
		q, args := e.mode.XactLockSQL(kind&^sqltext.Try, k)
		if dl, ok := ctx.Deadline(); ok {
			// However close the deadline: in a transaction, no one
			// else can cancel a wait whose cancel was lost.
			margin = e.deadlineMargin(time.Until(dl))
			slice = strconv.FormatInt(max(time.Until(dl)-margin, time.Millisecond).Milliseconds(), 10) + "ms"
			byDeadline = true
			q, args = e.mode.XactDeadlineLockSQL(kind&^sqltext.Try, k, slice)
		}
		began := time.Now()
		o.err = w.queryRow(ctx, q, args, &o.ok)
		if byDeadline && stmt.LockTimedOut(o.err) && !stmt.CtxEnded(ctx) && ranInto(began, slice) {
			// The server ended the wait at the deadline (not at a
			// shorter lock_timeout of the transaction's own): not
			// granted; the transaction is aborted, and the caller
			// rolls it back.
			o.err = errDeadline
		}
	} else {
		q, args := st.WaitSQL(kind&^sqltext.Try, k, slice, w.mark())
		o.sent = stmt.MonoNow()
		o.err = w.queryRow(sctx, q, args, &o.ok, &o.pid, &o.standby)
		if errors.Is(o.err, sql.ErrNoRows) {
			o.err = stmt.ForeignSession() // nothing was waited for
		}
		// The server's own answer (granted, or its lock_timeout), read
		// before the statement's context ended and not after a cancel
		// of ctx, is certain, however late for ctx's deadline.
		o.certain = sctx != ctx && sctx.Err() == nil && !errors.Is(ctx.Err(), context.Canceled) &&
			(o.err == nil || stmt.LockTimedOut(o.err))
	}
	if !returned.CompareAndSwap(false, true) {
		o.certain = false // a cancel of this backend is on its way: its next statement may meet it
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
		e.observeRTT(margin)
	}
	if lv == sessionLevel && stmt.LockTimedOut(o.err) && (!stmt.CtxEnded(ctx) || o.certain) {
		// The statement's lock_timeout (the deadline's) can come as the
		// lock is granted: PostgreSQL then keeps the grant and reports the
		// error all the same. "Not granted" would leave it held by a
		// connection going back to the pool: ask the session.
		if !e.grantedAfterTimeout(ctx, w, st, kind, k, &o) && byDeadline {
			// The server ended the wait just before ctx's deadline: not
			// granted, for sure, and the session is intact.
			o.err = errDeadline
		}
	}
	switch {
	case stmt.CtxEnded(ctx) && errors.Is(o.err, stmt.ErrAbandoned):
		e.stopAbandoned(ctx, pid, k)
	case stmt.CtxEnded(ctx) && (o.err == nil || stmt.SQLState(o.err) != "" || errors.Is(o.err, errDeadline)):
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
func (e *engine) grantedAfterTimeout(ctx context.Context, w waiter, st *statements, kind Kind, k Key, o *outcome) bool {
	c, ob, sub := Tag(k)
	q, args := st.GrantedSQL(kind&^sqltext.Try, int64(c), int64(ob), sub, w.mark())
	g := outcome{pid: o.pid, sent: stmt.MonoNow()}
	// After a wait the server ended at the deadline, the question comes
	// within the deadline's margin, or, when the wait's answer was read
	// late, past the deadline; a loaded server may answer later still. It
	// gets abandonGrace from whichever is later, not cut short with ctx (a
	// driver that gives a statement up poisons its connection): the call
	// returns at most that late, with a certain answer.
	gctx := ctx
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < stmt.AbandonGrace {
		var cancel context.CancelFunc
		gctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), later(dl, time.Now()).Add(stmt.AbandonGrace))
		defer cancel()
	}
	err := w.queryRow(gctx, q, args, &g.ok, &g.pid, &g.standby)
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
		o.err, o.certain = err, false // the wait's answer was certain; this one is not
	default:
		e.debug(ctx, lateGrant, k, slog.Int64("pid", g.pid))
		g.certain = true
		*o = g
	}
	return true
}

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
func (e *engine) deadlineMargin(left time.Duration) time.Duration {
	m := min(max(left/10, 50*time.Millisecond), 100*time.Millisecond)
	return min(max(m, 3*time.Duration(e.rtt.Load())), left/2)
}

// observeRTT feeds the Pool's recent round trip with one statement that
// took d: a moving average that follows a slower server at once, and a
// faster one gradually.
func (e *engine) observeRTT(d time.Duration) {
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
// abandonGrace after that.
const answerGrace = stmt.AbandonGrace

// ranInto reports whether a statement that began at began ran for about
// its lock_timeout, timeout (as deadlineSlice wrote it).
func ranInto(began time.Time, timeout string) bool {
	d, err := time.ParseDuration(timeout)
	return err == nil && time.Since(began) >= d*9/10
}

// errDeadline is the outcome of a wait that the server ended (lock_timeout)
// just before ctx's deadline: not granted, the session intact.
var errDeadline = errors.New("the wait ended at the context's deadline")

// deadlineSlice bounds a wait's lock_timeout, slice ("0": none), by ctx's
// deadline less deadlineMargin, and returns the margin when the deadline
// is the bound (0 otherwise). A wait that runs into its deadline in the client leaves its
// outcome uncertain, which costs the session (a driver that gives a
// statement up may close the connection anyway); one that the server ends
// first is a certain "not granted", and the connection stays usable: a
// wait always has a server-side bound when ctx has a deadline.
func (e *engine) deadlineSlice(ctx context.Context, slice string) (string, time.Duration) {
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
		// round trip leaves observeRTT's average as it is.)
		return "1ms", max(margin, time.Duration(e.rtt.Load()), time.Millisecond)
	}
	if slice != "0" {
		if d, err := time.ParseDuration(slice); err == nil && d <= left {
			return slice, 0
		}
	}
	return strconv.FormatInt(left.Milliseconds(), 10) + "ms", margin
}

// withConn runs take on a connection of the pool, checked against the

// stopAbandoned is stopWait for a wait whose driver did not give the
// statement up in time (ErrAbandoned): the server may be cut off, or only
// slow. It waits for the cancel no longer than the driver got
// (abandonGrace): if nothing reaches the server, the call must still
// return by its deadline.
func (e *engine) stopAbandoned(ctx context.Context, pid int64, k Key) {
	done := make(chan struct{})
	go func() { e.stopWait(ctx, pid, k); close(done) }()
	select {
	case <-done:
	case <-time.After(stmt.AbandonGrace):
	}
}

// cancelWaitTimeout bounds stopWait.
const cancelWaitTimeout = 2 * time.Second

// stopWait takes backend pid, whose wait for k its client abandoned, out
// of k's queue, from another pooled connection, and waits (bounded) until
// it has left. Some drivers (pgx) close the socket of a cancelled statement
// without a cancel request; the backend then stays queued until it is
// granted the lock, and holds it until it notices that its client is gone.
// The wait statement may not even have started when the client gave up
// (it sits in the backend's socket buffer): stopWait then watches the
// backend until it runs the statement (and cancels it), finishes it, or
// ends. It is best effort: when no connection can be had in time, the
// server still releases the lock as the abandoned session ends. It takes
// at most cancelWaitTimeout, and no longer than that past the deadline of
// the wait's ctx, if it had one: the call returns by then.
func (e *engine) stopWait(waitCtx context.Context, pid int64, k Key) {
	if e.db == nil || pid == 0 {
		return // the engine without a pool (LockTx), or no backend known
	}
	until := time.Now().Add(cancelWaitTimeout)
	if dl, ok := waitCtx.Deadline(); ok && dl.Add(cancelWaitTimeout).Before(until) {
		until = dl.Add(cancelWaitTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	// A connection and statements bounded like the lock's own: a server
	// that stopped answering cannot hold this past its timeout. A pool at
	// its limit, or a budget spent (see budget.go), may have no connection
	// to give until the caller's own, abandoned one is discarded, after
	// this returns: wait for one no longer than abandonGrace then (that
	// discard ends the backend, which takes it out of the queue too, a
	// little later).
	cctx := ctx
	if st := e.db.Stats(); st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections || e.budget.Count() >= stmt.BudgetLimit(st) {
		var stop context.CancelFunc
		cctx, stop = context.WithTimeout(ctx, stmt.AbandonGrace)
		defer stop()
	}
	conn, err := e.takeConn(cctx)
	if err != nil {
		return
	}
	defer e.budget.Give() // once conn is closed, or left to its statement
	if e.simpleFor != nil {
		defer e.simpleFor(conn)()
	}
	var doneSince time.Time
	for ctx.Err() == nil {
		var where int64
		err := stmt.QueryRow(ctx, e.abandoned, conn, sqltext.CancelWaitSQL, []any{pid}, &where)
		if errors.Is(err, stmt.ErrAbandoned) {
			return // its connection is closed once the statement returns
		}
		if err != nil || where == 0 {
			break
		}
		// Done with a wait statement: this one, or, should the server not
		// have read this one yet, an earlier one on the same connection.
		// Watch a little longer before believing it.
		if where == 3 {
			if doneSince.IsZero() {
				doneSince = time.Now()
			} else if time.Since(doneSince) > cancelWaitSettle {
				break
			}
		} else {
			doneSince = time.Time{}
		}
		time.Sleep(time.Millisecond)
	}
	// Granted as the cancel came: the lock goes with the backend, before
	// the caller, told it has nothing, returns.
	var ended bool
	if err := stmt.QueryRow(ctx, e.abandoned, conn, sqltext.TerminateHolderSQL, sqltext.DiscardHolderArgs(pid, k), &ended); err == nil && ended {
		for ctx.Err() == nil {
			var where int64
			if err := stmt.QueryRow(ctx, e.abandoned, conn, sqltext.CancelWaitSQL, []any{pid}, &where); err != nil || where == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	conn.Close()
}

// cancelWaitSettle is how long stopWait keeps watching a backend that
// seems done with its wait statement.
const cancelWaitSettle = 50 * time.Millisecond

// takeConn returns a spare connection of the Pool's, or counts one in its
// budget, waiting for room with ctx, and gets it from the pool (see
// getConn). It stays counted until its taker gives it back (putBack,
// budget.done), or makes it a session (newSession). When ctx ends during
// its setup, the setup goes on, counted, until the connection is a spare.
func (e *engine) takeConn(ctx context.Context) (*sql.Conn, error) {
	if conn := e.budget.TakeSpare(); conn != nil {
		return conn, nil
	}
	if err := e.budget.Take(ctx); err != nil {
		return nil, err
	}
	conn, err, left := stmt.GetConn(ctx, e.db, e.budget)
	if err != nil && !left {
		e.budget.Give()
	}
	return conn, err
}
