package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// Slots are a semaphore: n advisory locks, the pair keys (Class, 0) to
// (Class, N-1); a permit is one of them, held exclusively.
type Slots struct {
	Class int32
	N     int
	Name  string // names the semaphore in errors
	// try is the statement that takes the first free slot (see
	// sqltext.Statements.SemaphoreTrySQL), made once the server check has
	// run, once per semaphore.
	try *slotSQL
}

type slotSQL struct {
	once sync.Once
	q    string
}

// NewSlots returns the n slots of class, named name in errors.
func NewSlots(class int32, n int, name string) Slots {
	return Slots{Class: class, N: n, Name: name, try: &slotSQL{}}
}

// trySQL returns the statement that takes the first free slot.
func (sl Slots) trySQL(p *Pool) string {
	sl.try.once.Do(func() { sl.try.q = p.sql().SemaphoreTrySQL(sl.Class, sl.N) })
	return sl.try.q
}

// AcquireSlot takes a free slot of sl: at once, or, unless try, waiting
// while all are taken. A waiting call joins the Pool's queue for the
// semaphore, in arrival order; its head tries every slot, then waits on
// one slot chosen at random for one slice of the engine's wait (half the
// server's deadlock_timeout), then tries them all again. So the head is
// woken at once when its slot is freed, and within a slice when another
// one is; it never polls faster. When ctx ends first, it returns an error
// matching ErrNotAcquired and ctx.Err(), and no slot stays held.
func (p *Pool) AcquireSlot(ctx context.Context, sl Slots, try bool) (*Hold, error) {
	what := namer{label: sl.Name}
	if err := ctx.Err(); err != nil {
		return nil, NotAcquired(what.String(), err)
	}
	take := func() (*Hold, error) {
		return p.withSession(ctx, what, func(s *session) (*Hold, error) {
			s.st = p.sql()
			return p.slotOn(ctx, s, sl, try, what)
		})
	}
	if try {
		return take()
	}
	return p.queue.acquire(ctx, p, queueKey{k: Key{Pair: true, Class: sl.Class}, sem: true}, Request{}, what, take)
}

// slotOn takes a slot on s: it tries every slot in one statement, then,
// for a waiting call, waits on one slot chosen at random for one slice of
// the engine's wait, and tries them all again.
func (p *Pool) slotOn(ctx context.Context, s *session, sl Slots, try bool, what namer) (*Hold, error) {
	w := connWaiter{s.conn, p.abandoned, s.mark}
	for {
		var slot int64
		o := outcome{sent: monoNow()} // the permit's lease begins with this statement
		q, args := p.mode.Arrays(sl.trySQL(p), w.m)
		o.err = w.queryRow(ctx, q, args, &slot, &o.pid, &o.standby, skip)
		if o.err == nil && slot == -2 {
			o.err = foreignSession() // nothing was tried
		}
		if o.err == nil {
			p.observeRTT(time.Duration(monoNow() - o.sent))
		}
		o.ok = o.err == nil && slot >= 0
		k := Key{}
		if o.ok {
			k = Key{Pair: true, Class: sl.Class, ID: int32(slot)}
			s.pid, s.tuned = o.pid, true
		}
		if o.ok || o.err != nil || try || CtxEnded(ctx) || o.standby && !p.cfg.AllowStandby {
			h, err := p.settle(ctx, s, k, false, o, what)
			if errors.Is(err, ErrNotAcquired) && !CtxEnded(ctx) {
				err = fmt.Errorf("%w: all %d slots of %s are held", ErrNotAcquired, sl.N, sl.Name)
			}
			return h, err
		}
		// Wait on one slot, for one slice; then try them all again.
		k = Key{Pair: true, Class: sl.Class, ID: int32(rand.IntN(sl.N))}
		o = p.waitOn(ctx, w, sessionLevel, s.st, 0, k, o.pid, waitSlice)
		if o.err != nil && SQLState(o.err) == "55P03" && !CtxEnded(ctx) {
			p.hooks.Log(ctx, slog.LevelDebug, "sqllock: semaphore: trying every slot again", Key{}, false, slog.String("semaphore", sl.Name))
			continue
		}
		if o.err == nil {
			s.pid, s.tuned = o.pid, true
		}
		return p.settle(ctx, s, k, false, o, what)
	}
}
