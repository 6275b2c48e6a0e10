package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"sync/atomic"
)

// connHandle is a session's connection, and how it ends.
type connHandle struct {
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
	// returns (see endConnSoon).
	connMu   sync.Mutex
	connDone bool
	endNext  func()
}

// closeConn gives conn back to the pool as it came: its settings set back
// when they are applied (then the reset statement must be confirmed on
// its backend, or it is discarded), or closed outright when it was handed
// to a caller (whose statements may have changed it in ways no reset is
// sure to undo: settings, temporary tables, prepared statements, LISTEN).
// The caller holds connMu (see endConn).
func (s *session) closeConn() {
	if !s.handedOut.Load() && s.prep.close(s.p.UnlockContext(), s.p.abandoned, s.conn) != nil {
		s.p.discard(s.conn, "prepared statements not closed")
		return
	}
	switch {
	case s.handedOut.Load():
		discardConn(s.conn)
	case s.p.cfg.TxPooler:
		// Its settings are local to its transaction, and end with it.
		if err := s.p.commitPinned(s.conn); err != nil {
			s.p.discard(s.conn, "pinned session: commit: "+err.Error())
			s.p.discardStranded(s.id)
			return
		}
		s.conn.Close()
	case s.tuned:
		s.p.closeSession(s.conn, s.pid)
	default:
		s.conn.Close()
	}
}

// endConn ends conn with end (close it, reset it, discard it) once no
// statement is on it, and only once: the first end asked for, by endConn
// or endConnSoon, is the one that runs.
func (s *session) endConn(end func()) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	s.mu.Lock()
	if s.endNext == nil {
		s.endNext = end
	}
	s.mu.Unlock()
	s.endNextLocked()
}

// endConnSoon is endConn without waiting for a statement on conn: the
// statement's caller ends conn as it returns (releaseConn). An Owned's
// wait lasts as long as its caller likes; whoever finds the session lost
// does not wait for it.
func (s *session) endConnSoon(end func()) {
	s.mu.Lock()
	if s.endNext == nil {
		s.endNext = end
	}
	s.mu.Unlock()
	if s.connMu.TryLock() {
		s.endNextLocked()
		s.connMu.Unlock()
	}
}

// endNextLocked runs endConnSoon's end, if one is due; the caller holds
// connMu.
func (s *session) endNextLocked() {
	s.mu.Lock()
	end := s.endNext
	s.endNext = nil
	s.mu.Unlock()
	if end != nil && !s.connDone {
		s.connDone = true
		end()
		close(s.gone)
	}
}

// holdConn and releaseConn bracket a statement on conn: holdConn fails
// with sql.ErrConnDone once conn was ended; releaseConn ends it when
// endConnSoon asked meanwhile.
func (s *session) holdConn() error {
	s.connMu.Lock()
	if s.connDone {
		s.connMu.Unlock()
		return sql.ErrConnDone
	}
	return nil
}

func (s *session) releaseConn() {
	s.connMu.Unlock()
	s.mu.Lock()
	due := s.endNext != nil
	s.mu.Unlock()
	// Whoever holds connMu now ends conn as its statement returns, if
	// this TryLock finds it taken.
	if due && s.connMu.TryLock() {
		s.endNextLocked()
		s.connMu.Unlock()
	}
}

// withConn runs fn, statements on conn (a query, a wait), under connMu and
// the lease's busy mark; an answer, rows or none, is a sign of life.
func (s *session) withConn(fn func(conn *sql.Conn) error) error {
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
func (s *session) queryRow(q string, args []any, dest ...any) error {
	return s.queryRowCtx(s.p.UnlockContext(), q, args, dest...)
}

func (s *session) queryRows(q string, args []any, row func([]driver.Value) error) error {
	return s.queryRowsCtx(s.p.UnlockContext(), q, args, row)
}

func (s *session) queryRowCtx(ctx context.Context, q string, args []any, dest ...any) error {
	v := via{blind: s.p.abandoned, prep: s.prep}
	return s.withConn(func(conn *sql.Conn) error { return queryRowVia(ctx, v, conn, q, args, dest...) })
}

func (s *session) queryRowsCtx(ctx context.Context, q string, args []any, row func([]driver.Value) error) error {
	v := via{blind: s.p.abandoned, prep: s.prep}
	return s.withConn(func(conn *sql.Conn) error { return queryRowsVia(ctx, v, conn, q, args, row) })
}

// closeSession sets conn's settings back (on backend pid only) and gives it
// back to the pool; when that is not confirmed on backend pid, it discards
// the connection instead.
func (p *Pool) closeSession(conn *sql.Conn, pid int64) {
	q, args := p.sql().SetBackSQL(pid)
	if err := queryRow(p.UnlockContext(), p.abandoned, conn, q, args, skip); err != nil {
		p.discard(conn, "session settings not reset")
		return
	}
	conn.Close()
}
