package core

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// Shared sessions. A Pool takes its exclusive locks on a few sessions of
// its own, each holding the locks of many callers, instead of pinning one
// session per lock: thousands of locks on at most maxShared server
// sessions.
//
// The rules that keep sharing safe:
//
//   - An advisory lock is re-entrant within a session, so a Pool never
//     takes on a shared session a key that it holds, or is taking, on any
//     shared session (sharing.keys, checked before a statement is sent):
//     such a call takes a session of its own, where the server decides.
//   - Only non-waiting statements run on a shared session. A waiting call
//     tries on one first; when the key is held elsewhere, it waits on a
//     session of its own (the engine's sliced wait: CIC-safe, cancelled
//     cleanly), and keeps that session when it is granted: the shared
//     session itself when it carries nothing else (handOver), else one of
//     the pool's.
//   - A shared session's first statement is a lock's, the one a session
//     of its own would send (it applies the lock session's settings when
//     granted): opening one costs no round trip of its own.
//   - A Pool's shared sessions are bounded by its pool: at most a quarter
//     of its limit, and beyond the first only while the pool has that much
//     room (sharedRoom), so that several Pools on one pool share it.
//   - A session's statements run one at a time; calls that arrive while one
//     runs are sent together in the next (one round trip for many tries or
//     unlocks).
//   - A certain answer touches one lock: an unlock the server says found
//     no lock loses that Hold only. An uncertain one (a statement failed or
//     did not return) ends the session, which loses every lock on it: the
//     server releases them as the session ends.
//   - The keep-alive checks each Hold as before (one query for all).

// maxShared is the most sessions a Pool shares among its locks.
const maxShared = stmt.BudgetMost

// sharedSpread is how many locks a shared session takes before the Pool
// opens another (up to its limit) rather than add to it.
const sharedSpread = 64

// sharedOpenLoad is how many calls at once on a shared session make the
// next call go to another (opened if need be, up to the limit).
const sharedOpenLoad = 64

// sharedQueue is how many calls may queue on a busy shared session while
// others are opening, before the next call waits for one of them.
const sharedQueue = 4

// sharedOverflow is how many locks a shared session may take, a few
// calls at a time (sharedQueue), while others are opening: past it, calls
// wait for those. (Without it, calls arriving one by one while a loaded
// server was slow to accept the others piled on the first: 322 of 400
// locks on one of 16 sessions, all lost if it ends.)
const sharedOverflow = 2 * sharedSpread

// sessionLinger is how long a shared session that holds nothing stays
// pinned for the next lock before its settings are reset and it goes back
// to the pool.
const sessionLinger = stmt.SpareLinger

// sharing is a Pool's shared sessions and the keys they hold.
type sharing struct {
	// limit is sharedLimit's last reading, until limitUntil (stmt.MonoNow).
	limit, limitUntil atomic.Int64

	mu  sync.Mutex
	all []*session // guarded by mu: shared sessions that take locks
	// snap is a copy of all, made anew whenever all changes (published),
	// read without mu.
	snap    atomic.Pointer[[]*session]
	opening int           // guarded by mu: shared sessions being opened
	opened  chan struct{} // guarded by mu: closed (and replaced) when an opening ends

	// keys are those held, or being taken or released, on a shared
	// session, in parts by key, each under a lock of its own: every
	// shared lock call reserves and frees its key, many at once.
	keys [keyParts]keyPart

	// mixed counts the statements that carried unlocks and tries
	// together (runMixed; see Probe.MixedBatches).
	mixed atomic.Int64
}

// keyParts is how many parts sharing.keys is split in.
const (
	keyPartBits = 5
	keyParts    = 1 << keyPartBits
)

type keyPart struct {
	mu  sync.Mutex
	set keySet // guarded by mu
}

// part returns the part of sh.keys that k belongs to.
func (sh *sharing) part(k Key) *keyPart {
	f, v := slot(k)
	return &sh.keys[(uint64(v)*0x9e3779b97f4a7c15+uint64(f))>>(64-keyPartBits)]
}

// reserve claims k for a shared session; false when one holds or handles
// k.
func (sh *sharing) reserve(k Key) bool {
	kp := sh.part(k)
	kp.mu.Lock()
	defer kp.mu.Unlock()
	return kp.set.addNew(k)
}

// unreserve gives up the claim on k.
func (sh *sharing) unreserve(k Key) {
	kp := sh.part(k)
	kp.mu.Lock()
	kp.set.remove(k)
	kp.mu.Unlock()
}

// sessions returns the number of shared sessions.
func (sh *sharing) sessions() int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return len(sh.all)
}

// remove drops s from the shared sessions, and wakes the calls that wait
// for one (the pool may have room again). The caller holds sh.mu.
func (sh *sharing) remove(s *session) {
	for i, x := range sh.all {
		if x == s {
			sh.all = append(sh.all[:i:i], sh.all[i+1:]...)
			sh.published()
			if sh.opened != nil {
				close(sh.opened)
				sh.opened = nil
			}
			return
		}
	}
}

// published makes the snapshot of the shared sessions anew. The caller
// holds sh.mu.
func (sh *sharing) published() {
	all := slices.Clone(sh.all)
	sh.snap.Store(&all)
}

// errNoShared is sharedFor's when no shared session can be had now.
var errNoShared = errors.New("sqllock: no shared session has room")

// sharedFor returns a shared session for one operation. Calls gather on
// one, so that its runner sends their keys together: the busiest that has
// room (fewer than sharedOpenLoad calls at once and sharedSpread locks).
// When none has, a new one opens while there are fewer than the limit,
// else the least busy takes the call. A call that finds every one still
// opening waits for one; so does a call that finds the least busy holding
// sharedOverflow locks, or sharedQueue calls, while others open. The
// caller must call leave when its operation is done.
//
// A call that finds one with room takes it without the sharing's lock,
// from its snapshot of the shared sessions (pick, join): every shared lock
// call picks a session, and a lock of the Pool's taken by each, with each
// session's read in turn, cost more than the lock itself under load.
func (p *Pool) sharedFor(ctx context.Context) (*session, error) {
	sh := &p.share
	if all := sh.snap.Load(); all != nil {
		if s, _ := pick(*all); s != nil && s.joinUnder(sharedOpenLoad) {
			return s, nil
		}
	}
	sh.mu.Lock()
	for {
		pack, least := pick(sh.all)
		// (The pool's limit is read only when it matters: DB.Stats takes the
		// pool's lock, which every query takes too.)
		room := pack == nil && p.sharedRoom(len(sh.all)+sh.opening)
		best := pack
		switch {
		case pack == nil && room && (least != nil || sh.opening == 0):
			sh.opening++
			sh.mu.Unlock()
			s, err := p.openShared(ctx)
			sh.mu.Lock()
			sh.opening--
			if sh.opened != nil {
				close(sh.opened)
				sh.opened = nil
			}
			if err != nil {
				sh.mu.Unlock()
				return nil, err
			}
			s.join() // no other call knows it yet
			sh.all = append(sh.all, s)
			sh.published()
			sh.mu.Unlock()
			return s, nil
		case pack == nil && least != nil && (sh.opening == 0 || least.users() < sharedQueue && least.nheld.Load() < sharedOverflow):
			best = least
		}
		if best != nil && (best != pack && best.join() || best == pack && best.joinUnder(sharedOpenLoad)) {
			sh.mu.Unlock()
			return best, nil
		}
		if best != nil {
			continue // it shut, or filled, meanwhile: look again
		}
		if least == nil && sh.opening == 0 && !closingLocked(sh.all) {
			// None takes calls (each is retiring), none opens, and the pool
			// has no room: a session of its own (which the pool gives when
			// it can) rather than a wait for one that may never open.
			sh.mu.Unlock()
			return nil, errNoShared
		}
		// Every shared session is still opening (arrivals at once, at the
		// start), or the usable ones are busy while more open, or one that
		// idled is closing (its reset, a round trip, is under way): wait
		// for one. (A session of its own per call would pin a connection
		// per lock: many calls at once fill a capped pool with their
		// locks, and the next waits for a connection for ever.)
		if sh.opened == nil {
			sh.opened = make(chan struct{})
		}
		opened := sh.opened
		sh.mu.Unlock()
		select {
		case <-opened:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		sh.mu.Lock()
	}
}

// closingLocked reports whether one of all is closing: it ended idle, and
// leaves the shared sessions once its settings are reset (see closeOrDiscard). The
// caller holds sh.mu.
func closingLocked(all []*session) bool {
	for _, s := range all {
		s.mu.Lock()
		closing := s.state == ended
		s.mu.Unlock()
		if closing {
			return true
		}
	}
	return false
}

// pick returns, of all, the busiest session with room (of those, the one
// with fewest locks), and the least busy of all, should none have room;
// sessions that take no new call are left out.
func pick(all []*session) (pack, least *session) {
	var packLoad, packHeld, leastLoad int64
	for _, s := range all {
		g := s.gate.Load()
		if g&gateShut != 0 {
			continue
		}
		load, held := g, int64(s.nheld.Load())
		if load < sharedOpenLoad && held < sharedSpread &&
			(pack == nil || load > packLoad || load == packLoad && held < packHeld) {
			pack, packLoad, packHeld = s, load, held
		}
		if least == nil || load < leastLoad {
			least, leastLoad = s, load
		}
	}
	return pack, least
}

// sharedRoom reports whether a Pool that has n shared sessions (open or
// opening) may open another: fewer than its limit, and, beyond its first,
// while fewer than that limit of the pool's connections are in use, by
// anyone: the Pool's sessions, other Pools' on the same pool, the
// application's queries. Several Pools on one pool then share its room
// instead of each opening its own limit. (The Pool's spare connections
// are in use for the pool, and are the first a new session takes: they
// are not counted.)
func (p *Pool) sharedRoom(n int) bool {
	if n >= p.maxShared() {
		return false // the most a pool of any size shares: no need to ask it
	}
	st := p.DB.Stats()
	limit := min(sharedLimitOf(st), p.maxShared())
	return n < limit && (n == 0 || st.InUse-p.Budget.Spares() < limit)
}

// sharedLimit is maxShared, or a quarter of the pool's limit when it has
// one, so that waits, the keep-alive and the application's own queries
// still get connections: a pool of fewer than 4 shares none (a session
// pinned for many locks would hold a third of it or more, and keep it
// while they churn), and each lock takes a connection of its own for as
// long as it is held.
//
// It is read from the pool at most every sharedLimitAge (DB.Stats takes
// the pool's lock, which every query takes too): a pool's limit changed
// after a lock call applies within that time.
func (p *Pool) sharedLimit() int {
	now := stmt.MonoNow()
	if now < p.share.limitUntil.Load() {
		return int(p.share.limit.Load())
	}
	n := min(sharedLimitOf(p.DB.Stats()), p.maxShared())
	p.share.limit.Store(int64(n))
	p.share.limitUntil.Store(now + int64(sharedLimitAge))
	return n
}

// sharedLimitAge is how long sharedLimit keeps what it read.
const sharedLimitAge = 100 * time.Millisecond

// maxPinnedShared is the most shared sessions of a Pool that pins its
// sessions: each keeps one of a transaction pooler's few server sessions
// for itself, for as long as it lives.
const maxPinnedShared = 2

// maxShared returns the most sessions the Pool shares among its locks.
func (p *Pool) maxShared() int {
	if p.cfg.TxPooler {
		return maxPinnedShared
	}
	return maxShared
}

// sharedLimitOf is sharedLimit for a pool whose statistics are st.
func sharedLimitOf(st sql.DBStats) int {
	if n := st.MaxOpenConnections; n > 0 {
		return min(maxShared, n/4)
	}
	return maxShared
}

// openShared pins a connection as a shared session, its server checked.
// Its first statement, a lock's, applies the lock session's settings and
// learns its pid, as a lock on a session of its own does: a session that
// carries one lock sends what a dedicated one would, and costs no round
// trip of its own.
func (p *Pool) openShared(ctx context.Context) (*session, error) {
	sent := stmt.MonoNow()
	conn, err := p.TakeConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqllock: shared session: get connection: %w", err)
	}
	id, err := p.checkPinned(ctx, conn)
	if err != nil {
		return nil, err
	}
	s := p.newSession(conn, id, kindShared, sent)
	if p.cfg.TxPooler {
		time.AfterFunc(pinnedLife+rand.N(pinnedLife/2), s.closeAged)
	}
	return s, nil
}

// pinnedLife is how long, give or take half of it at random (so that
// the shared sessions opened together do not retire together), a pinned
// shared session takes new locks. Its transaction then ends once its
// locks are released: a CREATE INDEX CONCURRENTLY waits for every
// transaction that ran a statement as it began its last phase, until it
// ends, and a busy shared session's would not end otherwise. (A session
// found waited for retires at once: see askWaitedOn.)
const pinnedLife = 4 * time.Second

// closeAged retires s, a pinned shared session that lived pinnedLife:
// it takes no new lock, and ends once it holds nothing.
func (s *session) closeAged() {
	s.mu.Lock()
	moved := s.setStateLocked(retiring, nil)
	s.mu.Unlock()
	if moved {
		s.maybeLinger()
	}
}
