package sqllock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/core"
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
	l   *Locker
	h   *core.Hold // the lock, on its session (see core.Hold): &own, or a semaphore's permit
	key Key
	own core.Hold // where the core makes a lock's Hold (core.Request.Into): one allocation per lock

	unlockMu sync.Mutex // serialises Unlock

	mu     sync.Mutex
	window *time.Timer // guarded by mu: the open hold window's release (see UnlockAfter)
	token  int64       // guarded by mu: the fencing token, 0 until asked for
}

// newLock returns the handle of h, the lock of k.
func newLock(l *Locker, h *core.Hold, k Key) *Lock {
	return &Lock{l: l, h: h, key: k}
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
	return int(lk.h.PID())
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
	if err := lk.h.Err(); err != nil {
		return 0, err
	}
	lk.mu.Lock()
	t := lk.token
	lk.mu.Unlock()
	if t != 0 {
		return t, nil
	}
	t, err := lk.h.Token(ctx)
	if err != nil {
		return 0, err
	}
	if stmt.CtxEnded(ctx) {
		// The statement may have been cut short as its commit waited for
		// a synchronous standby: PostgreSQL then answers all the same,
		// with a token that the standby may not have.
		return 0, fmt.Errorf("sqllock: token of %s: %w", lk.l.name(lk.key), stmt.CtxErr(ctx))
	}
	if err := lk.h.Err(); err != nil {
		return 0, err
	}
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.token == 0 {
		lk.token = t
	}
	return lk.token, nil
}

// Done returns a channel that is closed when the lock is released or lost
// (already closed for a nil Lock).
func (lk *Lock) Done() <-chan struct{} {
	if lk == nil {
		return closedChan
	}
	return lk.h.Done()
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Err returns nil while the lock is held. After Unlock it returns
// [ErrReleased]; after a loss, an error wrapping [ErrLockLost] and its cause
// (and [ErrSessionChanged] when a pooler swapped the session).
func (lk *Lock) Err() error {
	if lk == nil {
		return ErrReleased
	}
	return lk.h.Err()
}

// Unlock releases the lock: the Locker's next caller waiting for its key
// takes it over (see [Locker.Lock]), or its session unlocks it, and the
// session goes back to the pool once PostgreSQL confirms the unlock on the
// backend that was granted the lock (a shared session, once it holds
// nothing for a while); otherwise the session is discarded, so the server
// releases the lock as the session ends.
//
// Unlock does not run its statement under ctx: the statement is bounded by
// the Locker's unlock timeout instead, so Unlock works with an already
// cancelled context; ctx's values reach the Locker's logger. It returns
// [ErrReleased] for a nil or released lock, an error wrapping
// [ErrLockLost] when the lock turned out not to be held (lost while held:
// the critical section may not have been exclusive), and an error wrapping
// the cause when the unlock statement failed (the session is then
// discarded and the lock is released by the server).
func (lk *Lock) Unlock(ctx context.Context) error {
	mustContext(ctx, "Lock.Unlock")
	if lk == nil {
		return ErrReleased
	}
	lk.unlockMu.Lock()
	defer lk.unlockMu.Unlock()
	lk.mu.Lock()
	lk.closeWindow()
	lk.mu.Unlock()
	first, err := lk.h.Release()
	if first && !errors.Is(err, ErrLockLost) { // a loss is told by the core
		e := Event{Kind: EventReleased, Key: lk.key, PID: int(lk.h.PID()), Err: err}
		if len(lk.l.observers) > 0 { // nothing is built on the hot path unless someone listens
			e.Name, e.Held = lk.l.regName(lk.key), time.Since(lk.h.Since())
			lk.l.tell(ctx, e)
		}
	}
	return err
}

// run calls fn with a context that ends when ctx does or the lock is lost,
// then unlocks, even if fn panics; with a hold window (c.holdAtLeast), no
// sooner than the window's end; with a bound (c.holdAtMost), at the bound
// at the latest, fn returned or not (see WithHoldAtMost).
func (lk *Lock) run(ctx context.Context, fn func(context.Context) error, c doConfig) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.h.Context(), func() { cancel(lk.Err()) })
	var b *holdBound
	runCtx := context.Context(fctx)
	if c.holdAtMost > 0 {
		var bcancel context.CancelFunc
		cause := &boundError{lk: lk, d: c.holdAtMost}
		runCtx, bcancel = context.WithDeadlineCause(fctx, lk.h.Since().Add(c.holdAtMost), cause)
		defer bcancel()
		b = lk.startBound(runCtx, cause)
	}
	w := c.holdAtLeast
	defer func() {
		if b != nil && b.taskReturned() {
			stop()
			cancel(nil)
			// The bound passed: the lock was released there.
			err = runError(err, b.err)
			if b.unlockErr != nil && !errors.Is(b.unlockErr, ErrReleased) {
				err = fmt.Errorf("%w; then %w", err, b.unlockErr)
			}
			return
		}
		stop()
		cancel(nil)
		if w > 0 && time.Since(lk.h.Since()) < w {
			// The release comes later; the server confirms now that fn
			// ran under the lock, as an unlock would.
			if _, cerr := lk.h.Tag(lk.l.pool.UnlockContext(), sqltext.HeldSQL); cerr != nil {
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
	return fn(runCtx)
}

// holdBound is a task's upper bound (WithHoldAtMost): when the bound ends
// the task's context, the task's lock is released, whether the task has
// returned or not.
type holdBound struct {
	err       *boundError     // the cause of the task's context at the bound
	ctx       context.Context // the task's context
	reached   func()          // releases the lock when the bound ended ctx; closes done
	stop      func() bool     // stops watching the task's context
	warn      *time.Timer     // tells the logger of a task that outlives the release
	done      chan struct{}   // closed once the task's context ended and its end was seen to
	released  bool            // read after done: the bound released the lock
	unlockErr error           // read after done: the release's error
}

// startBound watches ctx, the context of the task that runs under lk,
// whose deadline is the task's bound: when the bound ends it (with cause
// err, not the caller's context nor a loss), the lock is released.
func (lk *Lock) startBound(ctx context.Context, err *boundError) *holdBound {
	b := &holdBound{done: make(chan struct{}), err: err, ctx: ctx}
	b.reached = func() {
		defer close(b.done)
		if context.Cause(ctx) != error(err) || lk.Err() != nil {
			return // the caller's context, or a loss: not the bound
		}
		lk.l.log(context.Background(), slog.LevelWarn, "sqllock: a task reached its upper bound (WithHoldAtMost): its context ended, and its lock is released", lk.key,
			slog.Duration("bound", err.d))
		b.released, b.unlockErr = true, lk.Unlock(context.Background())
		at := lk.h.Since().Add(err.d + lk.l.cfg.unlockTimeout)
		b.warn = time.AfterFunc(time.Until(at), func() {
			lk.l.log(context.Background(), slog.LevelWarn, "sqllock: a task still runs after its upper bound (WithHoldAtMost) and its lock's release: it ignores its context, and runs without the lock", lk.key,
				slog.Duration("bound", err.d))
		})
	}
	b.stop = context.AfterFunc(ctx, b.reached)
	return b
}

// boundError is the cause of a task's context at its bound: it matches
// ErrLockLost and context.DeadlineExceeded, and names the key only when
// read (never on a task's success path).
type boundError struct {
	lk *Lock
	d  time.Duration
}

func (e *boundError) Error() string {
	return fmt.Sprintf("%v: %s: the task's upper bound (WithHoldAtMost(%v)) passed; its lock was released: %v",
		ErrLockLost, e.lk.l.name(e.lk.key), e.d, context.DeadlineExceeded)
}

func (e *boundError) Unwrap() []error { return []error{ErrLockLost, context.DeadlineExceeded} }

// taskReturned is called as the task returns, before its context is cancelled: it
// reports whether the bound released the lock, and stops what remains.
func (b *holdBound) taskReturned() (released bool) {
	if b.stop() {
		if b.ctx.Err() == nil {
			return false // the context has not ended: no bound passed
		}
		// It ended, and the task returned before the watch started (a
		// context's Done closes before its AfterFuncs run): the watch's
		// work, here.
		b.reached()
	}
	<-b.done
	if b.warn != nil {
		b.warn.Stop()
	}
	return b.released
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
	case (errors.Is(fnErr, context.Canceled) || errors.Is(fnErr, context.DeadlineExceeded)) && errors.Is(unlockErr, ErrLockLost):
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
	wait := time.Until(lk.h.Since().Add(d))
	if wait <= 0 {
		return lk.Unlock(context.Background())
	}
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if err := lk.h.Err(); err != nil {
		return err
	}
	if lk.window != nil {
		lk.window.Stop() // a second window replaces the first
	} else {
		lk.l.stats.windows.Add(1)
		lk.l.windows.Store(lk.h, lk) // a loss ends the window (see hooks.Event)
	}
	lk.window = time.AfterFunc(wait, func() {
		if err := lk.Unlock(context.Background()); err != nil && !errors.Is(err, ErrReleased) {
			lk.l.log(context.Background(), slog.LevelWarn, "sqllock: release after the hold window failed", lk.key, slog.Any("error", err))
		}
	})
	return nil
}

// closeLostWindow ends the lock's hold window, if one is open: its lock was
// lost.
func (lk *Lock) closeLostWindow() {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	lk.closeWindow()
}

// closeWindow ends the lock's hold window, if one is open: the lock is
// being released (early, or at the window's end) or was lost. The caller
// holds mu.
func (lk *Lock) closeWindow() {
	if lk.window != nil {
		lk.window.Stop()
		lk.window = nil
		lk.l.stats.windows.Add(-1)
		lk.l.windows.Delete(lk.h)
	}
}
