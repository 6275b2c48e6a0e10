package core

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The keep-alive's checks on a lock session: behind a transaction pooler,
// where another connection would need one of the pooler's few server
// sessions, and wherever a check's own connection is slow to set up (see
// monitor.ask).

// queryPinned runs the keep-alive query on one of the Pool's pinned
// sessions that holds locks (so none is waiting in it), through its
// queue, and reports false when there is none. Behind a transaction
// pooler, another connection would need a server session of the
// pooler's, which the Locker's own sessions (and others') may all hold:
// a check that waits in the pooler's queue until two checks fail would
// report every lock lost.
func (m *monitor) queryPinned(ctx context.Context, keys []heldKey, sent *atomic.Bool) (checkResult, bool) {
	s := m.checkSession()
	if s == nil {
		return checkResult{}, false
	}
	return m.querySession(ctx, s, keys, sent), true
}

// checkSession returns one of the Pool's sessions that holds locks (so
// none is waiting in it) and that user code cannot reach (not an Owned's,
// whose connection its Session hands out), a shared one first, or nil.
// (Behind a transaction pooler, a CREATE INDEX CONCURRENTLY that began its
// last phase as the check ran waits for the end of its transaction, which
// a shared session's comes within pinnedLife, and a session of one lock's
// only with that lock.)
func (m *monitor) checkSession() *session {
	var s *session
	for _, c := range m.p.liveSessions() {
		c.mu.Lock()
		ok := c.state != ended && c.held.n > 0 && c.kind != kindOwned
		shared := c.kind == kindShared
		c.mu.Unlock()
		if ok && (s == nil || shared) {
			s = c
			if shared {
				break
			}
		}
	}
	return s
}

// querySession runs the keep-alive query for keys on s, through its
// queue, as one of its statements.
func (m *monitor) querySession(ctx context.Context, s *session, keys []heldKey, sent *atomic.Bool) checkResult {
	var lost []lostKey
	o := newOp(opCheck, Key{})
	o.run = func(conn *sql.Conn) error {
		// Bounded as the session's statements are, not by the check's
		// ctx: a statement a driver gives up ends the session, and the
		// locks on it (the check's caller stops waiting at ctx's end).
		ctx := m.p.UnlockContext()
		if !m.p.cfg.TxPooler {
			var err error
			lost, err = queryLost(ctx, m.p, conn, keys)
			return err
		}
		// Its transaction read pg_stat_activity once already, and would
		// see those backends only: the snapshot goes first.
		err := conn.QueryRowContext(ctx, sqltext.ClearSnapshotSQL, m.p.SimpleArgs(conn, nil)...).Scan(new(any))
		if err == nil {
			lost, err = queryLost(ctx, m.p, conn, keys)
		}
		if err == nil {
			err = m.p.askWaitedOn(ctx, conn)
		}
		return err
	}
	o.done = make(chan struct{})
	m.p.stats.keepAlive.Add(1)
	sent.Store(true)
	s.submitAside(o)
	select {
	case <-o.done:
	case <-ctx.Done():
		return checkResult{err: ctx.Err()}
	}
	if errors.Is(o.err, sql.ErrConnDone) || s.dead() || s.closedCleanly() {
		// The session ended under the check (lost, or, holding nothing
		// any more, closed): it says nothing of the others; the next
		// check asks another.
		return checkResult{skipped: true}
	}
	return checkResult{lost: lost, err: o.err}
}
