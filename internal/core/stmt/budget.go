package stmt

import (
	"container/list"
	"context"
	"database/sql"
	"sync"
	"time"
)

// The connection budget: the application's pool is the application's.
//
// A Pool takes connections from its pool for two kinds of work. Sessions
// carry what a live caller asked for: a held lock, the wait of a key's
// queue's head, the shared sessions, an Owned; they are bounded by what
// the application asks (one waiting session per key, the core's sharedLimit shared
// ones) and end with it. Everything else is the budget's: a connection
// being set up and checked before it becomes a session (its setup goes on
// when its caller left, so that no setup is wasted), the cancel of an
// abandoned wait (wait's stopWait), a blind driver's statement left to finish
// alone until its connection is closed, the pooler probe's second
// connection, the freeing of a pooled server session. That is what
// impatient callers (tiny deadlines, cancellations) leave behind them,
// and it is bounded: a connection is counted from before it is asked of
// the pool until it is back there, closed, or a session, and a new one is
// asked for only while fewer than BudgetLimit are counted. So the Pool
// never holds more than that many such connections, open or closing, and
// never opens them faster than the old ones close: the rest of the pool
// stays the application's. (The keep-alive's one connection is not
// counted: it must run whatever the Pool's callers do.)
//
// A counted connection the Pool is done with (a setup whose caller left,
// a check answered past its caller's deadline), as it came from the pool,
// is kept for a moment (SpareLinger) as a spare, counted, for the Pool's
// next taker: callers that come and go would otherwise take and give back
// connections many times a second, and each of those trips through the
// pool could take the application's idle connection from under it, or
// close one for which the pool has no idle room; the application would
// then set up a connection of its own, which a loaded server makes slow.
// So is a waiting session's, once its wait ended, not granted (the
// core's giveConn); a session's that held a lock goes back to the pool as
// the session ends: whoever knew it as the lock's finds it closed. Spares are
// few (spareLimit: none in a pool of fewer than 4), and none is kept
// while the pool is at its limit, where someone may wait for it: they go
// back within sparePeriod once it is.

// Budget counts a Pool's connections outside its sessions (see above).
// A nil budget (the engine of LockTx and kin, which has no pool) counts
// nothing. Safe for concurrent use.
type Budget struct {
	DB *sql.DB // the pool

	mu sync.Mutex
	n  int // guarded by mu: connections counted, spares among them
	// limit is BudgetLimit as Take last read it; waiters are the Takes
	// that wait for room, in arrival order, each a channel closed once it
	// is counted. Guarded by mu.
	limit   int
	waiters list.List
	// spare are connections kept for the next taker, the most recently
	// kept last; sweep looks at them every sparePeriod while armed (see
	// swept). All guarded by mu; sweep is made once.
	spare []spareConn
	sweep *time.Timer
	armed bool
}

// spareConn is a spare connection, and when (MonoNow) it was kept.
type spareConn struct {
	conn *sql.Conn
	at   int64
}

// SpareLinger is how long a spare connection waits for a taker before it
// goes back to the pool: as long as an idle shared session, which bridges
// callers that come and go. Every sparePeriod, spares go back at once
// when the pool is at its limit, where someone may wait for one.
// The core's shared sessions linger as long (the core's sessionLinger).
const (
	SpareLinger = time.Second
	sparePeriod = 100 * time.Millisecond
)

// BudgetMost is how many connections a budget counts in a pool without a
// limit (see BudgetLimit): as many as the core's shared sessions
// (the core's maxShared).
const BudgetMost = 16

// maxSpare is the most spares a budget keeps.
const maxSpare = 4

// BudgetLimit is how many connections a budget counts before a new one
// waits: a quarter of the pool's limit, as its shared sessions, and at
// least one; BudgetMost for a pool without a limit. What a Pool's callers
// leave behind then takes no more than that of the pool, however
// impatient they are: with its shared sessions (a quarter too), half of
// the pool stays for its waits, the locks it holds, and the application.
func BudgetLimit(st sql.DBStats) int {
	if n := st.MaxOpenConnections; n > 0 {
		return max(1, min(BudgetMost, n/4))
	}
	return BudgetMost
}

// spareLimit is how many spares a budget keeps: a quarter of the pool's
// limit (none in a pool of fewer than 4, where one would be a third of it
// or more), and at most maxSpare.
func spareLimit(st sql.DBStats) int {
	if n := st.MaxOpenConnections; n > 0 {
		return min(maxSpare, n/4)
	}
	return maxSpare
}

// Waiting returns how many takes wait for room.
func (b *Budget) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiters.Len()
}

// Take counts one connection, waiting while the budget's limit are
// counted, in arrival order (as x/sync's semaphore serves its waiters),
// for as long as ctx lets it; then it returns ctx's error, and counts
// nothing.
func (b *Budget) Take(ctx context.Context) error {
	if b == nil {
		return nil
	}
	limit := BudgetLimit(b.DB.Stats())
	b.mu.Lock()
	b.limit = limit
	if b.n < limit && b.waiters.Len() == 0 {
		b.n++
		b.mu.Unlock()
		return nil
	}
	ready := make(chan struct{})
	w := b.waiters.PushBack(ready)
	b.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
	}
	b.mu.Lock()
	select {
	case <-ready:
		// Counted as ctx ended: given back, to the next one.
		b.n--
	default:
		b.waiters.Remove(w)
	}
	b.notifyLocked()
	b.mu.Unlock()
	return ctx.Err()
}

// notifyLocked counts the waiting takes, first come first, while there is
// room. The caller holds b.mu.
func (b *Budget) notifyLocked() {
	for b.n < b.limit {
		w := b.waiters.Front()
		if w == nil {
			return
		}
		b.n++
		b.waiters.Remove(w)
		close(w.Value.(chan struct{}))
	}
}

// TryTake counts one connection when fewer than the budget's limit are
// counted, and reports whether it did.
func (b *Budget) TryTake() bool {
	if b == nil {
		return true
	}
	limit := BudgetLimit(b.DB.Stats())
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n >= limit || b.waiters.Len() > 0 {
		return false
	}
	b.n++
	return true
}

// Add counts one connection whatever the limit: a session's connection
// left to a statement that finishes alone, which closes on its own.
func (b *Budget) Add() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.n++
	b.mu.Unlock()
}

// Give stops counting one connection: it is back in the pool, closed, or
// a session.
func (b *Budget) Give() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.n--
	b.notifyLocked()
	b.mu.Unlock()
}

// TakeSpare returns the spare most recently kept, still counted, or nil.
func (b *Budget) TakeSpare() *sql.Conn {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.spare)
	if n == 0 {
		return nil
	}
	conn := b.spare[n-1].conn
	b.spare[n-1] = spareConn{}
	b.spare = b.spare[:n-1]
	return conn
}

// Done takes back conn, a counted connection that holds nothing: kept as
// a spare when healthy and there is room for one (see keepLocked), else
// given back to the pool (which drops it when its driver says it is bad)
// and uncounted.
func (b *Budget) Done(conn *sql.Conn, healthy bool) {
	if b == nil {
		conn.Close()
		return
	}
	st := b.DB.Stats()
	b.mu.Lock()
	kept := healthy && b.keepLocked(conn, st)
	b.mu.Unlock()
	if !kept {
		conn.Close()
		b.Give()
	}
}

// Keep keeps conn, a connection the budget does not count (a waiting
// session's, once it ended holding nothing: see the core's giveConn), as
// a spare, counted, when the budget has room for one more within its
// limit, and for a spare (see keepLocked); it reports whether it did
// (if not, its caller gives conn back to the pool).
func (b *Budget) Keep(conn *sql.Conn) bool {
	if b == nil {
		return false
	}
	st := b.DB.Stats()
	limit := BudgetLimit(st)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.n >= limit || !b.keepLocked(conn, st) {
		return false
	}
	b.n++
	return true
}

// keepLocked keeps conn as a spare, and reports whether it did: not when
// the budget keeps spareLimit already, nor when a take waits for room (it
// takes conn from the pool), nor when the pool (statistics st, conn in
// use among them) is at its limit, where someone may wait for a
// connection. The caller holds b.mu.
func (b *Budget) keepLocked(conn *sql.Conn, st sql.DBStats) bool {
	if len(b.spare) >= spareLimit(st) || b.waiters.Len() > 0 || st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections {
		return false
	}
	b.spare = append(b.spare, spareConn{conn: conn, at: MonoNow()})
	if !b.armed {
		b.armed = true
		if b.sweep == nil {
			b.sweep = time.AfterFunc(sparePeriod, b.swept)
		} else {
			b.sweep.Reset(sparePeriod)
		}
	}
	return true
}

// swept gives back to the pool the spares kept SpareLinger ago or more,
// or all of them when the pool is at its limit, and looks again in
// sparePeriod while any is left.
func (b *Budget) swept() {
	st := b.DB.Stats()
	full := st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections
	now := MonoNow()
	b.mu.Lock()
	i := 0
	for i < len(b.spare) && (full || time.Duration(now-b.spare[i].at) >= SpareLinger) {
		i++
	}
	old := make([]*sql.Conn, i)
	for j := range old {
		old[j] = b.spare[j].conn
	}
	rest := copy(b.spare, b.spare[i:])
	clear(b.spare[rest:])
	b.spare = b.spare[:rest]
	b.armed = rest > 0
	if b.armed {
		b.sweep.Reset(sparePeriod)
	}
	b.mu.Unlock()
	for _, conn := range old {
		conn.Close()
		b.Give()
	}
}

// Flush gives every spare back to the pool now.
func (b *Budget) Flush() {
	if b == nil {
		return
	}
	b.mu.Lock()
	old := make([]*sql.Conn, len(b.spare))
	for i, s := range b.spare {
		old[i] = s.conn
	}
	clear(b.spare)
	b.spare = b.spare[:0]
	b.mu.Unlock()
	for _, conn := range old {
		conn.Close()
		b.Give()
	}
}

// Spares returns how many spare connections the budget keeps.
func (b *Budget) Spares() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.spare)
}

// Count returns how many connections are counted.
func (b *Budget) Count() int {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}
