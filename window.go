package sqllock

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

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
// last d given.
func (lk *Lock) UnlockAfter(d time.Duration) error {
	if lk == nil {
		return ErrReleased
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
