package core

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Request is what one lock call asks of a Pool.
type Request struct {
	Key    Key
	Shared bool // shared mode; otherwise exclusive
	Try    bool // do not wait
	// Named is a candidate's value: its session carries it as its
	// application_name while it waits and while it holds the lock ("":
	// the Pool's own name).
	Named string
	// Into, when not nil, is where the granted Hold is made: zero storage
	// its caller keeps with its own handle, used for this Request only
	// (a granted lock then allocates one thing, not two). When nothing is
	// granted it may have been written, and nothing refers to it.
	Into *Hold

	place *place // the call's place in line, taken as it queued (nil: none)
}

// namer names a lock in errors, only when one is built: label, or the
// Pool's name of k.
type namer struct {
	p     *Pool
	k     Key
	label string
}

func (n namer) String() string {
	if n.label != "" || n.p == nil {
		return n.label
	}
	return n.p.name(n.k)
}

// acquireAttempts is how many connections a call tries when the one it got
// turns out to be dead (after a server restart, idle pooled connections
// are). Retrying is safe: a session whose connection broke holds nothing.
const acquireAttempts = 3

// Acquire takes the lock r asks for. A waiting call joins the Pool's queue
// for its key, in arrival order, and only the head of that queue acquires
// from the server (see keyqueue.go); a try never waits, and is refused at
// once while the Pool's own callers wait for the key. When ctx ends first,
// it returns an error matching stmt.ErrNotAcquired and ctx.Err(), and no lock
// stays held.
func (p *Pool) Acquire(ctx context.Context, r Request) (*Hold, error) {
	if err := ctx.Err(); err != nil {
		return nil, stmt.NotAcquired(p.name(r.Key), err) // nothing sent
	}
	if p.Closed() {
		return nil, closedError(p.name(r.Key))
	}
	h, err := p.acquire(ctx, r)
	err = p.freedFirst(err)
	if err == nil && p.Closed() {
		// Granted as the Pool started closing: Close may have looked for
		// its Holds before this one was made.
		h.Release()
		return nil, closedError(p.name(r.Key))
	}
	return h, p.closedOr(err)
}

// acquire is Acquire on a Pool that is not closed.
func (p *Pool) acquire(ctx context.Context, r Request) (*Hold, error) {
	if r.Try {
		if p.queue.waited(queueKey{k: r.Key}) {
			// The Pool's own callers wait for it: a try never passes them.
			p.stats.contended.Add(1)
			return nil, fmt.Errorf("%w: %s %s", stmt.ErrNotAcquired, p.name(r.Key), stmt.HeldElsewhere)
		}
		return p.fromServer(ctx, r)
	}
	h, err := p.queue.acquire(ctx, p, queueKey{k: r.Key}, r, namer{p: p, k: r.Key}, func(pl *place) (*Hold, error) {
		r.place = pl
		return p.fromServer(ctx, r)
	})
	return h, p.timedOut(err)
}

// fromServer takes r's lock from the server: an exclusive one on a shared
// session first, when the Pool shares them and its key is free (one round
// trip), else on a session of its own.
func (p *Pool) fromServer(ctx context.Context, r Request) (*Hold, error) {
	if !r.Shared && !p.cfg.Dedicated && r.Named == "" {
		// A wait that left its line to end its transaction (wait.ErrRestart)
		// waits on in a session of its own.
		if h, err, handled := p.acquireShared(ctx, r.Key, r.Try, r.Into, r.place); handled && !errors.Is(err, wait.ErrRestart) {
			return h, err
		}
	}
	what := namer{p: p, k: r.Key}
	return p.withSession(ctx, what, func(s *session) (*Hold, error) {
		s.st = p.statementsFor(r.Named)
		return p.acquireOn(ctx, s, r, what)
	})
}

// withSession runs take on a new dedicated session, on a connection of the
// pool checked against the server, and again on a new one (up to
// acquireAttempts) when the one it got was dead. what names the call in
// errors.
func (p *Pool) withSession(ctx context.Context, what namer, take func(s *session) (*Hold, error)) (*Hold, error) {
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, stmt.NotAcquired(what.String(), err)
		}
		sent := stmt.MonoNow()
		conn, err := p.TakeConn(ctx)
		if err != nil {
			if stmt.CtxEnded(ctx) {
				return nil, stmt.NotAcquired(what.String(), stmt.CtxErr(ctx))
			}
			if errors.Is(err, driver.ErrBadConn) && attempt < acquireAttempts {
				// database/sql hands out a connection that went bad in the
				// pool (its driver closed it after a cancel) as ErrBadConn,
				// after its own retries: another try may get a good one.
				continue
			}
			if stmt.LockTableFull(err) {
				// A full lock table refuses new sessions too.
				return nil, fmt.Errorf("%w: lock %s: get connection: %w", stmt.ErrLockTableFull, what, err)
			}
			return nil, fmt.Errorf("sqllock: lock %s: get connection: %w", what, err)
		}
		id, err := p.checkPinned(ctx, conn)
		if err != nil {
			if stmt.CtxEnded(ctx) {
				return nil, stmt.NotAcquired(what.String(), stmt.CtxErr(ctx))
			}
			return nil, err
		}
		h, err := take(p.newSession(conn, id, kindDedicated, sent))
		if errors.Is(err, wait.ErrRestart) {
			// The wait left its line to end its transaction, which
			// another backend waits for: its session closed, and the
			// call waits on in a new one, at the end of the line.
			attempt--
			continue
		}
		if err == nil || attempt == acquireAttempts || !stmt.ConnectionBroken(err) || stmt.CtxEnded(ctx) {
			return h, err
		}
	}
}

// acquireOn takes r's lock on s, a dedicated session. A wait must know its
// backend's pid, which settles a cancelled wait (see wait.Engine.WaitOn). On a
// connection that waited before (its pid is known), a waiting call goes
// straight to waiting; otherwise every call starts with the non-waiting
// function, which returns the pid: an uncontended lock costs one round
// trip either way, a contended one two the first time.
func (p *Pool) acquireOn(ctx context.Context, s *session, r Request, what namer) (*Hold, error) {
	w := p.waiterOf(s)
	kind := sqltext.SharedKind(r.Shared)
	var o wait.Outcome
	if r.Try {
		o = p.TryOn(ctx, w, wait.SessionLevel, s.st, kind|sqltext.Try, r.Key)
		o = p.triedLate(ctx, s, r, o)
	} else {
		dc := stmt.DriverConnOf(s.conn)
		pid, known := p.pids.Get(dc)
		known = known && !p.cfg.TxPooler // a pinned connection's backend is its transaction's
		if !known {
			o = p.TryOn(ctx, w, wait.SessionLevel, s.st, kind, r.Key)
			o = p.triedLate(ctx, s, r, o)
			pid = o.PID
		}
		if known || o.Err == nil && !o.OK && !(o.Standby && !p.cfg.AllowStandby) {
			o = p.waitInLine(ctx, w, s.st, r.place.in(wait.KeyLine(kind, r.Key)), pid)
			if o.Err == nil && !p.cfg.TxPooler {
				p.pids.Set(dc, o.PID)
			}
		}
	}
	if o.Err == nil {
		if err := s.sameBackend(o.PID, o.OK, r.Key); err != nil {
			o = wait.Outcome{PID: o.PID, Err: err}
		}
	}
	if o.Err == nil {
		s.pid = o.PID // s is the caller's alone until settled
		s.tuned = o.OK
	}
	return p.settle(ctx, s, r.Key, r.Shared, r.Into, o, what)
}

// triedLate returns o, the outcome of a try on s, a dedicated session,
// unless its answer was read as ctx ended (see wait.Engine.TryOn): the call is then
// not acquired (wait.ErrLeft), with s intact, and a grant goes back first,
// within stmt.AbandonGrace (the session ends when that is not certain), so that
// nothing the call took outlives it.
func (p *Pool) triedLate(ctx context.Context, s *session, r Request, o wait.Outcome) wait.Outcome {
	if o.Err != nil || !o.Certain || !stmt.CtxEnded(ctx) {
		return o
	}
	if o.OK {
		s.pid, s.tuned = o.PID, true // s is the caller's alone until settled
		uctx, cancel := context.WithTimeout(context.Background(), stmt.AbandonGrace)
		got, err := s.sendUnlocks(uctx, nil, []Key{r.Key}, 1, r.Shared)
		cancel()
		if err == nil && !got[0] {
			err = fmt.Errorf("%w: unlock of a try granted as the context ended found no such lock", stmt.ErrLockLost)
		}
		if err != nil {
			return wait.Outcome{PID: o.PID, Err: err} // uncertain: s ends
		}
	}
	return wait.Outcome{PID: o.PID, Sent: o.Sent, Standby: o.Standby, Err: wait.ErrLeft}
}

// acquireShared takes the exclusive lock k on a shared session. It reports
// handled = false when the call must take a session of its own instead: k
// is held or handled on a shared session, none could be had, or it died.
// A waiting call that finds k held elsewhere waits on a session of its
// own: the shared session it tried on, when that carries nothing else
// (handOver), else one of the pool's; with its place in line pl (nil:
// none).
func (p *Pool) acquireShared(ctx context.Context, k Key, try bool, into *Hold, pl *place) (h *Hold, err error, handled bool) {
	if p.sharedLimit() == 0 {
		return nil, nil, false // a small pool: no sharing
	}
	if !p.share.reserve(k) {
		return nil, nil, false
	}
	what := namer{p: p, k: k}
	// ended is the outcome of a call whose ctx ended first.
	ended := func() (*Hold, error, bool) { return nil, stmt.NotAcquired(what.String(), stmt.CtxErr(ctx)), true }
	s, err := p.sharedFor(ctx)
	if err != nil {
		p.share.unreserve(k)
		if stmt.CtxEnded(ctx) {
			return ended()
		}
		return nil, nil, false // a session of its own will say what is wrong
	}
	left := false
	defer func() {
		if !left {
			s.leave()
		}
	}()
	// A call that nothing ends early, or that runs its op itself, waits
	// for its op's outcome whatever happens: the op is a spare one, and
	// goes back below.
	o := takeOp(opTry, k)
	if !try {
		o.class = sqltext.TicketClass(k) // it will wait: it passes no one in line
	}
	spare := true
	switch {
	case ctx.Done() == nil:
		s.submit(o) // nothing ends the call early: run the queue here
	case s.runSole(ctx, o): // nothing else rides on s: run here, under ctx
	default:
		class := o.class
		putOp(o) // never queued: it goes back; one a leaving caller may drop instead
		o, spare = newOp(opTry, k), false
		o.class = class
		o.done = make(chan struct{})
		s.submitAside(o)
		select {
		case <-o.done:
		case <-ctx.Done():
			if o.state.CompareAndSwap(opPending, opAbandoned) {
				return ended() // never sent
			}
			// Sent: its answer, a round trip away, is read for up to
			// stmt.AbandonGrace, so that a grant that comes meanwhile goes
			// back before the call returns, rather than after.
			if !doneWithin(o.done, stmt.AbandonGrace) {
				if o.state.CompareAndSwap(opSent, opAbandoned) {
					// The runner undoes a grant that comes now, and frees k.
					return ended()
				}
				<-o.done // decided: the outcome is a moment away
			}
		}
	}
	// The runner read the answer under a context of its own, and applied
	// what it means to the session (a certain answer touches this key
	// only; an uncertain one ended the session): what is left is the
	// call's.
	ok, oerr := o.ok, o.err
	if spare {
		putOp(o)
	}
	v, verr := judgeShared(ctx, ok, oerr, what)
	if v != granted {
		p.share.unreserve(k)
		if stmt.CtxEnded(ctx) {
			return ended()
		}
	}
	switch {
	case v == uncertain:
		if stmt.ConnectionBroken(oerr) {
			return nil, nil, false // the session died: a session of its own
		}
		return nil, verr, true
	case v == stray: // a deadlock victim, a full lock table (the runner released a grant)
		return nil, verr, true
	case v == refused:
		if try {
			p.stats.contended.Add(1)
			return nil, verr, true
		}
		// Wait on a session of its own: this one, when it holds nothing
		// (no round trip to give it back and take another); otherwise one
		// of the pool's.
		left = true
		s.leave()
		if !s.awaitRunner(ctx) {
			return ended()
		}
		if !s.handOver() {
			return nil, nil, false
		}
		w := p.waiterOf(s)
		ow := p.waitInLine(ctx, w, s.st, pl.in(wait.KeyLine(0, k)), s.pid)
		if ow.Err == nil {
			if !p.cfg.TxPooler {
				p.pids.Set(stmt.DriverConnOf(s.conn), ow.PID) // as acquireOn does: its next wait needs no try
			}
			s.tuned = true
		}
		h, err = p.settle(ctx, s, k, false, into, ow, what)
		if err != nil && stmt.ConnectionBroken(err) && !stmt.CtxEnded(ctx) {
			return nil, nil, false // it died meanwhile: another
		}
		return h, err, true
	}
	if !stmt.CtxEnded(ctx) {
		h = newHold(into, s, k, false)
	}
	if h == nil {
		// Granted as ctx ended (or as its session ended): the key goes
		// back before the call returns, within stmt.AbandonGrace.
		doneWithin(s.unlockAsync(k).done, stmt.AbandonGrace)
		if stmt.CtxEnded(ctx) {
			return ended()
		}
		return nil, stmt.LockError(what.String(), s.err()), true
	}
	p.stats.took(1)
	p.mon.addHeld(h)
	return h, nil, true
}

// release ends h's hold of its key: it goes to the next caller in the
// Pool's queue for it, without a statement, when the queue allows, and is
// otherwise unlocked on its session (see session.release); the queue's
// next caller then acquires from the server. A release that hands the key
// on returns once its session answered a statement after it (one for all
// the releases under way on it, sent while the next caller holds the
// key): as the unlock it replaces, that confirms the lock was held until
// the release, or reports its loss.
func (p *Pool) release(h *Hold) error {
	if p.queue.handOff(p, h) {
		if err := p.queue.check(h); err != nil {
			return fmt.Errorf("%w: %s: its session (backend %d) ended before the release was confirmed: %w", stmt.ErrLockLost, p.name(h.key), h.pid, err)
		}
		return nil
	}
	err := h.s.release(h)
	p.queue.released(h)
	return err
}

// release unlocks h's key on s: nil when the server confirmed it, an error
// wrapping stmt.ErrLockLost when the server says s did not hold it (that Hold
// only), or the error that ended s. A dedicated session ends with its
// lock.
func (s *session) release(h *Hold) error {
	uncertain, err := s.unlock(h.key, h.shared)
	// A certain "not held" on a session that is not dedicated: that lock
	// only. The session takes no new lock, and goes back once its others
	// are released. (An uncertain answer ended the session already.)
	dedicated := s.detach(h, err != nil && !uncertain)
	switch {
	case dedicated && err == nil:
		s.close() // back to the pool: its unlock set its settings back
	case dedicated && !uncertain:
		s.discard(err) // a certain "not held": discarded all the same
	}
	return err
}

// doneWithin waits for done to close, for at most d, and reports whether
// it did.
func doneWithin(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// keyString is k as the package's Key prints it: "123" or "(1,2)".
func keyString(k Key) string {
	if k.Pair {
		return "(" + strconv.Itoa(int(k.Class)) + "," + strconv.Itoa(int(k.ID)) + ")"
	}
	return strconv.FormatInt(k.V, 10)
}
