package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Lock is a held session-level advisory lock. It pins one connection of the
// pool, the session that holds the lock, until [Lock.Unlock].
//
// A Lock is safe for concurrent use. After Unlock, or once the lock is lost,
// Done is closed and Err is non-nil; Unlock then returns an error and
// never panics, so `defer lk.Unlock(ctx)` is always safe, even on a nil Lock.
type Lock struct {
	l      *Locker
	key    Key
	shared bool
	conn   *sql.Conn
	pid    int64
	since  time.Time

	ctx    context.Context // cancelled when the lock is released or lost
	cancel context.CancelCauseFunc

	unlockMu sync.Mutex // serialises Unlock

	mu    sync.Mutex
	state lockState // guarded by mu
	err   error     // guarded by mu: nil while held
}

type lockState uint8

const (
	stateHeld lockState = iota
	stateReleasing
	stateLost
	stateReleased
)

func newLock(l *Locker, k Key, shared bool, conn *sql.Conn, pid int64) *Lock {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lock{l: l, key: k, shared: shared, conn: conn, pid: pid, since: time.Now(), ctx: ctx, cancel: cancel}
}

// Key returns the lock's key (the zero Key for a nil Lock).
func (lk *Lock) Key() Key {
	if lk == nil {
		return Key{}
	}
	return lk.key
}

// Shared reports whether the lock is held in shared mode.
func (lk *Lock) Shared() bool { return lk != nil && lk.shared }

// Conn returns the pinned connection: the session that holds the lock. Run
// statements on it when they must happen in the locking session. Do not
// close it; Unlock does. (Closing it puts the locked session back in the
// pool; Unlock then releases that session's advisory locks, or ends the
// session if someone else has it, and returns an error saying so.) After
// Unlock, its methods return sql.ErrConnDone. It returns nil for a nil Lock.
func (lk *Lock) Conn() *sql.Conn {
	if lk == nil {
		return nil
	}
	return lk.conn
}

// PID returns the PostgreSQL backend process id that holds the lock (0 for
// a nil Lock).
func (lk *Lock) PID() int {
	if lk == nil {
		return 0
	}
	return int(lk.pid)
}

// Done returns a channel that is closed when the lock is released or lost
// (already closed for a nil Lock).
func (lk *Lock) Done() <-chan struct{} {
	if lk == nil {
		return closedChan
	}
	return lk.ctx.Done()
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Err returns nil while the lock is held. After Unlock it returns
// [ErrReleased]; after a loss, an error wrapping [ErrLockLost] and its cause
// (and [ErrSessionChanged] when a pooler swapped the session).
func (lk *Lock) Err() error {
	if lk == nil {
		return ErrReleased
	}
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.err
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
	if lk == nil {
		return ErrReleased
	}
	lk.unlockMu.Lock()
	defer lk.unlockMu.Unlock()
	lk.mu.Lock()
	state, lostErr := lk.state, lk.err
	if state == stateHeld {
		lk.state = stateReleasing
	}
	lk.mu.Unlock()
	if state == stateReleased {
		return ErrReleased
	}
	lk.l.mon.remove(lk)
	var err error
	if state == stateLost {
		lk.l.discard(lk.conn, lk.key, "lock was lost")
		err = lostErr
	} else {
		err = lk.l.release(lk.conn, lk.key, lk.shared, lk.pid)
		lk.l.stats.held.Add(-1)
	}
	final := ErrReleased
	if errors.Is(err, ErrLockLost) {
		final = err
		if state != stateLost {
			lk.l.stats.lost.Add(1)
		}
	}
	lk.mu.Lock()
	lk.state = stateReleased
	lk.err = final
	lk.mu.Unlock()
	lk.cancel(final)
	if lctx := context.WithoutCancel(ctx); lk.l.cfg.logger.Enabled(lctx, slog.LevelDebug) {
		lk.l.cfg.logger.LogAttrs(lctx, slog.LevelDebug, "sqllock: released",
			slog.String("key", lk.l.name(lk.key)), slog.Duration("held", time.Since(lk.since)), slog.Any("error", err))
	}
	return err
}

// lose marks a held lock as lost with cause; it does nothing once Unlock
// has begun.
func (lk *Lock) lose(cause error) {
	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return
	}
	lk.state = stateLost
	lk.err = fmt.Errorf("%w: %s: %w", ErrLockLost, lk.key, cause)
	err := lk.err
	lk.mu.Unlock()
	lk.l.stats.held.Add(-1)
	lk.l.stats.lost.Add(1)
	lk.l.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn, "sqllock: lock lost",
		slog.String("key", lk.l.name(lk.key)), slog.Int64("pid", lk.pid), slog.Any("error", err))
	lk.cancel(err) // last: whoever waits on Done sees the stats and the log entry
}

// run calls fn with a context that ends when ctx does or the lock is lost,
// then unlocks, even if fn panics.
func (lk *Lock) run(ctx context.Context, fn func(context.Context) error) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.ctx, func() { cancel(lk.Err()) })
	defer func() {
		stop()
		cancel(nil)
		if uerr := lk.Unlock(ctx); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return fn(fctx)
}
