package core

import (
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// session is one server session of a Pool's, that holds locks (or waits
// for one), of one of three kinds: shared by many Holds (the rules of
// sharing are in share.go), the session of one Hold (dedicated: a lock
// that waited, a shared-mode lock, a permit, a candidate, any lock of a
// Pool of dedicated sessions), or the session of an Owned (a user's
// Session). It owns its connection, its backend's identity, its owner
// mark and its lease; it sends its statements a batch at a time (see
// queue.go), and it ends one way, end, with a cause: nil when it goes back
// to the pool as it came, or why it is discarded with every lock on it.
type session struct {
	p          *Pool
	connHandle        // its connection, and how it ends
	id         ident  // who granted its locks (see checkServer)
	ls         *lease // its idle clock (see lease.go)
	// mark is its owner mark, which its statements carry and its
	// settings apply (see sqltext.Statements); st are the statements of a
	// dedicated session (the lock's settings, a candidate's name): its
	// unlock sets them back.
	marked

	mu sync.Mutex
	// life, guarded by mu: its kind and lifecycle.
	life
	// backend, set under mu before the answer that tells it is told:
	// whoever holds an outcome of it reads it without mu.
	backend
	// waited, guarded by mu: another backend waits for the end of its
	// transaction (a pinned session's; see askWaitedOn).
	waited bool
	held   holdList // guarded by mu: the Holds it carries, and its places in line
	owner  *Owned   // the Owned whose keys it holds (kindOwned)
	// gate counts the calls that picked it and have not finished (users,
	// the low bits), and shuts (gateShut) when it takes no new call: it
	// left open, or was handed over. A call joins only while it is open,
	// and a session that ends idle shuts it only while no call is in, in
	// one step each (join, closeGateIdle), so that a call picked without the
	// sharing's lock (sharedFor) never meets a session that ended under it.
	gate atomic.Int64
	// nheld is len(held), for sharedFor; written under mu.
	nheld     atomic.Int32
	batcher   // its statement queue and runner (queue.go)
	idleTimer // a shared session's countdown to its end once idle
	// prep are a blind driver's shared session's prepared statements
	// (nil: none; see stmt's prepared.go).
	prep *stmt.Prepared
}

// marked is a session's owner mark and the statements that carry it.
type marked struct {
	mark string
	st   *statements
}

// life is a session's kind and lifecycle, guarded by its mu.
type life struct {
	// kind (and, for a shared session, under the sharing's mu too): set
	// when the session is made, and changed once, by handOver, from shared
	// to dedicated.
	kind sessionKind
	// state and cause are its lifecycle, changed only by setStateLocked (see its
	// rule).
	state sessState
	cause error
}

// backend is what a session learnt of its backend: pid, from its first
// answer (0 until then), and tuned, whether the lock session's settings
// are applied (by its first granted try, until a dedicated session's
// unlock sets them back).
type backend struct {
	pid   int64
	tuned bool
}

// batcher is a session's statement queue, guarded by its mu but scratch
// (see queue.go).
type batcher struct {
	s        *session      // its session
	queue    []*op         // operations waiting for the runner
	running  bool          // a runner is sending the queue
	ranOut   chan struct{} // closed when the runner stops (made by awaitRunner)
	spare    []*op         // the last batch's slice, for the next queue
	kick     chan struct{} // wakes the runner goroutine (see runAside); made once
	runnerUp bool          // the runner goroutine runs
	// scratch is used by whoever runs the queue (drain's caller, while it
	// does) alone.
	scratch scratch
}

// idleTimer is a shared session's countdown to its end once idle,
// guarded by its mu.
type idleTimer struct {
	s      *session    // its session
	linger *time.Timer // ends it (lingered) once armed; made once
	armed  bool        // linger is counting down
	idleAt int64       // stmt.MonoNow when it last became idle
}

// sessionKind is what a session is for.
type sessionKind uint8

const (
	kindShared    sessionKind = iota // many Holds of the Pool's
	kindDedicated                    // one Hold (or one wait)
	kindOwned                        // an Owned's keys
)

// sessState is a session's lifecycle. It only moves forward: open, then
// retiring (optional), then ended.
type sessState uint8

const (
	// open: it takes new locks.
	open sessState = iota
	// retiring: it takes no new lock (one of its locks was lost, or an
	// unlock found a lock not held), and ends once its others are
	// released.
	retiring
	// ended: no call may use it any more; its connection is ended, or
	// about to be (cause nil: back to the pool, as it came; else
	// discarded).
	ended
)

// newSession makes conn, just taken from the pool (wait.Engine.TakeConn) and checked
// (id), a session of kind, marked with a new owner mark, which takes it
// out of the budget (see stmt's budget.go); its lease starts with the statement
// sent at sent.
func (cs *connections) newSession(conn *sql.Conn, id ident, kind sessionKind, sent int64) *session {
	p := cs.p
	s := (&session{p: p, connHandle: connHandle{conn: conn, gone: make(chan struct{})}, id: id, ls: p.newLease(sent), marked: marked{mark: p.newMark()}, life: life{kind: kind}}).link()
	if kind == kindShared && p.Abandoned != nil {
		s.prep = stmt.NewPrepared(s.mark)
	}
	p.unended.Add(1)
	p.addLive(s)
	p.Budget.Give()
	return s
}

// link points the parts of s that keep a pointer to their session at s,
// and returns s.
func (s *session) link() *session {
	s.batcher.s = s
	s.connHandle.s = s
	s.idleTimer.s = s
	return s
}

// setStateLocked moves s to state to, with cause when to is ended: the one
// place its lifecycle changes. The rule: a state only moves forward, and
// an ended session never changes again. It reports whether it moved. The
// caller holds s.mu.
func (s *session) setStateLocked(to sessState, cause error) bool {
	if to <= s.state {
		return false
	}
	s.closeGate()
	s.state, s.cause = to, cause
	if to == ended {
		s.unarmLocked()
	}
	return true
}

// err returns why s takes no statement: its cause, or, ended cleanly,
// that it was closed.
func (s *session) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errLocked()
}

// errLocked is err, for a caller that holds s.mu.
func (s *session) errLocked() error {
	if s.cause != nil {
		return s.cause
	}
	return errors.New("session closed")
}

// closedCleanly reports whether s ended with no cause: back to the pool,
// holding nothing.
func (s *session) closedCleanly() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == ended && s.cause == nil
}

// dead reports whether s ended with a cause.
func (s *session) dead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state == ended && s.cause != nil
}

// close and discard are the two ways a session ends (closeOrDiscard).
// close: s holds nothing, and its connection goes back to the pool as it
// came (see closeConn). discard, with a cause: the server releases
// everything s held as its session ends; every Hold on it (and its Owned)
// is marked lost with cause (their Err says so), then the connection is
// discarded, then the loss is told (the hooks, then each Done): the
// holders are told first, and a holder that releases a lost lock as it is
// told finds its session ended or ending. Neither does anything to a
// session that ended already.
func (s *session) close() { s.closeOrDiscard(nil, false) }

func (s *session) discard(cause error) { s.closeOrDiscard(cause, false) }

// closeIfIdle ends a shared session that still holds nothing, cleanly: no
// call picks it from the moment it is found idle.
func (s *session) closeIfIdle() { s.closeOrDiscard(nil, true) }

// closeOrDiscard is close (cause nil) or discard, only of an idle session
// when onlyIdle is set (checked in the same step).
func (s *session) closeOrDiscard(cause error, onlyIdle bool) {
	sh := &s.p.share
	sh.mu.Lock() // a shared session leaves the shared ones in the step it ends
	s.mu.Lock()
	shared := s.kind == kindShared
	if !shared {
		sh.mu.Unlock()
	}
	if onlyIdle && !(shared && s.idleLocked() && s.closeGateIdle()) || !s.setStateLocked(ended, cause) {
		s.mu.Unlock()
		if shared {
			sh.mu.Unlock()
		}
		return
	}
	holds := make([]*Hold, 0, s.held.n)
	for h := s.held.head; h != nil; h = h.next {
		holds = append(holds, h)
	}
	owner := s.owner
	s.mu.Unlock()
	s.p.removeLive(s)
	if shared && cause != nil {
		sh.remove(s) // a dead one leaves at once; a closed one once its reset is done
	}
	if shared {
		sh.mu.Unlock()
	}
	if cause == nil {
		s.closeConnBy(s.closeConn)
		if shared {
			sh.mu.Lock()
			sh.remove(s)
			sh.mu.Unlock()
		}
		return
	}
	what := "session"
	if shared {
		what = "shared session"
	}
	lost := fmt.Errorf("%s (backend %d) discarded: %w", what, s.pid, cause)
	losses := make([]lossNote, 0, len(holds)+1)
	for _, h := range holds {
		if n, ok := h.markLost(lost); ok {
			losses = append(losses, n)
		}
	}
	if owner != nil {
		if n, ok := owner.markLost(cause); ok { // its own words name the backend
			losses = append(losses, n)
		}
	}
	discard := func() {
		s.closeConnSoon(func() {
			if s.p.cfg.TxPooler {
				unpin(s.conn)
			}
			s.p.discard(s.conn, what+": "+cause.Error())
		})
	}
	if s.handedOut.Load() {
		// A statement of the caller's own may be on conn, and database/sql
		// makes the discard wait for it: the one who found the session
		// lost (the keep-alive, say) does not.
		go discard()
	} else {
		discard()
	}
	for _, n := range losses {
		n.tell()
	}
	if poolerEvidence(cause) {
		s.p.sawPooler(cause)
	}
	if (s.p.Pooled() != nil || s.p.cfg.TxPooler) && s.id.pid != 0 {
		// Discarding the client connection does not end a pooled server
		// session: what it took there is freed.
		s.p.discardStranded(s.id)
	}
}

// idleLocked reports whether s holds nothing and nothing is under way on
// it: it may go back to the pool. The caller holds s.mu.
func (s *session) idleLocked() bool {
	return s.state != ended && s.users() == 0 && s.held.n == 0 && s.held.places == 0 && !s.running && len(s.queue) == 0
}

// holdList is a session's Holds, linked through them (no look-up, no
// allocation per lock), and the count of the waiters' places in line
// (tickets, see place.go) it holds or is taking: until each is given
// back, the session holds something, as with a Hold. Guarded by the
// session's mu, as are the links.
type holdList struct {
	head   *Hold
	n      int
	places int
	ever   bool // a Hold was linked in once
}

// add links h in, and reports whether it was not linked yet.
func (l *holdList) add(h *Hold) bool {
	if h.linked {
		return false
	}
	h.linked, h.prev, h.next, l.ever = true, nil, l.head, true
	if l.head != nil {
		l.head.prev = h
	}
	l.head = h
	l.n++
	return true
}

// remove unlinks h, and reports whether it was linked.
func (l *holdList) remove(h *Hold) bool {
	if !h.linked {
		return false
	}
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		l.head = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	}
	h.linked, h.prev, h.next = false, nil, nil
	l.n--
	return true
}

// gateShut marks a session's gate shut (see session.gate); the bits below
// it count its users.
const gateShut = 1 << 40

// users is how many calls picked s and have not finished.
func (s *session) users() int64 { return s.gate.Load() &^ gateShut }

// join counts one more call on s, unless s takes none (its gate closed).
func (s *session) join() bool { return s.joinUnder(gateShut) }

// joinUnder is join, only while fewer than limit calls are in s: calls
// that picked s at once, each without the sharing's lock, never fill it
// past the limit between them.
func (s *session) joinUnder(limit int64) bool {
	for {
		g := s.gate.Load()
		if g&gateShut != 0 || g >= limit {
			return false
		}
		if s.gate.CompareAndSwap(g, g+1) {
			return true
		}
	}
}

// closeGate makes s take no new call.
func (s *session) closeGate() { s.gate.Or(gateShut) }

// closeGateIdle shuts s when no call is in it, in one step; false when one is.
func (s *session) closeGateIdle() bool {
	return s.gate.Load() == gateShut || s.gate.CompareAndSwap(0, gateShut)
}

// attach records h as carried; false when s ended meanwhile.
func (s *session) attach(h *Hold) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == ended {
		return false
	}
	if s.held.add(h) {
		s.nheld.Add(1)
	}
	return true
}

// detach forgets h, and frees its key on a shared session (the server no
// longer holds it there; a dedicated session's key was never reserved).
// With retire, a session that is not dedicated takes no new lock from
// then on (see release). It reports whether s was dedicated as h left it,
// read in the same step: a shared session that h leaves idle may be
// handed over to a waiter at once (handOver), and is then dedicated to
// that waiter, not to h.
func (s *session) detach(h *Hold, retire bool) (dedicated bool) {
	s.mu.Lock()
	ok := s.held.remove(h)
	if ok {
		s.nheld.Add(-1)
	}
	shared := s.kind == kindShared
	dedicated = s.kind == kindDedicated
	if retire && !dedicated {
		s.setStateLocked(retiring, nil)
	}
	s.mu.Unlock()
	if shared {
		s.p.share.unreserve(h.key)
	}
	if ok {
		s.maybeLinger()
	}
	return dedicated
}

// leave ends a call's use of a shared session.
func (s *session) leave() {
	s.gate.Add(-1)
	s.maybeLinger()
}

// maybeLinger notes that a shared session holds nothing now, and starts
// the countdown that ends it, unless one runs. The countdown is not
// stopped when a call picks the session: when it ends, the session ends
// only if it has stayed idle for sessionLinger since it last became idle
// (most are picked again at once; a timer reset per lock would cost more
// than the lock's own bookkeeping).
func (t *idleTimer) maybeLinger() {
	s := t.s
	if s.users() > 0 {
		return // not idle: the last call to leave looks again
	}
	s.mu.Lock()
	if s.kind != kindShared || !s.idleLocked() {
		s.mu.Unlock()
		return // a dedicated session ends with its lock (release), an Owned's with Close
	}
	if s.state == retiring {
		// It takes no new lock: nothing to linger for.
		s.mu.Unlock()
		s.closeIfIdle()
		return
	}
	defer s.mu.Unlock()
	s.idleAt = stmt.MonoNow()
	if s.armed {
		return
	}
	s.armed = true
	if s.linger == nil {
		s.linger = time.AfterFunc(sessionLinger, s.lingered)
	} else {
		s.linger.Reset(sessionLinger)
	}
}

// lingered is the countdown's end: a session idle for sessionLinger ends;
// one idle for less counts down the rest; one in use is left to its next
// maybeLinger.
func (t *idleTimer) lingered() {
	s := t.s
	s.mu.Lock()
	s.armed = false
	// (A session handed over to a waiter meanwhile is that waiter's: it
	// ends with its lock, never as it idles.)
	idle := s.kind == kindShared && s.idleLocked()
	if rest := sessionLinger - time.Duration(stmt.MonoNow()-s.idleAt); idle && rest > 0 {
		s.armed = true
		s.linger.Reset(rest)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	if idle {
		s.closeIfIdle()
	}
}

// unarmLocked stops the countdown to ending; s.mu is held.
func (t *idleTimer) unarmLocked() {
	s := t.s
	if s.armed {
		s.linger.Stop()
		s.armed = false
	}
}

// handOver gives a shared session that holds nothing, and has nothing
// under way, to a call that found its key held, to wait on: it becomes
// that call's dedicated session (no call picks it any more), its pid
// known, its settings applied when tuned. ok is false when it is in use.
func (s *session) handOver() (ok bool) {
	sh := &s.p.share
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.idleLocked() || s.pid == 0 || s.kind != kindShared || s.state != open || !s.closeGateIdle() {
		return false
	}
	s.kind = kindDedicated
	s.st = s.p.sql()
	s.unarmLocked()
	sh.remove(s)
	return true
}
