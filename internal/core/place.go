package core

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Places in line. A caller queued in its Pool behind the head of its
// queue (keyqueue.go) takes its place in the key's line as it queues: a
// ticket, with the doorbell rung, held on one of the Pool's shared
// sessions (sqltext's PlaceSQL), which costs it no session of its own.
// Waiters of other processes that arrive later wait behind it, as behind
// any registered waiter. Once the head, it waits in line with that ticket
// on its own session (SliceSQL with the place's ticket, registered
// without one of its own), and, whatever the outcome, gives its place
// back (PlaceBackSQL) before its call returns. The shared session counts
// its places as things it holds: it does not go back to the pool, end
// idle or become a waiter's own while it holds one. An answer that is not
// certain ends the session, and the places with it (the server gives back
// what a session held as it ends): a waiter whose place went so keeps its
// ticket's rank among its own Pool's waiters only.
//
// A Pool that shares no session (WithDedicatedSessions, a small pool),
// and one behind a transaction pooler (whose shared sessions are pinned
// for seconds, then retire), take no places: their queued callers take
// their place in line when they become the head, as before.

// place is a waiter's place in a line, held on session s: the ticket id
// of ticket class class, a reader's when shared. It is its waiter's
// alone, and given back once.
//
// A head that took no place (id 0) has one with registered only: it is
// told the ticket its registration took (0: none; see keyqueue's
// placeBehind), and answers whether the head may wait with it.
type place struct {
	s          *session
	class      int32
	id         int32
	shared     bool
	registered func(ticket int32) (keep bool)
}

// ticket returns pl's ticket: 0 for no place (nil).
func (pl *place) ticket() int32 {
	if pl == nil {
		return 0
	}
	return pl.id
}

// tell tells pl's head, if it has one, that its registration is over,
// with ticket (0: none), and reports whether the head may wait with it.
func (pl *place) tell(ticket int32) (keep bool) {
	if pl == nil || pl.registered == nil {
		return true
	}
	return pl.registered(ticket)
}

// takePlace takes a place in the line of ticket class class (a reader's
// when shared) for a caller queued behind its queue's head, on one of the
// Pool's shared sessions, with a ticket no earlier than floor (0: the
// server's clock; see sqltext's PlaceSQL): nil when it has none to take
// (see above), or none could be taken. Its statement waits for no lock: when ctx ends
// before its answer, the place is given back once the answer comes, and
// before takePlace returns when that is within stmt.AbandonGrace.
func (qs *keyQueues) takePlace(ctx context.Context, p *Pool, class int32, shared bool, floor int32) *place {
	if p.cfg.TxPooler || p.cfg.Dedicated || p.sharedLimit() == 0 {
		return nil
	}
	s, err := p.sharedFor(ctx)
	if err != nil {
		return nil
	}
	defer s.leave()
	s.mu.Lock()
	if s.state != open {
		s.mu.Unlock()
		return nil
	}
	s.held.places++ // before the statement: the session never looks idle with a ticket
	s.mu.Unlock()
	o := newOp(opPlace, Key{})
	o.class, o.shared, o.v = class, shared, int64(floor)
	o.done = make(chan struct{})
	s.submitAside(o)
	select {
	case <-o.done:
	case <-ctx.Done():
		// The answer settles it: a place taken goes back, before the
		// caller returns when the answer comes within stmt.AbandonGrace
		// (as a try's grant does), else once it comes.
		if doneWithin(o.done, stmt.AbandonGrace) {
			placeTaken(s, o).giveBack()
		} else {
			go func() { placeTaken(s, o).giveBack() }()
		}
		return nil
	}
	return placeTaken(s, o)
}

// placeTaken reads o's answer, once told, on s, and returns the place it
// took (nil: none; s no longer counts it).
func placeTaken(s *session, o *op) *place {
	<-o.done
	if o.err == nil && o.v != 0 { // (a ticket may be negative: see sqltext's PlaceKeptBell)
		return &place{s: s, class: o.class, id: int32(o.v), shared: o.shared}
	}
	placeGone(s)
	return nil
}

// placeGone forgets one of s's places (given back, never taken, or gone
// with the session).
func placeGone(s *session) {
	s.mu.Lock()
	s.held.places--
	s.mu.Unlock()
	s.maybeLinger()
}

// giveBack gives pl back (nil: nothing to give), and returns once its
// session confirmed it or ended.
func (pl *place) giveBack() {
	if pl == nil || pl.id == 0 {
		return
	}
	o := newOp(opPlace, Key{})
	o.class, o.shared, o.ticket = pl.class, pl.shared, pl.id
	o.done = make(chan struct{})
	pl.s.submitAside(o)
	<-o.done
	placeGone(pl.s)
}

// runPlace runs o, an opPlace, on s: it takes a place (o.ticket 0; the
// session's settings are applied first, which bound an orphan: a place
// held by a client that froze goes as the server ends its session), and
// answers its ticket in o.v (0: none), or gives place o.ticket back. A
// failure, and an answer other than a certain one, ends the session: the
// server then gives back what it held.
func runPlace(s *session, o *op) {
	if s.dead() {
		o.err = s.err()
		s.answer(o)
		return
	}
	if o.ticket == 0 && !s.tuned && s.tune() != nil {
		o.err = s.err() // it failed, and so ended
		s.answer(o)
		return
	}
	var q string
	var args []any
	if o.ticket == 0 {
		q, args = s.p.Mode.PlaceSQL(o.class, o.shared, s.pid, int32(o.v))
	} else {
		q, args = s.p.Mode.PlaceBackSQL(o.class, o.ticket, o.shared, s.pid)
	}
	var v int64
	err := s.queryRow(q, args, &v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		err = stmt.SessionChanged(s.pid, 0) // another backend answered: it ran nothing
	case err != nil:
	case o.ticket == 0 && v == sqltext.PlaceKeptBell:
		err = fmt.Errorf("sqllock: a place in line (ticket class %d): its doorbell was not given back", o.class)
	case o.ticket != 0 && v != 2:
		// A certain answer: the place was not held (both, or one, of its
		// locks). It concerns that place only.
		s.p.Debug(context.Background(), "sqllock: a place in line was not held as it was given back", Key{Pair: true, Class: o.class, ID: o.ticket})
	}
	if err != nil {
		s.discard(err)
	}
	o.v, o.err = v, err
	s.answer(o)
}

// placeTicketClass returns the ticket class of qk's line.
func placeTicketClass(qk queueKey) int32 {
	if qk.sem {
		return sqltext.SemaphoreTicketClass(qk.k.Class)
	}
	return sqltext.TicketClass(qk.k)
}

// in returns ln for a waiter whose place in line is pl (nil: none).
func (pl *place) in(ln wait.Line) wait.Line {
	if pl == nil {
		return ln
	}
	return ln.At(pl.ticket(), pl.tell)
}
