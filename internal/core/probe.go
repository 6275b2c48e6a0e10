package core

import (
	"database/sql"
	"time"
)

// The core's test seams, in one place: what a test may read of a Pool,
// its Holds and Owneds, or make them do, that no caller of the core may
// (Probe), and the hooks a test may set (package seams). Nothing else in
// the core is there for tests.

// Probe reads and steers a Pool for tests.
type Probe struct{ p *Pool }

// Probe returns p's test probe.
func (p *Pool) Probe() Probe { return Probe{p: p} }

// Queued returns how many of the Pool's callers are in k's queue (its
// head among them): for tests that make callers arrive in a known order.
func (pr Probe) Queued(k Key) int { return pr.p.queue.count(queueKey{k: k}) }

// SlotsQueued returns how many of the Pool's callers are in sl's queue
// (its head among them).
func (pr Probe) SlotsQueued(sl Slots) int {
	return pr.p.queue.count(queueKey{k: Key{Pair: true, Class: sl.Class}, sem: true})
}

// HandOffs returns how many keys the Pool handed from one of its callers
// to the next without a statement.
func (pr Probe) HandOffs() int64 { return pr.p.queue.handoffs.Load() }

// MixedBatches returns how many statements of the Pool's shared sessions
// carried unlocks and tries together (runMixed).
func (pr Probe) MixedBatches() int64 { return pr.p.share.mixed.Load() }

// BudgetCount returns how many connections the Pool counts in its budget
// (see stmt.Budget).
func (pr Probe) BudgetCount() int { return pr.p.Budget.Count() }

// SetHandoffRun makes the Pool hand keys from one of its callers to the
// next for d after the server's last grant (handoffRun), so that a test
// of a hand-off does not depend on how fast a loaded machine answers the
// check of the line.
func (pr Probe) SetHandoffRun(d time.Duration) { pr.p.queue.run.Store(int64(d)) }

// NextCleared reports whether the next caller queued for k may be handed
// the key, as far as the line goes: a check of the line found no one of
// another process before it (see keyQueue.cleared).
func (pr Probe) NextCleared(k Key) bool {
	qs := &pr.p.queue
	qk := queueKey{k: k}
	sh := qs.shard(qk)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	q := sh.m[qk]
	return q != nil && len(q.waiters) > 0 && q.cleared(q.waiters[0])
}

// SkipPoolerProbe turns the transaction pooler probe off, so that a Pool
// behind a pooler takes locks before it sees one (for tests of what it
// frees then).
func (pr Probe) SkipPoolerProbe() { pr.p.noProbe.Store(true) }

// IgnorePooler turns the probe off and makes the Pool ignore the
// evidence of a pooler, so that each statement's own check is what
// meets one.
func (pr Probe) IgnorePooler() {
	pr.p.noProbe.Store(true)
	pr.p.ignore.Store(true)
}

// LeaseBusy is how many statements the lease of h's session counts in
// flight; -1 when the session is not leased.
func (Probe) LeaseBusy(h *Hold) int32 {
	if h.ls == nil {
		return -1
	}
	return h.ls.busy.Load()
}

// Conn is the connection that holds h when it is its session's only lock
// (a dedicated session), and nil on a shared one.
func (Probe) Conn(h *Hold) *sql.Conn {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if h.s.kind == kindDedicated {
		return h.s.conn
	}
	return nil
}

// OnConn runs fn on the connection of h's session between the session's
// own statements, never beside one (two statements at once on one
// connection fail: pgx's "conn busy"), and returns fn's error, or why the
// session could not run it (it ended).
func (Probe) OnConn(h *Hold, fn func(conn *sql.Conn) error) error { return h.s.withConn(fn) }

// Lose loses o with cause, as the keep-alive does when it finds one of
// its keys gone.
func (Probe) Lose(o *Owned, cause error) { o.lose(cause) }
