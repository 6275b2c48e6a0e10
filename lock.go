package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Lock is a held session-level advisory lock, on a server session that the
// Locker keeps out of the pool until [Lock.Unlock]: a session shared with
// the Locker's other exclusive locks, or one of its own (see
// [Locker.Lock]). That session is sqllock's: statements that must run in
// the session that holds a lock run on a [Session]'s connection
// ([Session.Conn]), which holds its locks for the caller.
//
// A Lock is safe for concurrent use. After Unlock, or once the lock is lost,
// Done is closed and Err is non-nil; Unlock then returns an error and
// never panics, so `defer lk.Unlock(ctx)` is always safe, even on a nil Lock.
type Lock struct {
	pinned // its backend, lease, state, err, Done (see pinned.go)
	key    Key
	shared bool
	since  time.Time

	unlockMu sync.Mutex // serialises Unlock

	discarded chan struct{} // guarded by mu: set when lost, closed once the connection is discarded
	window    *time.Timer   // guarded by mu: the open hold window's release (see UnlockAfter)
	token     int64         // guarded by mu: the fencing token, 0 until asked for

	// c is the session that holds the lock: one of the Locker's shared
	// sessions, or one of its own (c.dedicated). Every statement about the
	// lock goes through c's queue.
	c *carrier
}

// newLock returns the handle of k, held in mode shared by c's session, and
// records it there; nil when c died meanwhile.
func newLock(c *carrier, k Key, shared bool) *Lock {
	lk := &Lock{pinned: pinned{l: c.l, pid: c.pid, id: c.id, lease: c.ls}, key: k, shared: shared, since: time.Now(), c: c}
	if !c.attach(lk) {
		return nil
	}
	return lk
}

// Key returns the lock's key (the zero Key for a nil Lock).
func (lk *Lock) Key() Key {
	if lk == nil {
		return Key{}
	}
	return lk.key
}

// PID returns the PostgreSQL backend process id that holds the lock (0 for
// a nil Lock).
func (lk *Lock) PID() int {
	if lk == nil {
		return 0
	}
	return int(lk.pid)
}

// Token returns the lock's fencing token: a number that grows across the
// successive holders of a key, so that a resource written under the lock
// can refuse a write from a holder that lost the lock and does not know it
// yet (a holder paused by a GC or a VM, then resumed after the lock went
// to another). Pass it along with each write, and have the resource keep
// the largest token it has seen and refuse smaller ones; in the same
// PostgreSQL, in one statement (<=, not <: the holder's own next write
// carries the same token):
//
//	UPDATE jobs SET ..., fence = $token WHERE id = $id AND fence <= $token
//
// The token is the server's transaction counter (txid_current), read on
// the lock's own session while it holds the lock, in one round trip the
// first time Token is called, and cached: successive holders' tokens are
// ordered because their holding intervals are. It needs no table. Its
// limits: a failover to a standby that had not replayed the counter (with
// asynchronous replication) can issue a smaller token again; a standby
// cannot issue one at all; and each token uses up a transaction id. Token
// returns an error wrapping [ErrLockLost] when the session does not hold
// the lock any more, and [ErrReleased] after Unlock. ctx bounds the round
// trip.
func (lk *Lock) Token(ctx context.Context) (int64, error) {
	mustContext(ctx, "Lock.Token")
	if lk == nil {
		return 0, ErrReleased
	}
	lk.mu.Lock()
	t, err := lk.token, lk.err
	lk.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if t != 0 {
		return t, nil
	}
	if t, err = lk.onSession(ctx, sqltext.TokenSQL); err != nil {
		return 0, err
	}
	if ctxEnded(ctx) {
		// The statement may have been cut short as its commit waited for
		// a synchronous standby: PostgreSQL then answers all the same,
		// with a token that the standby may not have.
		return 0, fmt.Errorf("sqllock: token of %s: %w", lk.l.name(lk.key), ctxErr(ctx))
	}
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.err != nil {
		return 0, lk.err
	}
	if lk.token == 0 {
		lk.token = t
	}
	return lk.token, nil
}

// onSession runs q, a statement about the lock's tag ($1, $2, $3) that
// answers one integer on the session that holds it and no row otherwise,
// on the lock's session, through its queue (ctx bounds the wait for the
// answer, not the statement, so that no driver poisons the session by
// giving a statement up). No row is the server's word that the lock is
// lost, and so is a session that ended under the statement: the lock is
// then marked lost at once, and the error wraps ErrLockLost. Once Unlock
// has begun, it returns ErrReleased or the loss, never a value it did not
// get.
func (lk *Lock) onSession(ctx context.Context, q string) (int64, error) {
	if err := ctx.Err(); err != nil {
		// Nothing sent (a token would use up a transaction id for no one).
		if e := lk.Err(); e != nil {
			return 0, e
		}
		return 0, fmt.Errorf("sqllock: %s: %w", lk.l.name(lk.key), err)
	}
	c, o, sub := lk.key.lockTag()
	q, args := lk.l.mode.TagArgs(q, int64(c), int64(o), sub)
	v, ok, err := lk.c.onTag(ctx, q, args)
	if err == nil && !ok {
		err = sql.ErrNoRows
	}
	if err == nil {
		return v, nil
	}
	switch {
	case errors.Is(err, ErrLockLost):
		return 0, err // lost before the statement was sent
	case lk.releasing():
		// Unlock took the session (it may have closed it) or the lock
		// from under the statement.
	case errors.Is(err, sql.ErrNoRows):
		lk.lose(fmt.Errorf("its session (backend %d) no longer holds it", lk.pid))
	case lk.error() != nil:
		// Its session ended under the statement, and told it.
	default:
		return 0, fmt.Errorf("sqllock: %s: %w", lk.l.name(lk.key), err)
	}
	if e := lk.Err(); e != nil {
		return 0, e
	}
	return 0, ErrReleased
}

// releasing reports whether Unlock has begun (or ended).
func (lk *Lock) releasing() bool {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.state == stateReleasing || lk.state == stateReleased
}

// Done returns a channel that is closed when the lock is released or lost
// (already closed for a nil Lock).
func (lk *Lock) Done() <-chan struct{} {
	if lk == nil {
		return closedChan
	}
	return lk.done()
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Err returns nil while the lock is held. After Unlock it returns
// [ErrReleased]; after a loss, an error wrapping [ErrLockLost] and its cause
// (and [ErrSessionChanged] when a pooler swapped the session).
func (lk *Lock) Err() error {
	if lk == nil {
		return ErrReleased
	}
	if lk.lease.expired() {
		lk.lose(lk.lease.expiredError())
	}
	return lk.error()
}

// Unlock releases the lock and returns the connection to the pool once
// PostgreSQL confirms the unlock on the backend that was granted the lock;
// otherwise it discards the connection, so the server releases the lock as
// the session ends.
//
// Unlock does not run its statement under ctx: the statement is bounded by
// the Locker's unlock timeout instead, so Unlock works with an already
// cancelled context; ctx's values reach the Locker's logger. It returns [ErrReleased] for a nil or released lock, an error
// wrapping [ErrLockLost] when the lock turned out not to be held (lost while
// held: the critical section may not have been exclusive), and an error
// wrapping the cause when the unlock statement failed (the connection is
// then discarded and the lock is released by the server).
func (lk *Lock) Unlock(ctx context.Context) error {
	mustContext(ctx, "Lock.Unlock")
	if lk == nil {
		return ErrReleased
	}
	lk.unlockMu.Lock()
	defer lk.unlockMu.Unlock()
	lk.mu.Lock()
	state, lostErr, discarded := lk.state, lk.err, lk.discarded
	if state == stateHeld {
		lk.state = stateReleasing
		lk.closeWindow()
	}
	lk.mu.Unlock()
	if state == stateReleased {
		return ErrReleased
	}
	lk.l.mon.remove(lk)
	var err error
	final := ErrReleased
	switch {
	case state == stateLost:
		// Reported, logged, counted and discarded when it was found lost;
		// wait for that discard, so that Unlock returns with the session
		// ended or ending.
		select {
		case <-discarded:
		case <-time.After(lk.l.cfg.unlockTimeout):
		}
		err, final = lostErr, lostErr
	default:
		err = lk.c.release(lk)
		e := Event{Kind: EventReleased, Key: lk.key, PID: int(lk.pid), Err: err}
		if errors.Is(err, ErrLockLost) {
			e.Kind, final = EventLost, err
		}
		if len(lk.l.observers) > 0 { // nothing is built on the hot path unless someone listens
			e.Name, e.Held = lk.l.regName(lk.key), time.Since(lk.since)
		}
		lk.l.emit(ctx, e, 1)
	}
	lk.settle(stateReleased, final)
	return err
}

// lose marks a held lock as lost with cause; it does nothing once Unlock
// has begun. The session is discarded, and every lock on it is lost with
// it: whatever the keep-alive saw (the key gone, or no answer at all),
// only the end of the session makes sure that it holds nothing should the
// network heal, behind the back of a holder that was told it lost the
// lock; a session that ended anyway loses nothing more. The holder is
// told first (Err), then the session ends, then the observers are told,
// then Done closes: an observer may Unlock the lost lock, which then
// finds its session ended or ending, and whoever waits on Done sees the
// stats and the events.
func (lk *Lock) lose(cause error) {
	n, ok := lk.markLost(cause)
	if !ok {
		return
	}
	lk.c.fail(cause)
	n.tell()
}

// lossNote is a loss marked, to tell: its event for the observers, and
// the end of its handle (Done), after them.
type lossNote struct {
	l   *Locker
	e   Event
	end func()
}

// tell tells the observers of the loss, then closes the handle's Done.
func (n lossNote) tell() {
	n.l.tell(context.Background(), n.e)
	n.end()
}

// markLost marks a held lock lost with cause (Err says so from now on)
// and counts it; it returns the loss to tell (see lossNote), and false
// when the lock was not held (lost already, or Unlock has begun). The
// lock leaves its session once that session has ended.
func (lk *Lock) markLost(cause error) (lossNote, bool) {
	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return lossNote{}, false
	}
	lk.state = stateLost
	lk.closeWindow()
	lk.err = fmt.Errorf("%w: %s: %w", ErrLockLost, lk.l.name(lk.key), cause)
	err := lk.err
	discarded := make(chan struct{})
	lk.discarded = discarded
	lk.mu.Unlock()
	c := lk.c
	go func() {
		<-c.gone
		c.detach(lk)
		close(discarded)
	}()
	e := Event{Kind: EventLost, Key: lk.key, Name: lk.l.regName(lk.key), PID: int(lk.pid), Held: time.Since(lk.since), Err: err}
	lk.l.count(e, 1)
	return lossNote{lk.l, e, lk.end}, true
}

// unlockAnswer is the one rule book for the answer to an unlock of the
// lock named what on backend pid (err and released, as the statement gave
// them): nil when the server confirmed it there, and otherwise the call's
// error and whether the session is in doubt (it may still hold the lock,
// or ended at a moment no one can tell) and must end. A certain "not
// held" (false, on that backend) is an error wrapping ErrLockLost that
// touches that one lock: the critical section may not have been
// exclusive.
func unlockAnswer(what string, pid int64, err error, released bool) (uncertain bool, _ error) {
	switch {
	case err == nil && released:
		return false, nil
	case err == nil:
		return false, fmt.Errorf("%w: unlock of %s on backend %d found no such lock", ErrLockLost, what, pid)
	case errors.Is(err, sql.ErrNoRows) || errors.Is(err, ErrSessionChanged):
		// No row: the statement ran on another backend than the one
		// granted the lock.
		return true, fmt.Errorf("%w: lock %s: %w", ErrLockLost, what, sessionChanged(pid, 0))
	case errors.Is(err, sql.ErrConnDone) || !errors.Is(err, errAbandoned) && connectionBroken(err):
		// The session ended (terminated, restarted, cut off; database/sql
		// closes a connection its driver found broken) before the unlock:
		// the lock went with it, at a moment no one can tell.
		return true, fmt.Errorf("%w: %s: its session (backend %d) ended before the unlock: %w", ErrLockLost, what, pid, err)
	}
	return true, fmt.Errorf("sqllock: unlock %s: %w (the session is discarded; the server releases the lock as it ends)", what, err)
}

// unlockContext returns the context that bounds an unlock statement
// starting now: detached from every caller, and cancelled between one and
// 1.25 unlock timeouts from now. Unlocks that start within the same quarter
// of a timeout share one context and one timer, so that the hot path does
// not pay for a timer per unlock.
func (l *Locker) unlockContext() context.Context {
	now := time.Now()
	l.epochMu.Lock()
	defer l.epochMu.Unlock()
	if l.epochCtx == nil || !now.Before(l.epochUntil) {
		epoch := l.cfg.unlockTimeout / 4
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(l.cfg.unlockTimeout+epoch, cancel)
		l.epochCtx, l.epochUntil = ctx, now.Add(epoch)
	}
	return l.epochCtx
}

// discard closes conn's session instead of returning it to the pool.
func (l *Locker) discard(conn *sql.Conn, k Key, why string) {
	l.emit(context.Background(), Event{Kind: EventDiscarded, Key: k, Name: l.regName(k), Err: errors.New(why)}, 1)
	if l.abandoned.has(conn) {
		return // its abandoned statement closes it as it returns
	}
	discardConn(conn)
}

// putBack gives conn, which holds no lock, back to the pool as it is; a
// connection whose statement was abandoned closes as that statement
// returns (closing it now would wait for it).
func (l *Locker) putBack(conn *sql.Conn) {
	if l.abandoned.has(conn) {
		return
	}
	conn.Close()
}

func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// run calls fn with a context that ends when ctx does or the lock is lost,
// then unlocks, even if fn panics; with a hold window w, no sooner than w
// after the lock was taken.
func (lk *Lock) run(ctx context.Context, fn func(context.Context) error, w time.Duration) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.context(), func() { cancel(lk.Err()) })
	defer func() {
		stop()
		cancel(nil)
		if w > 0 && time.Since(lk.since) < w {
			// The release comes later; the server confirms now that fn
			// ran under the lock, as an unlock would.
			if _, cerr := lk.onSession(lk.l.unlockContext(), sqltext.HeldSQL); cerr != nil {
				err = runError(err, cerr)
				lk.Unlock(ctx)
				return
			}
			if uerr := lk.UnlockAfter(w); uerr != nil && !errors.Is(uerr, ErrReleased) {
				err = runError(err, uerr)
			}
			return
		}
		err = runError(err, lk.Unlock(ctx))
	}()
	return fn(fctx)
}

// runError combines fn's error with the unlock's into one error that reads
// once and matches both with errors.Is. fn usually returns its context's
// error, or the cause (the very error Unlock returns), once a lost lock
// cancelled it.
func runError(fnErr, unlockErr error) error {
	switch {
	case unlockErr == nil:
		return fnErr
	case fnErr == nil || errors.Is(fnErr, unlockErr):
		return unlockErr
	case errors.Is(fnErr, context.Canceled) && errors.Is(unlockErr, ErrLockLost):
		return fmt.Errorf("%w (fn returned: %w)", unlockErr, fnErr)
	}
	return fmt.Errorf("%w; then %w", fnErr, unlockErr)
}

// Hold windows: a lock held until at least some time after it was taken,
// released in the background (Lock.UnlockAfter, WithHoldAtLeast).

// UnlockAfter releases the lock in the background once at least d has
// passed since it was acquired (at once if that time has passed), and
// returns without waiting: a hold window. With jobs that several machines
// fire on the same schedule, a window between the largest skew of their
// clocks and schedulers and the schedule's period makes the job run once
// per tick, however short it is (a plain release lets a late machine run
// the tick again).
//
// Until the window ends the lock is held as any other: Done, Err and the
// keep-alive work, [Stats].Held and Windows count it, and a loss is logged.
// The release's outcome goes to the Locker's logger (Warn when it failed).
// The window lives in this process: if the program exits first, the
// session ends and the server releases the lock then. UnlockAfter returns
// ErrReleased, or the loss, for a lock that is no longer held, and
// ErrReleased for a nil Lock; Unlock may still be called during the window,
// to release it early (the window then ends). Calling UnlockAfter again
// replaces the window: the release happens d after acquisition for the
// last d given. d is at most 7 days (168 h): a longer one is an error, and
// the lock is left as it was.
func (lk *Lock) UnlockAfter(d time.Duration) error {
	if lk == nil {
		return ErrReleased
	}
	if err := windowError("Lock.UnlockAfter", d); err != nil {
		return err
	}
	if err := lk.Err(); err != nil {
		return err
	}
	wait := time.Until(lk.since.Add(d))
	if wait <= 0 {
		return lk.Unlock(context.Background())
	}
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.state != stateHeld {
		return lk.err
	}
	if lk.window != nil {
		lk.window.Stop() // a second window replaces the first
	} else {
		lk.l.stats.windows.Add(1)
	}
	lk.window = time.AfterFunc(wait, func() {
		if err := lk.Unlock(context.Background()); err != nil && !errors.Is(err, ErrReleased) {
			lk.l.log(context.Background(), slog.LevelWarn, "sqllock: release after the hold window failed", lk.key, slog.Any("error", err))
		}
	})
	return nil
}

// closeWindow ends the lock's hold window, if one is open: the lock is
// being released (early, or at the window's end) or was lost. The caller
// holds mu.
func (lk *Lock) closeWindow() {
	if lk.window != nil {
		lk.window.Stop()
		lk.window = nil
		lk.l.stats.windows.Add(-1)
	}
}
