package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"
)

// Shared sessions. A Locker takes its exclusive locks (Lock, TryLock, Do,
// TryDo) on a few sessions of its own, carriers, each holding the locks of
// many callers, instead of pinning one session per lock: thousands of
// locks on at most maxCarriers server sessions.
//
// The rules that keep sharing safe:
//
//   - An advisory lock is re-entrant within a session, so a Locker never
//     takes on a carrier a key that it holds, or is taking, on any carrier
//     (sharing.keys, checked before a statement is sent): such a call takes
//     a session of its own, where the server decides.
//   - Only non-waiting statements run on a carrier. A waiting call tries on
//     a carrier first; when the key is held elsewhere, it waits on a
//     session of its own (the engine's sliced wait: CIC-safe, cancelled
//     cleanly), and keeps that session when it is granted: the carrier
//     itself when it carries nothing else (handOver), else one of the
//     pool's.
//   - A carrier's first statement is a lock's, the one a session of its
//     own would send (it applies the lock session's settings when granted):
//     opening one costs no round trip of its own.
//   - A Locker's carriers are bounded by its pool: at most a quarter of
//     its limit, and beyond the first only while the pool has that much
//     room (carrierRoom), so that several Lockers on one pool share it.
//   - A carrier's statements run one at a time; calls that arrive while one
//     runs are sent together in the next (one round trip for many tries or
//     unlocks).
//   - A certain answer touches one lock: an unlock the server says found
//     no lock loses that Lock only. An uncertain one (a statement failed or
//     did not return) discards the carrier, which loses every lock on it:
//     the server releases them as the session ends.
//   - The keep-alive checks each Lock as before (one query for all).

// maxCarriers is the most sessions a Locker shares among its locks.
const maxCarriers = 16

// carrierSpread is how many locks a carrier takes before the Locker opens
// another (up to its limit) rather than add to it.
const carrierSpread = 32

// carrierOpenLoad is how many calls at once on a carrier make the next
// call go to another (opened if need be, up to the limit).
const carrierOpenLoad = 32

// carrierQueue is how many calls may queue on a busy carrier while others
// are opening, before the next call waits for one of them.
const carrierQueue = 4

// carrierLinger is how long a carrier that holds nothing stays pinned for
// the next lock before its settings are reset and it goes back to the pool.
const carrierLinger = time.Second

// sharing is a Locker's carriers and the keys they hold.
type sharing struct {
	mu      sync.Mutex
	all     []*carrier        // guarded by mu: carriers that take locks
	opening int               // guarded by mu: carriers being opened
	keys    map[Key]struct{}  // guarded by mu: held, or being taken or released, on a carrier
	hot     map[Key]time.Time // guarded by mu: keys a waiting call found held, and when (see acquireShared)
	opened  chan struct{}     // guarded by mu: closed (and replaced) when a carrier opening ends
}

// maxHot is how many contended keys sharing remembers; past it, it forgets
// them all (and learns them again).
const maxHot = 4096

// hotFor is how long sharing remembers that a key was found held: a key
// that is contended again within it waits on a session of its own at once;
// one that was not goes back to the shared sessions (otherwise every key
// once contended would take a session of its own for ever).
const hotFor = time.Second

// isHot reports whether a waiting call found k held lately.
func (s *sharing) isHot(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.hot[k]
	if ok && time.Since(at) > hotFor {
		delete(s.hot, k)
		return false
	}
	return ok
}

// markHot remembers that a waiting call found k held.
func (s *sharing) markHot(k Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hot == nil || len(s.hot) >= maxHot {
		s.hot = map[Key]time.Time{}
	}
	s.hot[k] = time.Now()
}

// reserve claims k for a carrier; false when a carrier holds or handles k.
func (s *sharing) reserve(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.keys[k]; ok {
		return false
	}
	if s.keys == nil {
		s.keys = map[Key]struct{}{}
	}
	s.keys[k] = struct{}{}
	return true
}

// free gives up the claim on k.
func (s *sharing) free(k Key) {
	s.mu.Lock()
	delete(s.keys, k)
	s.mu.Unlock()
}

// sessions returns the number of carriers.
func (s *sharing) sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all)
}

// acquireShared takes the exclusive lock k on a carrier. It reports
// handled = false when the call must take a session of its own instead: k
// is held or handled on a carrier, no carrier could be had, or (for a
// waiting call) k is held elsewhere.
func (l *Locker) acquireShared(ctx context.Context, k Key, try bool) (lk *Lock, err error, handled bool) {
	if l.carrierLimit() == 0 {
		return nil, nil, false // a small pool: no sharing
	}
	if !try && l.share.isHot(k) {
		// Found held before: wait on a session of its own at once, which
		// is granted there at no extra round trip when k is free now.
		return nil, nil, false
	}
	if !l.share.reserve(k) {
		return nil, nil, false
	}
	// ended is the outcome of a call whose ctx ended first.
	ended := func() (*Lock, error, bool) { return nil, notAcquired(l.name(k), ctxErr(ctx)), true }
	c, err := l.carrierFor(ctx)
	if err != nil {
		l.share.free(k)
		if ctxEnded(ctx) {
			return ended()
		}
		return nil, nil, false // a session of its own will say what is wrong
	}
	left := false
	defer func() {
		if !left {
			c.leave()
		}
	}()
	op := newOp(opTry, k)
	if c.enqueue(op) {
		if ctx.Done() == nil {
			c.drain() // nothing ends the call early: run the queue here
		} else {
			// The queue's statements are bounded by the unlock timeout,
			// not by this call's ctx (they carry other calls' keys too):
			// run it aside, so that the call leaves at ctx's end whatever
			// the server does.
			go c.drain()
		}
	}
	select {
	case <-op.done:
	case <-ctx.Done():
		if op.state.CompareAndSwap(opPending, opAbandoned) {
			// The runner undoes a grant that comes now, and frees k.
			return ended()
		}
		<-op.done // decided: the outcome is a moment away
	}
	// The runner read the answer under a context of its own, and applied
	// what it means to the carrier (a certain answer touches this key
	// only; an uncertain one ended the carrier): what is left is the
	// call's. (A plain grant is granted whatever else: judge, and the
	// key's name it formats, are spared the common case.)
	v, verr := granted, error(nil)
	if op.err != nil || !op.ok {
		v, verr = judge(ctx, outcome{ok: op.ok, err: op.err, certain: true}, l.name(k), true, 0)
	}
	if v != granted {
		l.share.free(k)
		if ctxEnded(ctx) {
			return ended()
		}
	}
	switch {
	case v == uncertain:
		if connectionBroken(op.err) {
			return nil, nil, false // the carrier died: a session of its own
		}
		return nil, verr, true
	case v == refused && op.err != nil: // a deadlock victim, a full lock table
		return nil, verr, true
	case v == refused:
		if !try {
			// Wait on a session of its own: this one, when it holds
			// nothing (no round trip to give it back and take another);
			// otherwise one of the pool's.
			l.share.markHot(k)
			left = true
			c.leave()
			w, pid, tuned, ok := c.handOver()
			if !ok {
				return nil, nil, false
			}
			conn := w.conn
			o := l.waitOn(ctx, w, sessionLevel, l.sql(), 0, k, pid, waitSliced)
			if o.err == nil {
				l.pids.set(driverConnOf(conn), o.pid) // as acquireOn does: its next wait needs no try
			}
			o.tuned = tuned
			lk, err = l.settle(ctx, conn, c.id, l.sql(), w.m, k, false, o, l.name(k))
			if err != nil && connectionBroken(err) && !ctxEnded(ctx) {
				return nil, nil, false // it died meanwhile: another
			}
			return lk, err, true
		}
		l.stats.contended.Add(1)
		return nil, verr, true
	}
	if !ctxEnded(ctx) {
		lk = newLock(c, k, false)
	}
	if lk == nil {
		c.unlockAsync(k)
		if ctxEnded(ctx) {
			return ended()
		}
		return nil, lockError(l.name(k), c.err()), true
	}
	l.stats.took(1)
	l.mon.add(lk)
	return lk, nil, true
}

// carrierFor returns a carrier for one operation. Calls gather on one
// carrier, so that its runner sends their keys together: the busiest
// carrier that has room (fewer than carrierOpenLoad calls at once and
// carrierSpread locks). When none has, a new one opens while there are
// fewer than the limit, else the least busy takes the call. A call that
// finds every carrier still opening waits for one. The caller must call
// leave when its operation is done.
func (l *Locker) carrierFor(ctx context.Context) (*carrier, error) {
	s := &l.share
	s.mu.Lock()
	for {
		// pack: the busiest with room (of those, the one with fewest
		// locks); least: the least busy of all, should none have room.
		var pack, least *carrier
		packLoad, packHeld, leastLoad := 0, 0, 0
		for _, c := range s.all {
			c.mu.Lock()
			usable := c.dead == nil && !c.retired && !c.closed
			load, held := c.users, len(c.held)
			c.mu.Unlock()
			if !usable {
				continue
			}
			if load < carrierOpenLoad && held < carrierSpread &&
				(pack == nil || load > packLoad || load == packLoad && held < packHeld) {
				pack, packLoad, packHeld = c, load, held
			}
			if least == nil || load < leastLoad {
				least, leastLoad = c, load
			}
		}
		// (The pool's limit is read only when it matters: DB.Stats takes the
		// pool's lock, which every query takes too.)
		room := pack == nil && l.carrierRoom(len(s.all)+s.opening)
		best := pack
		switch {
		case pack == nil && room && (least != nil || s.opening == 0):
			s.opening++
			s.mu.Unlock()
			c, err := l.openCarrier(ctx)
			s.mu.Lock()
			s.opening--
			if s.opened != nil {
				close(s.opened)
				s.opened = nil
			}
			if err != nil {
				s.mu.Unlock()
				return nil, err
			}
			c.users++
			s.all = append(s.all, c)
			s.mu.Unlock()
			return c, nil
		case pack == nil && least != nil && (s.opening == 0 || leastLoad < carrierQueue):
			best = least
		}
		if best != nil {
			best.mu.Lock()
			best.users++
			best.mu.Unlock()
			s.mu.Unlock()
			return best, nil
		}
		// Every carrier is still opening (arrivals at once, at the start),
		// or the usable ones are busy while more open: wait for one.
		if s.opened == nil {
			s.opened = make(chan struct{})
		}
		opened := s.opened
		s.mu.Unlock()
		select {
		case <-opened:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

// carrierRoom reports whether a Locker that has n carriers (open or
// opening) may open another: fewer than its limit, and, beyond its first,
// while fewer than that limit of the pool's connections are in use, by
// anyone: the Locker's carriers, other Lockers' on the same pool, the
// application's queries. Several Lockers on one pool then share its room
// instead of each opening its own limit.
func (l *Locker) carrierRoom(n int) bool {
	st := l.db.Stats()
	limit := carrierLimitOf(st)
	return n < limit && (n == 0 || st.InUse < limit)
}

// carrierLimit is maxCarriers, or a quarter of the pool's limit when it
// has one, so that waits, the keep-alive and the application's own
// queries still get connections: a pool of fewer than 4 shares none (a
// session pinned for many locks would hold a third of it or more, and
// keep it while they churn), and each lock takes a connection of its own
// for as long as it is held.
func (l *Locker) carrierLimit() int { return carrierLimitOf(l.db.Stats()) }

// carrierLimitOf is carrierLimit for a pool whose statistics are st.
func carrierLimitOf(st sql.DBStats) int {
	if n := st.MaxOpenConnections; n > 0 {
		return min(maxCarriers, n/4)
	}
	return maxCarriers
}

// openCarrier pins a connection as a carrier, its server checked. Its
// first statement, a lock's, applies the lock session's settings and
// learns its pid, as a lock on a session of its own does: a session that
// carries one lock sends what a dedicated one would, and costs no round
// trip of its own.
func (l *Locker) openCarrier(ctx context.Context) (*carrier, error) {
	sent := monoNow()
	conn, err := getConn(ctx, l.db)
	if err != nil {
		return nil, fmt.Errorf("sqllock: shared session: get connection: %w", err)
	}
	id, err := l.checkServer(ctx, conn)
	if err != nil {
		l.putBack(conn) // no statement of a lock ran on it
		return nil, err
	}
	return &carrier{l: l, conn: conn, id: id, ls: l.newLease(sent), mark: l.newMark(), held: map[*Lock]struct{}{}, gone: make(chan struct{})}, nil
}

// remove drops c from the carriers. The caller holds s.mu.
func (s *sharing) remove(c *carrier) {
	for i, x := range s.all {
		if x == c {
			s.all = append(s.all[:i:i], s.all[i+1:]...)
			return
		}
	}
}
