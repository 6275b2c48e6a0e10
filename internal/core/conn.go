package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// connHandle is a session's connection, and how it ends.
type connHandle struct {
	s    *session // its session
	conn *sql.Conn
	// handedOut: the owner handed conn to its caller (Owned.Conn), whose
	// statements on it run outside connMu.
	handedOut atomic.Bool
	gone      chan struct{} // closed once conn is ended (closed, reset or discarded)
	// connMu is held across each statement on conn, and by whoever ends
	// conn (closes, resets or discards it): database/sql's Conn is not safe
	// to close while a call on it is starting (that call can find its
	// driver connection gone, and panic). connDone, guarded by connMu: conn
	// was ended; later statements fail with sql.ErrConnDone. endNext,
	// guarded by the session's mu: how conn ends once the statement on it
	// returns (see closeConnSoon).
	connMu   sync.Mutex
	connDone bool
	endNext  func()
}

// closeConn gives conn back to the pool as it came: its settings set back
// when they are applied (then the reset statement must be confirmed on
// its backend, or it is discarded), or closed outright when it was handed
// to a caller (whose statements may have changed it in ways no reset is
// sure to undo: settings, temporary tables, prepared statements, LISTEN).
// The caller holds connMu (see closeConnBy).
func (c *connHandle) closeConn() {
	s := c.s
	if !s.handedOut.Load() && s.prep.Close(s.p.UnlockContext(), s.p.Abandoned, s.conn) != nil {
		s.p.discard(s.conn, "prepared statements not closed")
		return
	}
	switch {
	case s.handedOut.Load():
		stmt.DiscardConn(s.conn)
	case s.p.cfg.TxPooler:
		// Its settings are local to its transaction, and end with it.
		if err := s.p.commitPinned(s.conn); err != nil {
			s.p.discard(s.conn, "pinned session: commit: "+err.Error())
			s.p.discardStranded(s.id)
			return
		}
		s.conn.Close()
	case s.tuned:
		s.p.closeSession(s.conn, s.pid, s.spareConn())
	default:
		s.p.giveConn(s.conn, s.spareConn())
	}
}

// spareConn reports whether s's connection, once it holds nothing and
// carries none of the session's settings, may be kept as a spare for the
// Pool's next session (see giveConn): a dedicated session's that only
// waited, which impatient callers (short deadlines) take and end many
// times a second. (One that held a lock goes back to the pool: whoever
// knew it as the lock's finds it closed.) The caller holds connMu.
func (c *connHandle) spareConn() bool {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kind == kindDedicated && !s.held.ever
}

// closeConnBy ends conn with end (close it, reset it, discard it) once no
// statement is on it, and only once: the first end asked for, by closeConnBy
// or closeConnSoon, is the one that runs.
func (c *connHandle) closeConnBy(end func()) {
	s := c.s
	s.connMu.Lock()
	defer s.connMu.Unlock()
	s.mu.Lock()
	if s.endNext == nil {
		s.endNext = end
	}
	s.mu.Unlock()
	s.closeNextLocked()
}

// closeConnSoon is closeConnBy without waiting for a statement on conn: the
// statement's caller ends conn as it returns (releaseConn). An Owned's
// wait lasts as long as its caller likes; whoever finds the session lost
// does not wait for it.
func (c *connHandle) closeConnSoon(end func()) {
	s := c.s
	s.mu.Lock()
	if s.endNext == nil {
		s.endNext = end
	}
	s.mu.Unlock()
	if s.connMu.TryLock() {
		s.closeNextLocked()
		s.connMu.Unlock()
	}
}

// closeNextLocked runs closeConnSoon's end, if one is due; the caller holds
// connMu.
func (c *connHandle) closeNextLocked() {
	s := c.s
	s.mu.Lock()
	end := s.endNext
	s.endNext = nil
	s.mu.Unlock()
	if end != nil && !s.connDone {
		s.connDone = true
		end()
		close(s.gone)
		s.p.unended.Add(-1)
	}
}

// holdConn and releaseConn bracket a statement on conn: holdConn fails
// with sql.ErrConnDone once conn was ended; releaseConn ends it when
// closeConnSoon asked meanwhile.
func (c *connHandle) holdConn() error {
	s := c.s
	s.connMu.Lock()
	if s.connDone {
		s.connMu.Unlock()
		return sql.ErrConnDone
	}
	return nil
}

func (c *connHandle) releaseConn() {
	s := c.s
	s.connMu.Unlock()
	s.mu.Lock()
	due := s.endNext != nil
	s.mu.Unlock()
	// Whoever holds connMu now ends conn as its statement returns, if
	// this TryLock finds it taken.
	if due && s.connMu.TryLock() {
		s.closeNextLocked()
		s.connMu.Unlock()
	}
}

// withConn runs fn, statements on conn (a query, a wait), under connMu and
// the lease's busy mark; an answer, rows or none, is a sign of life.
func (c *connHandle) withConn(fn func(conn *sql.Conn) error) error {
	s := c.s
	if err := s.holdConn(); err != nil {
		return err
	}
	defer s.releaseConn()
	sent := s.ls.begin()
	err := fn(s.conn)
	s.ls.done(sent, err == nil || errors.Is(err, sql.ErrNoRows))
	return err
}

// queryRow and queryRows run one statement on the session, the lease's
// busy mark around it: its outcome is recorded as a sign of life before
// any caller hears it, so a caller that is told (and the process stopped
// right after) never meets a lease that still looks busy. The queue's
// statements are bounded like an unlock (UnlockContext); an Owned's own
// calls pass their ctx (queryRowCtx, queryRowsCtx).
func (c *connHandle) queryRow(q string, args []any, dest ...any) error {
	s := c.s
	return s.queryRowCtx(s.p.UnlockContext(), q, args, dest...)
}

func (c *connHandle) queryRows(q string, args []any, row func([]driver.Value) error) error {
	s := c.s
	return s.queryRowsCtx(s.p.UnlockContext(), q, args, row)
}

func (c *connHandle) queryRowCtx(ctx context.Context, q string, args []any, dest ...any) error {
	s := c.s
	v := stmt.Via{Blind: s.p.Abandoned, Prep: s.prep}
	return s.withConn(func(conn *sql.Conn) error { return stmt.QueryRowVia(ctx, v, conn, q, args, dest...) })
}

func (c *connHandle) queryRowsCtx(ctx context.Context, q string, args []any, row func([]driver.Value) error) error {
	s := c.s
	v := stmt.Via{Blind: s.p.Abandoned, Prep: s.prep}
	return s.withConn(func(conn *sql.Conn) error { return stmt.QueryRowsVia(ctx, v, conn, q, args, row) })
}

// connections is the part of a Pool that takes its connections into
// sessions and ends them, and bounds its unlocks (UnlockContext).
type connections struct {
	p             *Pool         // its Pool
	unlockTimeout time.Duration // the Pool's Config.UnlockTimeout
	epochMu       sync.Mutex
	epochCtx      context.Context // guarded by epochMu: see UnlockContext
	epochUntil    time.Time       // guarded by epochMu
	// unended counts the sessions whose connections are not ended yet
	// (made by newSession, ended by closeNextLocked): Close waits for
	// them.
	unended atomic.Int64
}

// closeSession sets conn's settings back (on backend pid only) and gives it
// back to the pool; when that is not confirmed on backend pid, it discards
// the connection instead.
func (cs *connections) closeSession(conn *sql.Conn, pid int64, spare bool) {
	p := cs.p
	q, args := p.sql().SetBackSQL(pid)
	if err := stmt.QueryRow(p.UnlockContext(), p.Abandoned, conn, q, args, stmt.Skip); err != nil {
		p.discard(conn, "session settings not reset")
		return
	}
	cs.giveConn(conn, spare)
}

// giveConn gives back conn, a session's connection that holds nothing and
// carries none of its settings: when spare is set, kept as a spare (see
// stmt.Budget.Keep) for the Pool's next session while there is room for
// one, so that the next one does not take the pool's idle connection
// from under the application, nor leave it one fewer when the pool has
// no idle room for the one given back; else to the pool.
func (cs *connections) giveConn(conn *sql.Conn, spare bool) {
	p := cs.p
	if !spare || p.Closed() || !p.Budget.Keep(conn) {
		conn.Close()
	}
}
