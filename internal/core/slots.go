package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/core/seams"
	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Slots are a semaphore: n advisory locks, the pair keys (Class, 0) to
// (Class, N-1); a permit is one of them, held exclusively.
type Slots struct {
	Class int32
	N     int
	Name  string // names the semaphore in errors
	// try and polite are the statements that take the first free slot
	// (see sqltext.Statements.SemaphoreTrySQL and SemaphorePoliteTrySQL),
	// made once the server check has run, once per semaphore.
	try, polite *slotSQL
}

type slotSQL struct {
	once sync.Once
	q    string
}

// NewSlots returns the n slots of class, named name in errors.
func NewSlots(class int32, n int, name string) Slots {
	return Slots{Class: class, N: n, Name: name, try: &slotSQL{}, polite: &slotSQL{}}
}

// trySQL returns the statement that takes the first free slot: for a
// call that will wait (polite), only when no one waits in the
// semaphore's line.
func (sl Slots) trySQL(p *Pool, polite bool) string {
	if polite {
		sl.polite.once.Do(func() {
			sl.polite.q = p.sql().SemaphorePoliteTrySQL(sl.Class, sl.N, sqltext.SemaphoreTicketClass(sl.Class))
		})
		return sl.polite.q
	}
	sl.try.once.Do(func() { sl.try.q = p.sql().SemaphoreTrySQL(sl.Class, sl.N) })
	return sl.try.q
}

// AcquireSlot takes a free slot of sl: at once, or, unless try, waiting
// while all are taken. A waiting call joins the Pool's queue for the
// semaphore, in arrival order; its head takes a slot at once only when no
// one waits in the semaphore's line, which every process's waiters share,
// and otherwise waits in it (see wait.Engine.WaitInLine): the first waiter gets the
// first free slot. When ctx ends first, it returns an error matching
// stmt.ErrNotAcquired and ctx.Err(), and no slot stays held.
func (p *Pool) AcquireSlot(ctx context.Context, sl Slots, try bool) (*Hold, error) {
	what := namer{label: sl.Name}
	if err := ctx.Err(); err != nil {
		return nil, stmt.NotAcquired(what.String(), err)
	}
	if p.Closed() {
		return nil, closedError(what.String())
	}
	h, err := p.acquireSlot(ctx, sl, try, what)
	err = p.freedFirst(err)
	if err == nil && p.Closed() {
		h.Release() // granted as the Pool started closing (see Acquire)
		return nil, closedError(what.String())
	}
	return h, p.closedOr(err)
}

// acquireSlot is AcquireSlot on a Pool that is not closed.
func (p *Pool) acquireSlot(ctx context.Context, sl Slots, try bool, what namer) (*Hold, error) {
	take := func(pl *place) (*Hold, error) {
		return p.withSession(ctx, what, func(s *session) (*Hold, error) {
			s.st = p.sql()
			return p.slotOn(ctx, s, sl, try, pl, what)
		})
	}
	if try {
		return take(nil)
	}
	h, err := p.queue.acquire(ctx, p, queueKey{k: Key{Pair: true, Class: sl.Class}, sem: true}, Request{}, what, take)
	return h, p.timedOut(err)
}

// slotOn takes a slot on s: it tries every slot in one statement, then,
// for a waiting call, waits in the semaphore's line, with its place in
// line pl (nil: none).
func (p *Pool) slotOn(ctx context.Context, s *session, sl Slots, try bool, pl *place, what namer) (*Hold, error) {
	w := p.waiterOf(s)
	var slot int64
	o := wait.Outcome{Sent: stmt.MonoNow()} // the permit's lease begins with this statement
	q, args := p.Mode.Arrays(sl.trySQL(p, !try), w.Mark)
	// The try takes a moment: its answer, read up to stmt.AbandonGrace past
	// ctx's end, is certain (a slot taken then is given back by settle).
	gctx, cancel := wait.WithGrace(ctx)
	o.Err = w.QueryRow(gctx, q, args, &slot, &o.PID, &o.Standby, stmt.Skip)
	cancel()
	o.Certain = o.Err == nil
	if o.Err == nil && slot == -2 {
		o.Err = stmt.ForeignSession() // nothing was tried
	}
	if o.Err == nil {
		p.ObserveRTT(time.Duration(stmt.MonoNow() - o.Sent))
	}
	o.OK = o.Err == nil && slot >= 0
	o.Slot = int32(slot)
	// ctx is read once: a ctx that ends after this is the wait's to see
	// (it leaves its line), where a second look could find it ended and
	// skip the wait, and the call would be told a refusal, not ctx's end.
	ended := stmt.CtxEnded(ctx)
	if h := seams.Get(); h != nil && h.AfterSlotTry != nil {
		h.AfterSlotTry(sl.Class)
	}
	if o.Err == nil && ended {
		// Answered as ctx ended: the call has nothing (a slot granted
		// goes back), and the session is intact.
		if o.OK {
			k := Key{Pair: true, Class: sl.Class, ID: o.Slot}
			if uncertain, err := s.unlock(k, false); err != nil {
				if !uncertain {
					s.discard(err)
				}
				return nil, errors.Join(stmt.NotAcquired(what.String(), stmt.CtxErr(ctx)), err)
			}
		}
		s.close()
		return nil, stmt.NotAcquired(what.String(), stmt.CtxErr(ctx))
	}
	if !o.OK && o.Err == nil && !try && !ended && !(o.Standby && !p.cfg.AllowStandby) {
		o = p.waitInLine(ctx, w, s.st, pl.in(wait.SlotLine(sl.Class, sl.N)), o.PID)
	}
	k := Key{}
	if o.OK {
		k = Key{Pair: true, Class: sl.Class, ID: o.Slot}
	}
	if o.Err == nil {
		if err := s.sameBackend(o.PID, o.OK, k); err != nil {
			o = wait.Outcome{PID: o.PID, Err: err}
		}
	}
	if o.OK {
		s.pid, s.tuned = o.PID, true
	}
	h, err := p.settle(ctx, s, k, false, nil, o, what)
	if errors.Is(err, stmt.ErrNotAcquired) && try && !stmt.CtxEnded(ctx) {
		err = fmt.Errorf("%w: all %d slots of %s are held", stmt.ErrNotAcquired, sl.N, sl.Name)
	}
	return h, err
}
