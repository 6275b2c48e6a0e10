package core

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Pinned sessions: a Pool made for a transaction pooler (Config.TxPooler)
// holds its locks inside transactions it keeps open on its own client
// connections. Every transaction-mode pooler keeps a transaction on one
// server session from its first statement to its end, so a session of
// the Pool is one transaction: it begins as the session opens (before the
// server check, which then names the server session the transaction
// pins), and every statement of the session runs in it. Its locks are
// session-level (several keys in one transaction, each released on its
// own); its settings are local to the transaction, so nothing of the
// Pool's rides back to the pooler's server sessions; its waits run in
// savepoints (a lock_timeout, a deadlock, a cancel abort only the
// savepoint, not the transaction that holds the other locks); the
// transaction's own idle_in_transaction_session_timeout is the lease of a
// holder that stops showing life.
//
// It ends one of two ways. Clean: every lock released (confirmed), then
// COMMIT: the pooler gets its server session back as it gave it. In doubt:
// the client connection is closed while the transaction is still open, and
// a pooler that cannot reuse a server session in the middle of a
// transaction closes it (PgBouncer does), which ends the locks; the Pool
// then checks, from another connection, that no idle server session is
// left holding them (a pooler that rolls back and hands the server session
// on would keep them: see discardStranded).
//
// The statements of a pinned session never leave a prepared statement on
// the server session: lib/pq sends them unnamed, and pgx, whose statement
// cache prepares named ones, is told to use its simple protocol for them
// (stmt.SimpleModeOf).

// pinning is the part of a Pool that makes its sessions transactions, when
// it pins them (Config.TxPooler).
type pinning struct {
	p *Pool // its Pool
}

// ErrPinnedSession is Pool.Open's error on a Pool that pins its sessions:
// a Session hands its connection to its caller, whose statements would run
// in the transaction that holds its locks (one that fails aborts it).
var ErrPinnedSession = errors.New("sqllock: a Session is not available with WithTransactionPooler: its connection would run the caller's statements inside the transaction that holds its locks; use Locker.Lock, TryLock or Do for the locks, and InTx or LockTx to lock in a transaction of your own")

// checkPinned makes conn, just taken from the pool (wait.Engine.TakeConn), a lock
// session's: it begins its transaction when the Pool pins its sessions
// (pin), and checks the server (checkServer). On failure conn is given
// back as it came, or, once a transaction may have begun on it,
// discarded. A check answered once ctx had ended (it is read past ctx's
// end) gives conn back checked, for the next call, and returns ctx's
// error.
func (pn *pinning) checkPinned(ctx context.Context, conn *sql.Conn) (ident, error) {
	p := pn.p
	if p.cfg.TxPooler {
		if err := p.pin(ctx, conn); err != nil {
			unpin(conn)
			p.discard(conn, "pinned session: "+err.Error())
			p.Budget.Give()
			return ident{}, fmt.Errorf("sqllock: begin the transaction of a lock session: %w", err)
		}
	}
	id, err := p.checkServer(ctx, conn)
	switch {
	case err == nil && !p.cfg.TxPooler && stmt.CtxEnded(ctx):
		p.putBack(conn, true)
		return ident{}, stmt.CtxErr(ctx)
	case err == nil:
		return id, nil
	case p.cfg.TxPooler:
		unpin(conn)
		p.discard(conn, "pinned session: "+err.Error())
		p.Budget.Give()
	default:
		p.putBack(conn, false) // no lock statement ran on it
	}
	return ident{}, err
}

// pin begins the transaction of a pinned session on conn.
func (pn *pinning) pin(ctx context.Context, conn *sql.Conn) error {
	p := pn.p
	var dc any
	if err := stmt.OnDriverConn(conn, func(d any) error { dc = d; return nil }); err != nil {
		return err
	}
	if m, ok := stmt.SimpleModeOf(dc); ok && stmt.ComparableConn(dc) {
		stmt.SimpleConns.Store(dc, m)
		stmt.SimpleCount.Add(1)
	}
	return wait.TxExecOn(ctx, p.Abandoned, conn, sqltext.BeginPinnedSQL)
}

// simpleFor makes the statements the Pool sends on conn, a connection of
// the pool that is not a pinned session's, go in pgx's simple protocol
// while the Pool uses it, when the Pool is behind a transaction pooler:
// a prepared statement would meet another server session than the one it
// was prepared on. done undoes it.
func (pn *pinning) simpleFor(conn *sql.Conn) (done func()) {
	p := pn.p
	if !p.cfg.TxPooler {
		return func() {}
	}
	var dc any
	_ = stmt.OnDriverConn(conn, func(d any) error { dc = d; return nil })
	if m, ok := stmt.SimpleModeOf(dc); ok && stmt.ComparableConn(dc) {
		if _, had := stmt.SimpleConns.LoadOrStore(dc, m); !had {
			stmt.SimpleCount.Add(1)
			return func() { unpin(conn) }
		}
	}
	return func() {}
}

// SimpleArgs returns args, for a statement the caller runs on conn
// through database/sql, with pgx's option for its simple protocol ahead of
// them when the Pool is behind a transaction pooler (see simpleFor).
func (pn *pinning) SimpleArgs(conn *sql.Conn, args []any) []any {
	p := pn.p
	if !p.cfg.TxPooler {
		return args
	}
	var dc any
	_ = stmt.OnDriverConn(conn, func(d any) error { dc = d; return nil })
	if m, ok := stmt.SimpleModeOf(dc); ok {
		return append([]any{m}, args...)
	}
	return args
}

// SimpleProtocol returns the arguments that make pgx send the next
// statement on conn in its simple protocol (nil for another driver): for
// a statement the caller runs through database/sql on a connection that
// may reach a transaction pooler.
func SimpleProtocol(conn *sql.Conn) []any {
	var dc any
	_ = stmt.OnDriverConn(conn, func(d any) error { dc = d; return nil })
	if m, ok := stmt.SimpleModeOf(dc); ok {
		return []any{m}
	}
	return nil
}

// QueryRow runs q, which answers one row, on a connection of the pool,
// and scans it into dest (any types database/sql scans): for the
// package's reads on no lock session (an election's leader), which behind
// a transaction pooler go in pgx's simple protocol (see simpleFor).
func (pn *pinning) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	p := pn.p
	conn, err := p.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.QueryRowContext(ctx, q, p.SimpleArgs(conn, args)...).Scan(dest...)
}

// unpin forgets conn's driver connection once its pinned session ended.
func unpin(conn *sql.Conn) {
	_ = stmt.OnDriverConn(conn, func(dc any) error {
		if !stmt.ComparableConn(dc) {
			return nil
		}
		if _, ok := stmt.SimpleConns.LoadAndDelete(dc); ok {
			stmt.SimpleCount.Add(-1)
		}
		return nil
	})
}

// commitPinned ends a pinned session's transaction, which holds nothing,
// cleanly (see closeConn).
func (pn *pinning) commitPinned(conn *sql.Conn) error {
	p := pn.p
	err := wait.TxExecOn(p.UnlockContext(), p.Abandoned, conn, sqltext.CommitPinnedSQL)
	unpin(conn)
	return err
}

// Pinned reports whether the Pool pins its sessions (Config.TxPooler).
func (pn *pinning) Pinned() bool {
	p := pn.p
	return p.cfg.TxPooler
}

// Token returns a fencing token for h's lock (see sqltext.TokenSQL),
// issued while it holds it. A pinned session cannot commit the token's
// transaction (its transaction holds its locks): the token is taken on
// another connection, in a transaction of its own, for the holder's
// backend (TokenOfSQL), then the holder's session confirms it still
// holds the lock (HeldSQL), so the token came while it did. ctx bounds
// the calls; the errors are Tag's.
func (h *Hold) Token(ctx context.Context) (int64, error) {
	p := h.s.p
	if !p.cfg.TxPooler {
		return h.Tag(ctx, sqltext.TokenSQL)
	}
	if err := h.Err(); err != nil {
		return 0, err
	}
	c, o, sub := stmt.Tag(h.key)
	q, args := p.Mode.TokenOfArgs(int64(c), int64(o), sub, h.pid)
	var tok int64
	err := p.inTransaction(ctx, func(conn *sql.Conn) error {
		return stmt.QueryRow(ctx, p.Abandoned, conn, q, args, &tok)
	})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Not held by its backend: the holder's own session says why.
	case err != nil:
		return 0, fmt.Errorf("sqllock: token of %s: %w", p.name(h.key), err)
	}
	if _, herr := h.Tag(ctx, sqltext.HeldSQL); herr != nil {
		return 0, herr
	}
	if err != nil {
		return 0, fmt.Errorf("sqllock: token of %s: its backend %d did not hold it as the token was read, and holds it now", p.name(h.key), h.pid)
	}
	return tok, nil
}

// inTransaction runs f on a connection of the pool, in a transaction of
// its own that pins one server session (see pin), and commits it; a
// transaction that fails is left with its connection, which is
// discarded.
func (pn *pinning) inTransaction(ctx context.Context, f func(conn *sql.Conn) error) error {
	p := pn.p
	conn, err := p.TakeConn(ctx)
	if err != nil {
		return err
	}
	defer p.Budget.Give() // once conn is back, or discarded
	if err = p.pin(ctx, conn); err == nil {
		if err = f(conn); err == nil || errors.Is(err, sql.ErrNoRows) {
			ferr := err
			if err = p.commitPinned(conn); err == nil {
				conn.Close()
				return ferr
			}
		}
	}
	unpin(conn)
	p.discard(conn, "a transaction of its own: "+err.Error())
	return err
}

// askWaitedOn asks, on conn (one of the Pool's pinned sessions, through
// its queue), which of the Pool's pinned sessions another backend waits
// for (sqltext.WaitedOnSQL: a CREATE INDEX CONCURRENTLY that began its
// last phase as a statement of theirs ran): such a shared session takes
// no new lock from then on, and ends, with its transaction, once its
// locks are released; a session of one lock's is logged (its transaction
// ends with the lock).
func (pn *pinning) askWaitedOn(ctx context.Context, conn *sql.Conn) error {
	p := pn.p
	live := p.liveSessions()
	byPID := make(map[int64]*session, len(live))
	var pids strings.Builder
	for _, s := range live {
		if s.id.pid == 0 {
			continue
		}
		if pids.Len() == 0 {
			pids.WriteByte('{')
		} else {
			pids.WriteByte(',')
		}
		pids.WriteString(strconv.FormatInt(s.id.pid, 10))
		byPID[s.id.pid] = s
	}
	if pids.Len() == 0 {
		return nil
	}
	pids.WriteByte('}')
	q, args := p.Mode.Arrays(sqltext.WaitedOnSQL, pids.String())
	rows, err := conn.QueryContext(ctx, q, p.SimpleArgs(conn, args)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var pid int64
		if err := rows.Scan(&pid); err != nil {
			return err
		}
		if s := byPID[pid]; s != nil {
			s.waitedOn()
		}
	}
	return rows.Err()
}

// waitedOn is told that another backend waits for the end of s's
// transaction (see askWaitedOn): a shared session takes no new lock, and
// ends once its locks are released; a session of its own is logged once.
func (s *session) waitedOn() {
	s.mu.Lock()
	shared, first := s.kind == kindShared, !s.waited
	s.waited = true
	if shared {
		s.setStateLocked(retiring, nil)
	}
	s.mu.Unlock()
	if shared {
		s.maybeLinger() // idle already: it ends now
	}
	if first {
		s.p.hooks.Log(context.Background(), slog.LevelWarn, "sqllock: a backend waits for the end of a lock session's transaction (CREATE INDEX CONCURRENTLY or its kin, behind a transaction pooler): it goes on once the session's locks are released", Key{}, false,
			slog.Int64("pid", s.id.pid), slog.Bool("shared", shared))
	}
}

// waiterOf returns s's connection as a waiter.
func (cs *connections) waiterOf(s *session) wait.ConnWaiter {
	p := cs.p
	return wait.ConnWaiter{Conn: s.conn, Blind: p.Abandoned, Mark: s.mark, Pinned: p.cfg.TxPooler}
}
