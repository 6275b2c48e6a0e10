package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// carrier is a server session that holds locks, of one of three kinds: a
// session shared by many Locks of one Locker (the rules of sharing are in
// share.go), the dedicated session of one Lock, or the session of a user's
// Session (owner). It owns its connection, its backend's identity and its
// lease; it sends its Locks' statements a batch at a time (submit), goes
// back to the pool a while after its last lock (closeIfEmpty), and, after
// an uncertain outcome, is discarded with every lock on it (fail).
type carrier struct {
	l    *Locker
	conn *sql.Conn
	id   ident  // who granted its locks (see checkServer)
	ls   *lease // its idle clock (see lease.go)
	// mark is its owner mark, which its statements carry and its
	// settings apply (see sqltext.Statements).
	mark string
	// dedicated: a session of one lock (a lock that waited, a shared-mode
	// lock, a permit, a candidate, any lock of WithDedicatedSessions),
	// which no other call picks, whose statements are st (the lock's
	// settings, a candidate's name), and which ends with its lock: its
	// unlock sets the settings back, and it goes back to the pool then.
	dedicated bool
	st        *statements
	// owner is the user's Session whose keys this session holds (nil: it
	// carries Locks). The Session runs its own calls, one at a time, on
	// the connection (through queryRowCtx, queryRowsCtx, withConn); fail
	// tells it, as it tells each Lock.
	owner *Session
	// handedOut: the owner handed conn to its caller (Session.Conn), whose
	// statements on it run outside connMu.
	handedOut atomic.Bool

	mu sync.Mutex
	// pid is its backend, learnt from its first answer (0 until then);
	// tuned, whether the lock session's settings are applied (by its first
	// granted try). Both are set by the runner, under mu, before the
	// answer is told: whoever holds an outcome of it reads them without mu.
	pid     int64
	tuned   bool
	held    map[*Lock]struct{} // guarded by mu: the Locks it carries
	users   int                // guarded by mu: calls that picked it and have not finished
	queue   []*shareOp         // guarded by mu: operations waiting for the runner
	running bool               // guarded by mu: a runner is sending the queue
	retired bool               // guarded by mu: takes no new lock; closed once empty
	dead    error              // guarded by mu: the session is lost or discarded
	closed  bool               // guarded by mu: gone back to the pool
	linger  *time.Timer        // guarded by mu: closes it (lingered) once armed; made once
	armed   bool               // guarded by mu: linger is counting down
	idleAt  int64              // guarded by mu: monoNow when it last became idle (holding nothing, no call)
	spare   []*shareOp         // guarded by mu: the last batch's slice, for the next queue

	gone chan struct{} // closed once conn is ended (closed, reset or discarded)

	// connMu is held across each statement on conn, and by whoever ends
	// conn (closes, resets or discards it): database/sql's Conn is not safe
	// to close while a call on it is starting (that call can find its
	// driver connection gone, and panic). connDone, guarded by connMu: conn
	// was ended; later statements fail with sql.ErrConnDone. endNext,
	// guarded by mu: how conn ends once the statement on it returns (see
	// endConnSoon).
	connMu   sync.Mutex
	connDone bool
	endNext  func()
}

// endConn ends conn with end (close it, reset it, discard it) once no
// statement is on it, and only once: the first end asked for, by endConn
// or endConnSoon, is the one that runs.
func (c *carrier) endConn(end func()) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	c.mu.Lock()
	if c.endNext == nil {
		c.endNext = end
	}
	c.mu.Unlock()
	c.endNextLocked()
}

// endConnSoon is endConn without waiting for a statement on conn: the
// statement's caller ends conn as it returns (releaseConn). A Session's
// wait lasts as long as its caller likes; whoever finds the session lost
// does not wait for it.
func (c *carrier) endConnSoon(end func()) {
	c.mu.Lock()
	if c.endNext == nil {
		c.endNext = end
	}
	c.mu.Unlock()
	if c.connMu.TryLock() {
		c.endNextLocked()
		c.connMu.Unlock()
	}
}

// endNextLocked runs endConnSoon's end, if one is due; the caller holds
// connMu.
func (c *carrier) endNextLocked() {
	c.mu.Lock()
	end := c.endNext
	c.endNext = nil
	c.mu.Unlock()
	if end != nil && !c.connDone {
		c.connDone = true
		end()
		close(c.gone)
	}
}

// holdConn and releaseConn bracket a statement on conn: holdConn fails
// with sql.ErrConnDone once conn was ended; releaseConn ends it when
// endConnSoon asked meanwhile.
func (c *carrier) holdConn() error {
	c.connMu.Lock()
	if c.connDone {
		c.connMu.Unlock()
		return sql.ErrConnDone
	}
	return nil
}

func (c *carrier) releaseConn() {
	c.connMu.Unlock()
	c.mu.Lock()
	due := c.endNext != nil
	c.mu.Unlock()
	// Whoever holds connMu now ends conn as its statement returns, if
	// this TryLock finds it taken.
	if due && c.connMu.TryLock() {
		c.endNextLocked()
		c.connMu.Unlock()
	}
}

// newDedicated makes conn, backend pid, whose lock statement st just
// granted it a lock (and applied its settings), the dedicated session of
// that lock.
func newDedicated(l *Locker, conn *sql.Conn, id ident, st *statements, mark string, pid int64, ls *lease) *carrier {
	return &carrier{l: l, conn: conn, id: id, ls: ls, mark: mark, dedicated: true, st: st, pid: pid, tuned: true, held: map[*Lock]struct{}{}, gone: make(chan struct{})}
}

// newOwned makes conn, backend pid, set up for a Session (its settings
// applied), the session of s.
func newOwned(l *Locker, conn *sql.Conn, id ident, mark string, pid int64, ls *lease, s *Session) *carrier {
	return &carrier{l: l, conn: conn, id: id, ls: ls, mark: mark, owner: s, pid: pid, tuned: true, held: map[*Lock]struct{}{}, gone: make(chan struct{})}
}

// err returns why the carrier is dead.
func (c *carrier) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

// errLocked is err, for a caller that holds c.mu.
func (c *carrier) errLocked() error {
	if c.dead != nil {
		return c.dead
	}
	return errors.New("shared session closed")
}

// idleLocked reports whether c holds nothing and nothing is under way on
// it: it may go back to the pool. The caller holds c.mu.
func (c *carrier) idleLocked() bool {
	return c.dead == nil && !c.closed && c.users == 0 && len(c.held) == 0 && !c.running && len(c.queue) == 0
}

// attach records lk as carried; false when the carrier died meanwhile.
func (c *carrier) attach(lk *Lock) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead != nil {
		return false
	}
	c.held[lk] = struct{}{}
	return true
}

// detach forgets lk and frees its key, which the server no longer holds
// for this carrier (a dedicated session's key was never reserved).
func (c *carrier) detach(lk *Lock) {
	if !c.dedicated {
		c.l.share.free(lk.key)
	}
	c.mu.Lock()
	_, ok := c.held[lk]
	delete(c.held, lk)
	c.mu.Unlock()
	if ok {
		c.maybeLinger()
	}
}

// leave ends a call's use of the carrier.
func (c *carrier) leave() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
	c.maybeLinger()
}

// maybeLinger notes that a carrier holds nothing now, and starts the
// countdown that closes it, unless one runs. The countdown is not stopped
// when a call picks the carrier: when it ends, the carrier closes only if
// it has stayed idle for carrierLinger since it last became idle (most
// carriers are picked again at once; a timer reset per lock would cost
// more than the lock's own bookkeeping).
func (c *carrier) maybeLinger() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dedicated || c.owner != nil || !c.idleLocked() {
		return // a dedicated session ends with its lock (release), a Session's with Close
	}
	c.idleAt = monoNow()
	if c.armed {
		return
	}
	c.armed = true
	if c.linger == nil {
		c.linger = time.AfterFunc(carrierLinger, c.lingered)
	} else {
		c.linger.Reset(carrierLinger)
	}
}

// lingered is the countdown's end: a carrier idle for carrierLinger is
// closed; one idle for less counts down the rest; one in use is left to
// its next maybeLinger.
func (c *carrier) lingered() {
	c.mu.Lock()
	c.armed = false
	idle := c.idleLocked()
	if rest := carrierLinger - time.Duration(monoNow()-c.idleAt); idle && rest > 0 {
		c.armed = true
		c.linger.Reset(rest)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if idle {
		c.closeIfEmpty()
	}
}

// unarmLocked stops the countdown to closing (the carrier is dead); c.mu
// is held.
func (c *carrier) unarmLocked() {
	if c.armed {
		c.linger.Stop()
		c.armed = false
	}
}

// closeIfEmpty resets a carrier that still holds nothing and gives it
// back to the pool.
func (c *carrier) closeIfEmpty() {
	s := &c.l.share
	s.mu.Lock()
	c.mu.Lock()
	if !c.idleLocked() {
		c.mu.Unlock()
		s.mu.Unlock()
		return
	}
	c.closed = true // no call picks it now
	tuned := c.tuned
	c.mu.Unlock()
	s.mu.Unlock()
	c.endConn(func() {
		if tuned {
			c.l.closeSession(c.conn, c.pid)
		} else {
			c.conn.Close() // it never held a lock: nothing to set back
		}
	})
	s.mu.Lock()
	s.remove(c) // counted until its reset is done
	s.mu.Unlock()
}

// unlock sends the unlock of k (in mode shared) through c's queue, and
// returns the answer as unlockAnswer reads it. An uncertain one has
// failed c already.
func (c *carrier) unlock(k Key, shared bool) (uncertain bool, err error) {
	op := newOp(opUnlock, k)
	op.shared = shared
	c.submit(op)
	<-op.done
	return unlockAnswer(c.l.name(k), c.pid, op.err, op.ok)
}

// releaseKey releases k, the one key of a dedicated session that no Lock
// holds (a standby's unwanted grant), and ends the session.
func (c *carrier) releaseKey(k Key, shared bool) error {
	uncertain, err := c.unlock(k, shared)
	c.ended(err, uncertain)
	return err
}

// ended ends a dedicated session after the unlock of its one key: back to
// the pool when the server confirmed it (the unlock set the settings
// back), discarded otherwise, even after a certain "not held" (an
// uncertain answer failed it already).
func (c *carrier) ended(err error, uncertain bool) {
	switch {
	case err == nil:
		c.closeDedicated()
	case !uncertain:
		c.fail(err)
	}
}

// closeDedicated gives a dedicated session back to the pool once the
// server confirmed the unlock of its lock (which set its settings back).
func (c *carrier) closeDedicated() {
	c.mu.Lock()
	closing := c.dead == nil && !c.closed
	c.closed = true
	c.mu.Unlock()
	if closing {
		c.endConn(func() { c.conn.Close() })
	}
}

// handOver gives a carrier that holds nothing, and has nothing under way,
// to a call that found its key held, to wait on: the carrier closes (no
// call picks it from now on) and its connection becomes the waiter's, its
// pid known, its settings applied when tuned is true (to be set back
// should the wait not be granted), its mark the carrier's. ok is false
// when the carrier is in use.
func (c *carrier) handOver() (w connWaiter, pid int64, tuned, ok bool) {
	s := &c.l.share
	s.mu.Lock()
	defer s.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.idleLocked() || c.pid == 0 {
		return connWaiter{}, 0, false, false
	}
	c.closed = true
	c.unarmLocked()
	s.remove(c)
	return connWaiter{c.conn, c.l.abandoned, c.mark}, c.pid, c.tuned, true
}

// fail marks the carrier dead after an uncertain outcome (or a lost lock),
// marks every Lock on it (and its Session) lost, then discards its
// connection (the server releases everything it held as the session
// ends), and then tells the observers and closes the handles' Done: the
// holders are told first (Err), and an observer that Unlocks a lost lock
// finds its session ended or ending.
func (c *carrier) fail(cause error) {
	// A shared session leaves the shared ones as it dies, in one step, so
	// that no call picks it meanwhile.
	shared := !c.dedicated && c.owner == nil
	s := &c.l.share
	if shared {
		s.mu.Lock()
	}
	c.mu.Lock()
	if c.dead != nil {
		c.mu.Unlock()
		if shared {
			s.mu.Unlock()
		}
		return
	}
	what := "session"
	if shared {
		what = "shared session"
	}
	c.dead = fmt.Errorf("%s (backend %d) discarded: %w", what, c.pid, cause)
	locks := make([]*Lock, 0, len(c.held))
	for lk := range c.held {
		locks = append(locks, lk)
	}
	c.unarmLocked()
	dead := c.dead
	c.mu.Unlock()
	if shared {
		s.remove(c)
		s.mu.Unlock()
	}
	losses := make([]lossNote, 0, len(locks)+1)
	for _, lk := range locks {
		if n, ok := lk.markLost(dead); ok {
			losses = append(losses, n)
		}
	}
	if c.owner != nil {
		if n, ok := c.owner.markLost(cause); ok { // its own words name the backend
			losses = append(losses, n)
		}
	}
	end := func() { c.endConnSoon(func() { c.l.discard(c.conn, Key{}, what+": "+cause.Error()) }) }
	if c.handedOut.Load() {
		// A statement of the caller's own may be on conn, and database/sql
		// makes the discard wait for it: the one who found the session
		// lost (the keep-alive, say) does not.
		go end()
	} else {
		end()
	}
	for _, n := range losses {
		n.tell()
	}
}

// closeOwned gives a Session's session back to the pool, its settings set
// back, once every unlock of its keys was confirmed; the caller runs no
// statement on it any more. A session whose connection was handed to the
// caller (Session.Conn) is closed instead: the caller's statements may
// have changed it in ways no reset is sure to undo (settings, temporary
// tables, prepared statements, LISTEN), and it must not bring them back
// to the pool.
func (c *carrier) closeOwned() (err error) {
	c.mu.Lock()
	closing := c.dead == nil && !c.closed
	c.closed = true
	c.mu.Unlock()
	if !closing {
		return nil
	}
	if c.handedOut.Load() {
		c.endConn(func() { discardConn(c.conn) })
		return nil
	}
	c.endConn(func() { err = c.l.closeSession(c.conn, c.pid) })
	return err
}

// retire stops c from taking new locks: one of its locks was lost, or an
// unlock found a lock the server says it did not hold. It goes back to
// the pool (reset) once its other locks are released, unless it was
// discarded meanwhile.
func (c *carrier) retire() {
	c.mu.Lock()
	c.retired = true
	c.mu.Unlock()
}

// release unlocks lk's key on its carrier: nil when the server confirmed
// it, an error wrapping ErrLockLost when the server says the carrier did
// not hold it (that Lock only), or the error that discarded the carrier.
func (c *carrier) release(lk *Lock) error {
	uncertain, err := c.unlock(lk.key, lk.shared)
	c.detach(lk)
	if c.dedicated {
		c.ended(err, uncertain)
		return err
	}
	if err != nil && !uncertain {
		// Certain: that lock only. The carrier takes no new lock, and goes
		// back once its others are released. (An uncertain answer failed
		// the carrier already.)
		c.retire()
	}
	return err
}

// onTag runs q, a statement about lk's tag, on lk's carrier: ok reports
// whether it answered a row.
func (c *carrier) onTag(ctx context.Context, q string, args []any) (v int64, ok bool, err error) {
	op := newOp(opTag, Key{})
	op.q, op.args = q, args
	// The statement may wait long (a token's commit waits for synchronous
	// standbys): ctx bounds the caller's wait for it, so the queue runs on
	// a goroutine of its own.
	if c.enqueue(op) {
		go c.drain()
	}
	select {
	case <-op.done:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	return op.v, op.ok, op.err
}
