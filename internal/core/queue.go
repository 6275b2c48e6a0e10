package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/pglocks"
)

// A session's queue: its statements, one at a time, batched. The first
// caller to find the session idle becomes its runner and sends the queue
// (its own op and any queued with it); calls that arrive meanwhile are
// sent together in the next batch (one round trip for many tries or
// unlocks), by the session's runner goroutine, batch after batch, until
// the queue is empty.

type opKind uint8

const (
	opTry    opKind = iota // pg_try_advisory_lock
	opUnlock               // pg_advisory_unlock
	opTag                  // a statement about one lock's tag (a token, HeldSQL, the lease's touch)
	opAlive                // a sign of life of the session (one statement for all in a batch)
	opCheck                // statements of the caller's own on the connection (run): a pinned Pool's keep-alive
	opPlace                // a waiter's place in a key's line: taken, or given back (see place.go)
)

// op is one operation on a session.
type op struct {
	kind   opKind
	key    Key
	shared bool   // opUnlock: of a shared-mode lock; opPlace: a reader's place
	class  int32  // opAlive: a ticket class whose doorbell to check; opTry: a polite try's (0: none); opPlace: its line's
	ticket int32  // opAlive: ask only for earlier tickets than this one (0: any); opPlace: the ticket to give back (0: take one)
	q      string // opTag
	args   []any  // opTag
	state  atomic.Uint32
	// done is closed when the outcome is known: made for a caller that
	// waits for another goroutine to run o (nil for one that runs the
	// queue itself, or does not wait). A spare op's is its wake, told
	// with a send instead.
	done chan struct{}
	// wake is a spare op's own done, kept across its uses: one slot,
	// which the runner fills and the op's caller empties (submit).
	wake chan struct{}

	ok  bool  // opTry: granted; opUnlock: released; opTag: a row came
	v   int64 // opTag's answer; opPlace's: the ticket taken (sent: the least it may be)
	err error // the statement failed (the session is then ended, but for a certain refusal)

	after func() // run by the runner once the outcome is known (nil: none)

	// cut is the context of an opTry's statement run by its own caller
	// (runSole): the caller's. nil: the queue's (UnlockContext).
	cut context.Context

	// run is an opCheck's statements, on the session's connection.
	run func(conn *sql.Conn) error
}

// A try's state: pending until the runner sends it (sent), and decided
// once its outcome is known; abandoned by a caller whose ctx ended before
// it was sent (it is then never sent), or, once sent, whose answer did not
// come within stmt.AbandonGrace (a grant is then undone by the runner).
const (
	opPending uint32 = iota
	opSent
	opAbandoned
	opDecided
)

func newOp(kind opKind, k Key) *op {
	return &op{kind: kind, key: k}
}

// spareOps are op records for callers that wait for their op's outcome
// whatever happens (submit, with no ctx to leave by): once told, an op is
// no longer referenced by the queue or its runner, and its caller puts it
// back (putOp) after reading the outcome. An op whose caller may leave
// first is never put back: the runner may still hold it.
var spareOps = sync.Pool{New: func() any { return &op{wake: make(chan struct{}, 1)} }}

// takeOp is newOp from spareOps.
func takeOp(kind opKind, k Key) *op {
	o := spareOps.Get().(*op)
	o.kind, o.key = kind, k
	return o
}

// putOp gives back o, taken with takeOp and told, its outcome read (its
// wake emptied by submit).
func putOp(o *op) {
	*o = op{wake: o.wake}
	spareOps.Put(o)
}

// submit queues o and, when no runner runs, runs the queue here (flat
// combining: the caller sends its own statement, and those queued with
// it, with no hand-off and no channel while nothing else waits); it
// returns once o's outcome is known, handing what queued meanwhile to the
// runner goroutine (see drain).
func (b *batcher) submit(o *op) {
	s := b.s
	if s.enqueue(o, true) {
		s.drain(true) // o is told by its first batch
		return
	}
	if o.done != nil {
		<-o.done
	}
}

// runSole runs o, a try whose caller's ctx its owner may cancel (it has
// no deadline), here, under ctx, as submit does, when nothing but this
// call rides on s: s is a shared session that holds nothing (no Hold, no
// place), runs nothing, and has no other call in it. It reports false,
// having done nothing, otherwise (or once ctx ended): the caller then
// waits aside (submitAside). A cancel cuts the statement, which ends s:
// it held nothing of anyone's, and the server frees what the try may
// have taken as the session ends. A caller that waits aside pays a
// hand-off to the session's runner goroutine and back; a ctx with a
// deadline always does, for a deadline that ends a call is routine (a
// Lock bounded by a timeout), and ending a session each time would cost
// a connection each time.
func (b *batcher) runSole(ctx context.Context, o *op) bool {
	s := b.s
	if ctx.Err() != nil {
		return false
	}
	if _, ok := ctx.Deadline(); ok {
		return false
	}
	s.mu.Lock()
	if s.state != open || s.kind != kindShared || s.running || len(s.queue) > 0 ||
		s.held.n > 0 || s.held.places > 0 || s.users() > 1 {
		s.mu.Unlock()
		return false
	}
	s.running = true
	s.mu.Unlock()
	o.cut = ctx
	one := &s.scratch.one
	one[0] = o
	s.run(one[:])
	one[0] = nil
	s.mu.Lock()
	if len(s.queue) > 0 && s.state != ended {
		s.mu.Unlock()
		s.runAside() // still running: the runner goroutine goes on
		return true
	}
	s.stopRunningLocked()
	return true
}

// submitAside queues o and, when no runner runs, has the session's
// runner goroutine run the queue: for a caller whose wait for the answer
// ctx bounds (the queue's statements are bounded by the unlock timeout,
// and carry others' keys too, so no caller's ctx may cut them short), or
// that does not wait. A caller that waits makes o.done first.
func (b *batcher) submitAside(o *op) {
	s := b.s
	if s.enqueue(o, false) {
		s.runAside()
	}
}

// runAside wakes the session's runner goroutine to drain the queue (the
// caller's enqueue made it the runner), starting it when none runs. One
// goroutine serves the session for its life rather than one per call: a
// new goroutine grows its stack through the driver's calls every time,
// which cost a cancellable TryLock a third of its client CPU.
func (b *batcher) runAside() {
	s := b.s
	s.mu.Lock()
	start := !s.runnerUp
	if start {
		s.runnerUp = true
		if s.kick == nil {
			s.kick = make(chan struct{}, 1)
		}
	}
	select {
	case s.kick <- struct{}{}: // sent under mu: the runner's last look sees it
	default: // one is pending already (never, while enqueue makes one runner)
	}
	kick := s.kick
	s.mu.Unlock()
	if start {
		go s.runner(kick)
	}
}

// runner drains the queue whenever kicked, until the session's connection
// is gone and no kick is pending.
func (b *batcher) runner(kick chan struct{}) {
	s := b.s
	for {
		select {
		case <-kick:
			s.drain(false)
			continue
		case <-s.gone:
		}
		s.mu.Lock()
		select {
		case <-kick: // kicked as the session ended: its ops are told why
			s.mu.Unlock()
			s.drain(false)
			continue
		default:
		}
		s.runnerUp = false
		s.mu.Unlock()
		return
	}
}

// enqueue queues o and reports whether the caller must run the queue
// (drain): no runner was running. On an ended session, o fails at once.
// For a caller that would run the queue itself (inline), o.done is made
// only when another runner runs it.
func (b *batcher) enqueue(o *op, inline bool) bool {
	s := b.s
	s.mu.Lock()
	if s.state == ended {
		o.err = s.errLocked()
		s.mu.Unlock()
		s.answer(o)
		return false
	}
	if s.queue == nil {
		s.queue, s.spare = s.spare, nil
	}
	if s.running && inline && o.done == nil {
		// Under mu: the runner that takes o sees it.
		if o.done = o.wake; o.done == nil {
			o.done = make(chan struct{})
		}
	}
	s.queue = append(s.queue, o)
	if s.running {
		s.mu.Unlock()
		return false
	}
	s.running = true
	s.mu.Unlock()
	return true
}

// drain sends the queue, batch after batch, until it is empty; the caller
// is the runner (enqueue returned true). A caller that runs the queue for
// its own op (submit) runs one batch, which tells it: should more have
// queued meanwhile, the session's runner goroutine takes them on, so that
// no caller is held past its own answer by others' calls (under load the
// queue may not run out for a long time).
func (b *batcher) drain(caller bool) {
	s := b.s
	s.mu.Lock()
	for len(s.queue) > 0 && s.state != ended {
		batch := s.queue
		s.queue = nil
		s.mu.Unlock()
		s.run(batch)
		if len(batch) > 1 {
			// The calls just told come back soon with their next
			// statement: they queue for the next batch rather than find
			// the session idle, one by one.
			runtime.Gosched()
		}
		clear(batch)
		s.mu.Lock()
		if s.spare == nil {
			s.spare = batch[:0]
		}
		if caller && len(s.queue) > 0 && s.state != ended {
			s.mu.Unlock()
			s.runAside() // still running: the runner goroutine goes on
			return
		}
	}
	s.stopRunningLocked()
}

// stopRunningLocked ends a run of s's queue, which is empty or s ended
// (s.mu held; released on return): the ops left are told why, and s may
// linger.
func (b *batcher) stopRunningLocked() {
	s := b.s
	rest := s.queue
	s.queue = nil
	s.running = false
	if s.ranOut != nil {
		close(s.ranOut)
		s.ranOut = nil
	}
	var why error
	if len(rest) > 0 {
		why = s.errLocked() // ended: lost, or a dedicated session ended with its lock
	}
	s.mu.Unlock()
	for _, o := range rest {
		o.err = why
		s.answer(o)
	}
	s.maybeLinger()
}

// awaitRunner waits until no runner runs s's queue, or ctx ends first
// (false). A runner tells an op's outcome before it stops: a caller that
// would take the session for itself waits for it to be gone.
func (b *batcher) awaitRunner(ctx context.Context) bool {
	s := b.s
	s.mu.Lock()
	if !s.running {
		s.mu.Unlock()
		return true
	}
	if s.ranOut == nil {
		s.ranOut = make(chan struct{})
	}
	ch := s.ranOut
	s.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// answer reports o's outcome.
func (b *batcher) answer(o *op) {
	s := b.s
	if o.kind == opTry {
		if o.state.CompareAndSwap(opSent, opDecided) || o.state.CompareAndSwap(opPending, opDecided) {
			// The caller takes the outcome.
		} else if o.ok {
			// Its caller left: undo the grant.
			o.ok = false
			s.unlockAsync(o.key)
		} else {
			s.p.share.unreserve(o.key)
		}
	}
	if o.after != nil {
		o.after()
	}
	switch {
	case o.done == nil:
	case o.done == o.wake:
		o.done <- struct{}{} // a spare op's: its one slot, emptied by its caller
	default:
		close(o.done)
	}
}

// unlockAsync releases k, which this session holds for no Hold, without
// waiting; k is freed once the server confirmed it (or the session is
// gone), and the op returned is then done. The unlock is queued before
// unlockAsync returns, so the session never looks empty (and goes back to
// the pool) while it holds k.
func (b *batcher) unlockAsync(k Key) *op {
	s := b.s
	o := newOp(opUnlock, k)
	o.after = func() { s.p.share.unreserve(k) }
	o.done = make(chan struct{})
	s.submitAside(o)
	return o
}

// run sends one batch: the tag statements one by one, then the unlocks,
// then the tries, each kind in as few statements as possible, then one
// sign of life for all that asked for one.
func (s *session) run(batch []*op) {
	if len(batch) == 1 && (batch[0].kind == opTry || batch[0].kind == opUnlock) && batch[0].state.Load() != opAbandoned {
		s.runMany(batch, batch[0].kind == opUnlock) // one key, the common case
		return
	}
	// The batch's sorting and its keys live in the session's scratch (one
	// runner at a time), emptied after: a batch allocates none of them.
	sc := &s.scratch
	tries, unlocks, alives := sc.tries[:0], sc.unlocks[:0], sc.alives[:0]
	defer func() {
		clear(tries)
		clear(unlocks)
		clear(alives)
		sc.tries, sc.unlocks, sc.alives = tries[:0], unlocks[:0], alives[:0]
	}()
	for _, o := range batch {
		switch {
		case o.kind == opTag:
			s.runTag(o)
		case o.kind == opCheck:
			o.err = s.withConn(o.run)
			s.answer(o)
		case o.kind == opPlace:
			runPlace(s, o)
		case o.kind == opUnlock:
			unlocks = append(unlocks, o)
		case o.kind == opAlive:
			alives = append(alives, o)
		case o.state.Load() == opAbandoned:
			s.answer(o) // never sent
		case o.class != 0:
			s.runTry(o) // a polite try: a statement of its own
		default:
			tries = append(tries, o)
		}
	}
	if s.canMix(unlocks, tries) {
		s.runMixed(unlocks, tries)
	} else {
		s.runMany(unlocks, true)
		s.runMany(tries, false)
	}
	if len(alives) > 0 {
		s.runAlive(alives)
	}
}

// runAlive answers ops, which asked whether the session is alive (and
// whether the doorbells of their ticket classes ring), with one statement
// on its backend: nil when it answered there (the session is alive, and
// holds what it held); otherwise the session ends (another backend
// answered, or none did), and ops get why.
func (s *session) runAlive(ops []*op) {
	var err error
	type line struct{ class, ticket int32 }
	rung := map[line]bool{}
	if s.dead() {
		err = s.err()
	} else {
		var classes, tickets []int32
		for _, o := range ops {
			if o.class == 0 {
				continue
			}
			if _, ok := rung[line{o.class, o.ticket}]; !ok {
				rung[line{o.class, o.ticket}] = false
				classes, tickets = append(classes, o.class), append(tickets, o.ticket)
			}
		}
		if len(classes) == 0 {
			var v int64
			q, args := s.p.Mode.AliveSQL(s.pid)
			err = s.queryRow(q, args, &v)
		} else {
			rows := 0
			q, args := s.p.Mode.DoorbellSQL(s.pid, classes, tickets)
			err = s.queryRows(q, args, func(v []driver.Value) error {
				rows++
				rung[line{int32(pglocks.Int(v[0])), int32(pglocks.Int(v[1]))}] = v[2] == true
				return nil
			})
			if err == nil && rows == 0 {
				err = sql.ErrNoRows
			}
		}
		if errors.Is(err, sql.ErrNoRows) {
			err = stmt.SessionChanged(s.pid, 0)
		}
		if err != nil {
			s.discard(err)
		}
	}
	for _, o := range ops {
		o.ok, o.err = err == nil && !rung[line{o.class, o.ticket}], err
		s.answer(o)
	}
}
