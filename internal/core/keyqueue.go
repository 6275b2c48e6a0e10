package core

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The per-key queues. A Pool's callers that wait for one key (Lock, RLock,
// Do, an election's candidates; a semaphore's permits, one queue per
// semaphore) queue inside the Pool, in arrival order, as x/sync's
// semaphore keeps its waiter list: only the queue's head acquires from the
// server, on a session of its own when it must wait; the others hold no
// session. So W waiters on K keys cost at most K waiting sessions.
//
// When the head is granted an exclusive lock, the callers behind it wait
// for its release, and a release with a caller queued hands the key to
// that caller without a statement: the lock stays on its session, and a
// new Hold takes it over (handOff). A hand-off never passes a waiter of
// another process that arrived first: the session that holds the key asks
// the server, with every release it hands on and as callers queue,
// whether anyone waits in the key's line (see sqltext's tickets) before
// the next caller: a caller that holds its place in line (a ticket; see
// place.go) is handed the key only when a check found no registered
// waiter with an earlier ticket; one without a place, only when a check
// sent after it queued found the doorbell silent. Any waiter of another
// process then arrived after it. Hand-offs also go on for at most handoffRun after the
// key was last granted by the server; then the release goes to the
// server, where a waiter of a program that waits with its own SQL, which
// rings no doorbell, is served before the queue's next head. When the head is granted a shared lock (or a permit),
// the next caller becomes head at once: readers are served together, and a
// writer queued behind them waits in the server for them.

// handoffRun is how long a Pool hands a key from one of its callers to the
// next without going through the server, counted from the server's last
// grant of it to the Pool.
const handoffRun = 10 * time.Millisecond

// queueKey names a queue: a key's, or a semaphore's (sem; k is its class).
type queueKey struct {
	k   Key
	sem bool
}

// queueShards spreads the queues over that many mutexes: calls on
// different keys rarely meet.
const queueShards = 64

// keyQueues are a Pool's queues.
type keyQueues struct {
	seed     maphash.Seed
	once     sync.Once
	shards   [queueShards]queueShard
	handoffs atomic.Int64 // keys handed on without a statement (handOff)
	// live counts the queues of every shard: with none, no key is
	// queued for or held by a queue's caller, and the lock calls that
	// only ask (a try, the release of a try's lock) skip the shards.
	live atomic.Int64
	// run is how long hand-offs go on (handoffRun; a test may lengthen
	// it: see Probe.SetHandoffRun), in nanoseconds; 0: handoffRun.
	run atomic.Int64
}

// handoffRun returns how long the Pool's hand-offs go on.
func (qs *keyQueues) handoffRun() time.Duration {
	if d := qs.run.Load(); d > 0 {
		return time.Duration(d)
	}
	return handoffRun
}

type queueShard struct {
	mu sync.Mutex
	m  map[queueKey]*keyQueue // guarded by mu
}

// keyQueue is one key's queue. Guarded by its shard's mu.
type keyQueue struct {
	waiters []*qwaiter // in arrival order; the head is not among them
	head    *qwaiter   // the caller acquiring from the server (nil: none)
	// holder is the exclusive Hold the queue's head was granted (or a
	// caller was handed), until it is released or lost; named, whether
	// its session carries a candidate's name (no hand-off then).
	holder *Hold
	named  bool
	// grantedAt is when the server last granted the key to the queue.
	grantedAt time.Time
	// clearAt is when (stmt.MonoNow) the latest check that found the key's
	// doorbell silent was sent: callers queued before it arrived before
	// any waiter of another process still in line. checking: a check is
	// under way.
	clearAt  int64
	checking bool
	// clearTicket is the latest ticket that a check found no registered
	// waiter's ticket before (0: none): a caller whose place's ticket is
	// not later may be handed the key.
	clearTicket int32
}

// qwaiter is one caller in a queue.
type qwaiter struct {
	r        Request
	queuedAt int64         // stmt.MonoNow when it queued
	ready    chan struct{} // closed when the caller is handed the key (hold) or made head
	state    qstate        // guarded by the shard's mu
	hold     *Hold         // set with state handed
	place    *place        // its place in line (nil: none); guarded by the shard's mu
	// placed is closed once it has its ticket in line, or will have none
	// (ticketed says which): the caller behind it takes its place only
	// then, and only after one, so that the tickets of a queue's callers
	// follow the queue's order (a head never waits in line for the
	// ticket of a caller queued behind it, which waits for the head).
	placed   chan struct{}
	ticketed bool // written before placed is closed
	// ticket is its ticket, when ticketed (0: not one the caller behind
	// must follow: the head's, once its acquisition is over); written
	// before placed is closed. The caller behind takes its place after it
	// (see sqltext's PlaceSQL).
	ticket    int32
	placeOnce sync.Once
}

// placedWith records that w has its ticket in line (ticketed), or will
// have none; the first call counts.
func (w *qwaiter) placedWith(ticketed bool, ticket int32) {
	w.placeOnce.Do(func() {
		w.ticketed, w.ticket = ticketed, ticket
		close(w.placed)
	})
}

type qstate uint8

const (
	qwaiting qstate = iota // in the queue
	qhead                  // the head: acquires from the server
	qhanded                // handed the key (hold)
)

// shard returns qk's shard.
func (qs *keyQueues) shard(qk queueKey) *queueShard {
	qs.once.Do(func() { qs.seed = maphash.MakeSeed() })
	return &qs.shards[maphash.Comparable(qs.seed, qk)%queueShards]
}

// waited reports whether callers of the Pool's queue for qk wait for it,
// or acquire it from the server.
func (qs *keyQueues) waited(qk queueKey) bool { return qs.count(qk) > 0 }

// count returns how many callers are in qk's queue, its head among them.
func (qs *keyQueues) count(qk queueKey) int {
	if qs.live.Load() == 0 {
		return 0
	}
	sh := qs.shard(qk)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.m[qk]
	if q == nil {
		return 0
	}
	n := len(q.waiters)
	if q.head != nil {
		n++
	}
	return n
}

// acquire queues the call r for qk, and returns the Hold it is handed, or,
// once it is the head, the outcome of fromServer, its acquisition from the
// server with its place in line (nil: none). A caller queued behind the
// head takes its place in line as it queues (takePlace), and gives it back
// before it returns, whatever the outcome. When ctx ends while it waits,
// it leaves the queue at once and takes nothing: a key handed to it
// meanwhile goes back (to the next caller, or the server), and the head's
// place to the next caller.
func (qs *keyQueues) acquire(ctx context.Context, p *Pool, qk queueKey, r Request, what namer, fromServer func(pl *place) (*Hold, error)) (*Hold, error) {
	sh := qs.shard(qk)
	w := &qwaiter{r: r, placed: make(chan struct{})}
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = map[queueKey]*keyQueue{}
	}
	q := sh.m[qk]
	if q == nil {
		q = &keyQueue{}
		sh.m[qk] = q
		qs.live.Add(1)
	}
	if q.head == nil && q.holder == nil && len(q.waiters) == 0 {
		q.head, w.state = w, qhead
		sh.mu.Unlock()
		return qs.asHead(p, qk, w, nil, fromServer)
	}
	// ahead is the caller just ahead of w (nil: none waits ahead of it).
	ahead := q.head
	if n := len(q.waiters); n > 0 {
		ahead = q.waiters[n-1]
	}
	w.ready, w.queuedAt = make(chan struct{}), stmt.MonoNow()
	q.waiters = append(q.waiters, w)
	qs.checkFor(q, qk)
	sh.mu.Unlock()
	// A caller queued here leaves as its Pool starts closing, as when ctx
	// ends.
	ctx, stop := p.untilClosed(ctx)
	defer stop()
	pl := qs.placeBehind(ctx, p, qk, w, ahead)
	defer pl.giveBack()
	if pl != nil {
		sh.mu.Lock()
		w.place = pl
		if w.state == qwaiting {
			qs.checkFor(q, qk) // with its ticket, the check may let the key be handed to w
		}
		sh.mu.Unlock()
	}
	select {
	case <-w.ready:
	case <-ctx.Done():
		sh.mu.Lock()
		if w.state == qwaiting {
			q.remove(w)
			sh.removeIfIdle(qs, qk, q)
			sh.mu.Unlock()
			w.placedWith(false, 0)
			return nil, stmt.NotAcquired(what.String(), ctx.Err())
		}
		sh.mu.Unlock()
		// Handed the key, or made head, as ctx ended: the race is settled
		// below, as for a caller told first.
	}
	if w.state == qhanded {
		w.placedWith(true, 0) // out of line: the caller behind it takes its place
		if err := ctx.Err(); err != nil {
			// Handed the key as ctx ended: it goes back.
			w.hold.Release()
			return nil, stmt.NotAcquired(what.String(), err)
		}
		return w.hold, nil
	}
	if err := ctx.Err(); err != nil {
		w.placedWith(false, 0)
		qs.headDone(p, qk, w, nil) // the next caller acquires instead
		return nil, stmt.NotAcquired(what.String(), err)
	}
	return qs.asHead(p, qk, w, pl, fromServer)
}

// placeBehind takes w's place in qk's line (see takePlace) once the caller
// ahead of it (nil: none) has its ticket: none when that one has none, or
// when w is made the head or handed the key first (the head then takes its
// ticket as it registers), or ctx ends. It records the outcome in w.
func (qs *keyQueues) placeBehind(ctx context.Context, p *Pool, qk queueKey, w, ahead *qwaiter) *place {
	var floor int32 // the least ticket w may take (0: the clock's)
	if ahead != nil {
		select {
		case <-ahead.placed:
			if !ahead.ticketed {
				w.placedWith(false, 0)
				return nil
			}
			if ahead.ticket != 0 {
				floor = ahead.ticket + 1 // (tickets wrap around)
				if floor == 0 {
					floor = 1 // 0 is no ticket, and no floor
				}
			}
		case <-w.ready:
			return nil // the head: told as it registers (asHead)
		case <-ctx.Done():
			w.placedWith(false, 0)
			return nil
		}
	}
	pl := qs.takePlace(ctx, p, placeTicketClass(qk), w.r.Shared, floor)
	w.placedWith(pl != nil, pl.ticket())
	return pl
}

// asHead acquires for w, the head, from the server, with its place in line
// pl (nil: none), and lets the queue move on. A head with no place tells
// the caller behind it, through pl, once its registration is over.
func (qs *keyQueues) asHead(p *Pool, qk queueKey, w *qwaiter, pl *place, fromServer func(pl *place) (*Hold, error)) (*Hold, error) {
	if pl == nil {
		pl = &place{registered: func(ticket int32) bool {
			w.placedWith(ticket != 0, ticket)
			return ticket == 0 || !qs.placedBefore(qk, ticket)
		}}
	}
	h, err := fromServer(pl)
	w.placedWith(true, 0) // done as head: no ticket of its own is left in line
	qs.headDone(p, qk, w, h)
	return h, err
}

// placedBefore reports whether a caller queued in qk's queue holds a place
// in line earlier than ticket.
func (qs *keyQueues) placedBefore(qk queueKey, ticket int32) bool {
	sh := qs.shard(qk)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if q := sh.m[qk]; q != nil {
		for _, w := range q.waiters {
			if t := w.place.ticket(); t != 0 && t-ticket < 0 {
				return true
			}
		}
	}
	return false
}

// checkFor starts a check of the line of q's key (see check) when the key
// is held here, the queue has callers, and no check is under way. The
// caller holds the shard's mu.
func (qs *keyQueues) checkFor(q *keyQueue, qk queueKey) {
	if h := q.holder; h != nil && len(q.waiters) > 0 && !q.checking && !qk.sem {
		q.checking = true
		go qs.check(h)
	}
}

// headDone ends w's time as head, granted h (nil: not granted): an
// exclusive Hold becomes the queue's holder, and the callers behind it
// wait for its release; otherwise the next caller becomes head.
func (qs *keyQueues) headDone(p *Pool, qk queueKey, w *qwaiter, h *Hold) {
	sh := qs.shard(qk)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.m[qk]
	if q.head == w {
		q.head = nil
	}
	// (A Hold lost since it was granted told the queue already, before it
	// was its holder: it is not made one.)
	if h != nil && !h.shared && !qk.sem && h.held() {
		q.holder, q.named, q.grantedAt = h, w.r.Named != "", time.Now()
		qs.checkFor(q, qk)
		return
	}
	q.promote()
	sh.removeIfIdle(qs, qk, q)
}

// promote makes the queue's first caller its head, when it has none and no
// holder. The caller holds the shard's mu.
func (q *keyQueue) promote() {
	if q.head != nil || q.holder != nil || len(q.waiters) == 0 {
		return
	}
	w := q.waiters[0]
	q.waiters = q.waiters[1:]
	q.head, w.state = w, qhead
	close(w.ready)
}

// remove takes w out of the queue. The caller holds the shard's mu.
func (q *keyQueue) remove(w *qwaiter) {
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i:i], q.waiters[i+1:]...)
			return
		}
	}
}

// removeIfIdle forgets q once nobody holds, acquires or waits for its key.
// The caller holds sh.mu.
func (sh *queueShard) removeIfIdle(qs *keyQueues, qk queueKey, q *keyQueue) {
	if q.head == nil && q.holder == nil && len(q.waiters) == 0 && sh.m[qk] == q {
		delete(sh.m, qk)
		qs.live.Add(-1)
	}
}

// handOff hands h's key to the next caller of its queue, without a
// statement, and reports whether it did: h is the queue's holder, the next
// caller wants it exclusively, neither is a candidate (whose session
// carries its name), and the run of hand-offs since the server's last
// grant is shorter than handoffRun. The lock stays on h's session; a new
// Hold takes it over there.
func (qs *keyQueues) handOff(p *Pool, h *Hold) bool {
	if h.shared || qs.live.Load() == 0 {
		return false
	}
	qk := queueKey{k: h.key}
	sh := qs.shard(qk)
	sh.mu.Lock()
	q := sh.m[qk]
	if q == nil || q.holder != h || q.named || len(q.waiters) == 0 {
		sh.mu.Unlock()
		return false
	}
	w := q.waiters[0]
	if w.r.Shared || w.r.Named != "" || !q.cleared(w) || time.Since(q.grantedAt) >= qs.handoffRun() {
		sh.mu.Unlock()
		return false
	}
	nh := h.s.transfer(h, w.r.Into)
	if nh == nil {
		sh.mu.Unlock()
		return false // its session ended: the release says how
	}
	q.waiters = q.waiters[1:]
	q.holder = nh
	w.state, w.hold = qhanded, nh
	sh.mu.Unlock()
	qs.handoffs.Add(1)
	p.mon.remove(h)
	p.stats.took(1) // (h's Release counts its release)
	p.mon.addHeld(nh)
	close(w.ready)
	return true
}

// cleared reports whether w, a caller of q, arrived before every waiter
// of another process still in line: no registered waiter had a ticket
// earlier than w's place (w has one), or the doorbell was silent at a
// check sent after w queued. The caller holds the shard's mu.
func (q *keyQueue) cleared(w *qwaiter) bool {
	if t := w.place.ticket(); t != 0 {
		return q.clearTicket != 0 && t-q.clearTicket <= 0 // (tickets wrap around)
	}
	return w.queuedAt < q.clearAt
}

// check asks h's session whether anyone waits in the line of h's key
// before the queue's next caller (and whether the session is alive, which
// a release that handed the key on waits for), and records the answer
// (see cleared): with the next caller's place, whether a registered
// waiter has an earlier ticket; without one, whether the doorbell rings at
// all, as callers queued before the check was sent may be handed the key
// when it is silent.
func (qs *keyQueues) check(h *Hold) error {
	qk := queueKey{k: h.key}
	sh := qs.shard(qk)
	var ticket int32
	sh.mu.Lock()
	if q := sh.m[qk]; q != nil && len(q.waiters) > 0 {
		ticket = q.waiters[0].place.ticket()
	}
	sh.mu.Unlock()
	sent := stmt.MonoNow()
	rung, err := h.s.alive(sqltext.TicketClass(h.key), ticket)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if q := sh.m[qk]; q != nil {
		q.checking = false
		switch {
		case err != nil || rung:
		case ticket != 0:
			if q.clearTicket == 0 || ticket-q.clearTicket > 0 {
				q.clearTicket = ticket
			}
		case sent > q.clearAt:
			q.clearAt = sent
		}
		if len(q.waiters) > 0 && q.waiters[0].place.ticket() != ticket && !q.cleared(q.waiters[0]) {
			// The next caller, or its place, changed meanwhile: its check.
			qs.checkFor(q, qk)
		}
	}
	return err
}

// alive reports, with a statement on s's backend (shared with the others
// under way), that s is alive, and so holds what it held, and, for a
// class other than 0, whether the doorbell of that ticket class rings
// (someone waits in its line): with a ticket, whether a waiter with an
// earlier ticket rings it; or why not (s has then ended).
func (s *session) alive(class, ticket int32) (rung bool, err error) {
	o := newOp(opAlive, Key{})
	o.class, o.ticket = class, ticket
	s.submit(o)
	if o.err != nil && s.closedCleanly() {
		// It ended cleanly meanwhile, before or as the statement ran: a
		// session ends so only holding nothing, after its backend
		// confirmed its last unlock (a dedicated session's, once the key
		// was handed on to another caller and released by it), which
		// answers for what it held as a sign of life would. Its doorbell
		// is not known: taken as ringing.
		return true, nil
	}
	return o.err == nil && !o.ok, o.err
}

// released tells h's queue that h no longer holds its key (released, or
// lost): the next caller becomes head, and acquires from the server.
func (qs *keyQueues) released(h *Hold) {
	if h.shared || qs.live.Load() == 0 {
		return
	}
	qk := queueKey{k: h.key}
	sh := qs.shard(qk)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.m[qk]
	if q == nil || q.holder != h {
		return
	}
	q.holder = nil
	q.promote()
	sh.removeIfIdle(qs, qk, q)
}

// transfer replaces h, which holds its key on s, with a new Hold of the
// same key there, made in into (nil: a new one), for the next caller: nil
// when s ended meanwhile.
func (s *session) transfer(h, into *Hold) *Hold {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == ended {
		return nil
	}
	nh := holdIn(into)
	*nh = Hold{s: s, key: h.key, shared: h.shared, pid: h.pid, id: h.id, ls: h.ls, since: now}
	if !s.held.remove(h) {
		s.nheld.Add(1)
	}
	s.held.add(nh)
	return nh
}
