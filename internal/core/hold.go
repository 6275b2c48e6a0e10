package core

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// Hold is one lock held by one of a Pool's sessions for one caller: what a
// Lock, a semaphore's permit and an election's term are thin layers over.
// Its lifecycle is one field: held, then releasing, then released; or
// held, then lost (its session ended, or the keep-alive found the lock
// gone), then released by its owner's Release. It is safe for concurrent
// use.
type Hold struct {
	s      *session
	key    Key
	shared bool
	pid    int64
	id     ident  // who granted it (see checkServer)
	ls     *lease // its session's idle clock (nil: not leased)
	since  time.Time

	releaseMu sync.Mutex // serialises Release

	// Its links in its session's holdList, guarded by the session's mu.
	linked     bool
	prev, next *Hold

	// lifecycle's mu also guards discarded: set when the Hold is found
	// lost, closed once its session has ended (Release waits for it).
	lifecycle
	discarded chan struct{}
}

type holdState uint8

const (
	holdHeld holdState = iota
	holdReleasing
	holdLost
	holdReleased
)

// newHold returns the Hold of k, held in mode shared by s, made in into
// (nil: a new one), and records it there; nil when s ended meanwhile.
func newHold(into *Hold, s *session, k Key, shared bool) *Hold {
	h := holdIn(into)
	*h = Hold{s: s, key: k, shared: shared, pid: s.pid, id: s.id, ls: s.ls, since: time.Now()}
	if !s.attach(h) {
		return nil
	}
	return h
}

// holdIn returns into, the storage of a Request's Hold, or a new Hold
// when it has none.
func holdIn(into *Hold) *Hold {
	if into == nil {
		return new(Hold)
	}
	return into
}

// Key returns the lock's key.
func (h *Hold) Key() Key { return h.key }

// Shared reports whether the lock is held in shared mode.
func (h *Hold) Shared() bool { return h.shared }

// PID returns the backend that holds the lock.
func (h *Hold) PID() int64 { return h.pid }

// Since returns when the lock was granted to this Hold.
func (h *Hold) Since() time.Time { return h.since }

// Err returns nil while the lock is held, stmt.ErrReleased after Release, and
// an error wrapping stmt.ErrLockLost once it is lost (a lease that expired
// while the process was stopped is found here first).
func (h *Hold) Err() error {
	if h.ls.expired() {
		h.lose(h.ls.expiredError())
	}
	return h.error()
}

// held reports whether h is still held: neither released, nor being
// released, nor lost.
func (h *Hold) held() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == holdHeld
}

// releasing reports whether Release has begun (or ended).
func (h *Hold) releasing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == holdReleasing || h.state == holdReleased
}

// Release releases the lock: nil once the server confirmed the unlock on
// the backend that was granted it (or the key went to the next caller in
// line, see the Pool's queues); otherwise an error wrapping stmt.ErrLockLost
// when the lock turned out not to be held, or the error that ended its
// session (the server then releases the lock as the session ends). It
// is bounded by the unlock timeout, whatever its caller's context. first
// reports whether this call ended the Hold: false for a Hold released
// before (err is stmt.ErrReleased) or lost before (err is the loss, told when
// it was found).
func (h *Hold) Release() (first bool, err error) {
	h.releaseMu.Lock()
	defer h.releaseMu.Unlock()
	h.mu.Lock()
	state, lostErr, discarded := h.state, h.err, h.discarded
	if state == holdHeld {
		h.state = holdReleasing
	}
	h.mu.Unlock()
	p := h.s.p
	switch state {
	case holdReleased:
		if p.Closed() {
			return false, errReleasedByClose
		}
		return false, stmt.ErrReleased
	case holdLost:
		// Counted and told when it was found lost; wait for its session's
		// end, so that Release returns with the session ended or ending.
		select {
		case <-discarded:
		case <-time.After(p.cfg.UnlockTimeout):
		}
		h.settle(holdReleased, lostErr)
		return false, lostErr
	}
	p.mon.remove(h)
	err = p.release(h)
	if err != nil && p.Pooled() != nil {
		p.AwaitFreed(p.cfg.UnlockTimeout) // see discardStranded
	}
	final := stmt.ErrReleased
	if p.Closed() {
		final = errReleasedByClose
	}
	if errors.Is(err, stmt.ErrLockLost) {
		final = err
		p.emit(Event{Kind: EventLost, Key: h.key, Keyed: true, Hold: h, PID: h.pid, Held: time.Since(h.since), Err: err, N: 1})
	} else {
		p.stats.released(1)
	}
	h.settle(holdReleased, final)
	return true, err
}

// Tag runs q, a statement about the lock's tag ($1, $2, $3) that answers
// one integer on the session that holds it and no row otherwise, on the
// lock's session, through its queue (ctx bounds the wait for the answer,
// not the statement). No row is the server's word that the lock is lost,
// and so is a session that ended under the statement: the lock is then
// marked lost at once, and the error wraps stmt.ErrLockLost. Once Release has
// begun, it returns stmt.ErrReleased or the loss, never a value it did not get.
// what names the lock in errors.
func (h *Hold) Tag(ctx context.Context, q string) (int64, error) {
	if err := ctx.Err(); err != nil {
		// Nothing sent (a token would use up a transaction id for no one).
		if e := h.Err(); e != nil {
			return 0, e
		}
		return 0, fmt.Errorf("sqllock: %s: %w", h.s.p.name(h.key), err)
	}
	c, o, sub := stmt.Tag(h.key)
	q, args := h.s.p.Mode.TagArgs(q, int64(c), int64(o), sub)
	v, ok, err := h.s.onTag(ctx, q, args)
	if err == nil && !ok {
		err = sql.ErrNoRows
	}
	if err == nil {
		return v, nil
	}
	switch {
	case errors.Is(err, stmt.ErrLockLost):
		return 0, err // lost before the statement was sent
	case h.releasing():
		// Release took the session (it may have ended it) or the lock
		// from under the statement.
	case errors.Is(err, sql.ErrNoRows):
		h.lose(fmt.Errorf("its session (backend %d) no longer holds it", h.pid))
	case h.error() != nil:
		// Its session ended under the statement, and told it.
	default:
		return 0, fmt.Errorf("sqllock: %s: %w", h.s.p.name(h.key), err)
	}
	if e := h.Err(); e != nil {
		return 0, e
	}
	return 0, stmt.ErrReleased
}

// lose marks a held lock as lost with cause; it does nothing once Release
// has begun. The session is discarded, and every lock on it is lost with
// it: whatever the keep-alive saw (the key gone, or no answer at all),
// only the end of the session makes sure that it holds nothing should the
// network heal, behind the back of a holder that was told it lost the
// lock; a session that ended anyway loses nothing more. The holder is told
// first (Err), then the session ends, then the loss is told (the hooks,
// then Done).
func (h *Hold) lose(cause error) {
	n, ok := h.markLost(cause)
	if !ok {
		return
	}
	h.s.discard(cause)
	n.tell()
}

// lossNote is a loss marked, to tell: its event for the hooks, and the end
// of its Hold's (or Owned's) Done, after them.
type lossNote struct {
	p   *Pool
	e   Event
	end func()
}

// tell tells the hooks of the loss, then closes Done.
func (n lossNote) tell() {
	n.p.hooks.Event(n.e)
	n.end()
}

// markLost marks a held lock lost with cause (Err says so from now on)
// and counts it; it returns the loss to tell, and false when the lock was
// not held (lost already, or Release has begun). The Hold leaves its
// session once that session has ended.
func (h *Hold) markLost(cause error) (lossNote, bool) {
	h.mu.Lock()
	if h.state != holdHeld {
		h.mu.Unlock()
		return lossNote{}, false
	}
	h.state = holdLost
	p := h.s.p
	h.err = fmt.Errorf("%w: %s: %w", stmt.ErrLockLost, p.name(h.key), cause)
	err := h.err
	discarded := make(chan struct{})
	h.discarded = discarded
	h.mu.Unlock()
	s := h.s
	go func() {
		<-s.gone
		s.detach(h, false)
		close(discarded)
	}()
	p.mon.remove(h)
	p.queue.released(h) // the Pool's next caller acquires from the server
	e := Event{Kind: EventLost, Key: h.key, Keyed: true, Hold: h, PID: h.pid, Held: time.Since(h.since), Err: err, N: 1}
	p.stats.lostHeld(1)
	return lossNote{p, e, h.closeDone}, true
}

// The keep-alive's view of a Hold (see watched).

func (h *Hold) heldKeys(buf []heldKey) []heldKey {
	return append(buf, heldKey{pid: h.pid, id: h.id, key: h.key, shared: h.shared})
}

func (h *Hold) loseKey(_ Key, cause error) { h.lose(cause) }

func (h *Hold) leaseOf() *lease { return h.ls }

// touch runs the lease's statement on the lock's session, through its
// queue.
func (h *Hold) touch(ctx context.Context) error {
	_, _, err := h.s.onTag(ctx, touchSQL, nil)
	if err != nil && (h.releasing() || h.error() != nil) {
		return nil // released or lost meanwhile: nothing to keep alive
	}
	return err
}
