package sqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Fair waits. A Locker's waits (Lock, RLock, Do, elections) are one
// statement each, as a plain pg_advisory_lock is: the backend keeps its
// place in PostgreSQL's queue, which grants waiters in arrival order,
// across processes. Such a statement holds a snapshot while it waits, and
// CREATE INDEX CONCURRENTLY (REINDEX CONCURRENTLY, DETACH PARTITION
// CONCURRENTLY, ...) waits for old snapshots: run by the holder, the build
// would wait for the waiter, which waits for the holder, and PostgreSQL's
// deadlock check would end the build after deadlock_timeout. So while a
// Locker has waits, a watcher looks, every half deadlock_timeout, for a
// session waiting on the snapshot of one of them, and cancels that wait
// (only while it is blocked in its advisory wait); the wait starts again
// at once, with a new snapshot, at the end of the queue. Only then is the
// order not kept: a waiter gives its place up to a concurrent index build.

// waitGuard is a Locker's watcher of its fair waits.
type waitGuard struct {
	mu      sync.Mutex
	waits   map[int64]*guardedWait // guarded by mu: by backend pid
	running bool                   // guarded by mu: the watcher runs
}

// guardedWait is one wait statement the watcher watches.
type guardedWait struct {
	cancelled bool // guarded by waitGuard.mu: the watcher cancels it (set before the cancel is sent)
}

// watch starts watching the wait statement of backend pid, which is about
// to be sent; every half interval the watcher polls.
func (l *Locker) watch(pid int64, interval time.Duration) *guardedWait {
	g := &l.guard
	w := &guardedWait{}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waits == nil {
		g.waits = map[int64]*guardedWait{}
	}
	g.waits[pid] = w
	if !g.running {
		g.running = true
		go l.guardLoop(interval)
	}
	return w
}

// unwatch stops watching pid's wait, whose statement returned, and
// reports whether the watcher cancelled it (or was about to).
func (l *Locker) unwatch(pid int64, w *guardedWait) bool {
	g := &l.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.waits[pid] == w {
		delete(g.waits, pid)
	}
	return w.cancelled
}

// guardLoop polls until no wait is watched.
func (l *Locker) guardLoop(interval time.Duration) {
	g := &l.guard
	everyTick(interval, &g.mu, &g.waits, &g.running, func(pids []int64) { l.guardPoll(pids, interval) })
}

// guardPoll cancels the waits of pids that a session waits for (by their
// snapshot's virtual transaction): one statement finds them, and, when
// there are, they are marked (so that their 57014 reads as the watcher's)
// and a second one cancels those still blocked in their wait. No
// connection at once (the pool at its limit) skips the poll, as the
// keep-alive does; a server that does not answer costs the poll, never a
// waiter.
func (l *Locker) guardPoll(pids []int64, interval time.Duration) {
	if poolFull(l.db) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(interval, time.Second))
	defer cancel()
	conn, err := l.db.Conn(ctx)
	if err != nil {
		return
	}
	defer conn.Close()
	q, args := l.mode.Arrays(sqltext.SnapshotWaitersSQL, pidList(pids))
	var hit []int64
	err = queryRows(ctx, l.abandoned, conn, q, args, func(v []driver.Value) error {
		pid, ok := v[0].(int64)
		if !ok {
			return errors.New("sqllock: snapshot watcher: unexpected pid")
		}
		hit = append(hit, pid)
		return nil
	})
	if err != nil || len(hit) == 0 {
		return
	}
	g := &l.guard
	g.mu.Lock()
	for _, pid := range hit {
		if w := g.waits[pid]; w != nil {
			w.cancelled = true
		}
	}
	g.mu.Unlock()
	q, args = l.mode.Arrays(sqltext.CancelAdvisoryWaitSQL, pidList(hit))
	_ = queryRows(ctx, l.abandoned, conn, q, args, func([]driver.Value) error { return nil })
}

// pidList returns pids as a text array literal.
func pidList(pids []int64) string {
	var b strings.Builder
	for i, pid := range pids {
		if i == 0 {
			b.WriteByte('{')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(pid, 10))
	}
	b.WriteByte('}')
	return b.String()
}
