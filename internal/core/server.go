package core

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The server guard: advisory locks only mean something on PostgreSQL
// itself (and on its primary; see stmt.ErrStandby).

// ident is who answers on a connection: the server's start and its
// backend's start, in microseconds since the epoch (0: unknown). Every
// "still held" answer of the keep-alive is checked against the ident of
// the connection that was granted the lock: another server (restarted, or
// failed over to, where the same pid can hold the same key for someone
// else) or another backend under the same pid is a loss.
type ident struct{ server, backend, pid int64 }

// checkServer refuses servers that do not implement PostgreSQL advisory
// locks, and returns the identity of conn's backend. It asks once per
// connection (one round trip, before the connection's first lock
// statement); the server's answer is checked once for the Pool's life (a
// failed check is retried on the next call).
func (ss *serverState) checkServer(ctx context.Context, conn *sql.Conn) (ident, error) {
	p := ss.p
	if err := p.Pooled(); err != nil {
		return ident{}, err // nothing sent: refused before any lock
	}
	dc := stmt.DriverConnOf(conn)
	// A pinned session's connection is checked each time: its
	// transaction names the server session the pooler gave it.
	if id, ok := p.idents.Get(dc); ok && !p.cfg.TxPooler {
		return id, p.awaitProbe(ctx, conn, id)
	}
	var v string
	var id ident
	// Bounded as every statement of the Pool's: a blind driver's first
	// statement on a connection whose server stopped answering must not
	// hold the call past its context. Its answer is read for up to
	// stmt.AbandonGrace past ctx's end (wait.WithGrace): a check cut short costs
	// its connection (the driver closes it), and calls whose deadlines
	// are shorter than a check would open and close connections without
	// end; the caller gives it back checked, for the next call.
	gctx, cancel := wait.WithGrace(ctx)
	defer cancel()
	if err := stmt.QueryRow(gctx, p.Abandoned, conn, sqltext.VersionSQL, nil, &v, &id.pid, &id.server, &id.backend); err != nil {
		if unexpectedByMock(dc, err) {
			return ident{}, serverCheckUnexpected{err}
		}
		if poolerEvidence(err) {
			// pgx's statement cache meets a server session that another
			// client connection prepared on.
			perr := stmt.NewPoolerError(err.Error())
			p.sawPooler(perr)
			return ident{}, p.pooledOr(perr)
		}
		if stmt.SQLState(err) != "" && stmt.QueryRow(ctx, p.Abandoned, conn, sqltext.PlainVersionSQL, nil, &v) == nil {
			if err := Supported(v); err != nil {
				return ident{}, err // a server that only looks like PostgreSQL
			}
		}
		if stmt.LockTableFull(err) {
			// Its catalogue reads take locks too: a lock call on a full
			// lock table is told so, whichever statement met it first.
			return ident{}, fmt.Errorf("%w: check server version: %w", stmt.ErrLockTableFull, err)
		}
		return ident{}, fmt.Errorf("sqllock: check server version: %w", err)
	}
	if !p.serverOK.Load() {
		if err := p.serverChecked(v); err != nil {
			return ident{}, err
		}
	}
	if p.cfg.TxPooler {
		return id, nil // the pooler is known: nothing to probe
	}
	p.idents.Set(dc, id)
	if err := p.noteBackend(dc, id); err != nil {
		return ident{}, err
	}
	if err := p.awaitProbe(ctx, conn, id); err != nil {
		return ident{}, err
	}
	return id, nil
}

// unexpectedByMock reports whether err is go-sqlmock's refusal of a
// statement it was not told to expect, on dc, one of its connections: in
// a unit test that uses sqllockmock, the server check is the statement
// such a test forgets.
func unexpectedByMock(dc any, err error) bool {
	if fmt.Sprintf("%T", dc) != "*sqlmock.sqlmock" {
		return false
	}
	msg := err.Error()
	for _, s := range []string{"was not expected", "could not match actual sql", "does not equal to expected", "arguments do not match"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// serverCheckUnexpected is the error of a server check that go-sqlmock
// did not expect: it names the expectation the test misses, in plain
// words, where the mock compares the statement with the one it expected
// (its error, which it wraps).
type serverCheckUnexpected struct{ mock error }

func (e serverCheckUnexpected) Error() string {
	return "sqllock: the mock database did not expect the server check, a Locker's first statement on each connection: " +
		"call sqllockmock.ExpectServerCheck(mock) first, once per Locker, before the expectation of its first session-level lock"
}

func (e serverCheckUnexpected) Unwrap() error { return e.mock }

// serverChecked checks version, the server's version(), once for the
// Pool, and makes its statements for that major version.
func (ss *serverState) serverChecked(v string) error {
	p := ss.p
	p.serverMu.Lock()
	defer p.serverMu.Unlock()
	if p.serverOK.Load() {
		return nil
	}
	if err := Supported(v); err != nil {
		return err
	}
	major := majorVersion(v)
	p.major.Store(int32(major))
	p.stmts.Store(sqltext.ForSettings(p.Mode, p.settings(p.cfg.AppName, false)))
	p.leased.Store(leases(p.cfg, major))
	p.serverOK.Store(true)
	return nil
}

// settings returns what a lock session needs, for the server's major
// version (0 before the server check), with application name appName
// (forced on the session when force is true).
func (ss *serverState) settings(appName string, force bool) sqltext.Settings {
	p := ss.p
	major := int(p.major.Load())
	st := sessionSettings(p.cfg.OrphanBound, appName, major)
	st.ForceAppName = force
	st.Local = p.cfg.TxPooler
	if leases(p.cfg, major) {
		st.IdleTimeoutMs = int(p.cfg.OrphanBound / time.Millisecond)
	}
	return st
}

// sql returns the Pool's session-level statements, made for the server's
// major version by the server check, which every session-level call runs
// first.
func (ss *serverState) sql() *statements {
	p := ss.p
	if s := p.stmts.Load(); s != nil {
		return s
	}
	return sqltext.ForSettings(p.Mode, p.settings(p.cfg.AppName, false))
}

// statementsFor returns the statements of a lock whose session is named
// named (an election candidate's: set on the session while it waits and
// while it holds the lock), or the Pool's own for "".
func (ss *serverState) statementsFor(named string) *statements {
	p := ss.p
	if named == "" {
		return p.sql()
	}
	return sqltext.ForSettings(p.Mode, p.settings(named, true))
}

// majorVersion returns the major version of a version() string of
// PostgreSQL ("PostgreSQL 16.4 on ...": 16), or 0.
func majorVersion(version string) int {
	rest, ok := strings.CutPrefix(version, "PostgreSQL ")
	if !ok {
		return 0
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	n, _ := strconv.Atoi(rest[:end])
	return n
}

// Supported returns an error matching stmt.ErrUnsupportedServer for a
// version() string of a server whose advisory lock functions are not
// PostgreSQL's, or of a PostgreSQL older than MinServerVersion.
func Supported(version string) error {
	for _, bad := range []string{"CockroachDB", "Redshift", "Materialize", "Spanner"} {
		if strings.Contains(version, bad) {
			return fmt.Errorf("%w: %s", stmt.ErrUnsupportedServer, version)
		}
	}
	if !strings.HasPrefix(version, "PostgreSQL ") {
		return fmt.Errorf("%w: version() is %q", stmt.ErrUnsupportedServer, version)
	}
	if major := majorVersion(version); major > 0 && major < MinServerVersion {
		return fmt.Errorf("%w: PostgreSQL %d; sqllock needs PostgreSQL %d or later (the orphan bound's tcp_user_timeout)", stmt.ErrUnsupportedServer, major, MinServerVersion)
	}
	return nil
}

// MinServerVersion is the oldest PostgreSQL major version sqllock takes
// locks on: older servers are refused with [ErrUnsupportedServer]. The
// tests run on PostgreSQL 13, 15, 17 and 18.
const MinServerVersion = 12
