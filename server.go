package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The server guard: advisory locks only mean something on PostgreSQL
// itself (and on its primary; see ErrStandby).

// ident is who answers on a connection: the server's start and its
// backend's start, in microseconds since the epoch (0: unknown). Every
// "still held" answer of the keep-alive is checked against the ident of
// the connection that was granted the lock: another server (restarted, or
// failed over to, where the same pid can hold the same key for someone
// else) or another backend under the same pid is a loss.
type ident struct{ server, backend int64 }

// checkServer refuses servers that do not implement PostgreSQL advisory
// locks, and returns the identity of conn's backend. It asks once per
// connection (one round trip, before the connection's first lock
// statement); the server's answer is checked once for the Locker's life (a
// failed check is retried on the next call).
func (l *Locker) checkServer(ctx context.Context, conn *sql.Conn) (ident, error) {
	dc := driverConnOf(conn)
	if id, ok := l.idents.get(dc); ok {
		return id, nil
	}
	var v string
	var pid int64
	var id ident
	// Bounded as every statement of the Locker's: a blind driver's first
	// statement on a connection whose server stopped answering must not
	// hold the call past its context.
	if err := queryRow(ctx, l.abandoned, conn, sqltext.VersionSQL, nil, &v, &pid, &id.server, &id.backend); err != nil {
		if sqlState(err) != "" && queryRow(ctx, l.abandoned, conn, sqltext.PlainVersionSQL, nil, &v) == nil {
			if err := supported(v); err != nil {
				return ident{}, err // a server that only looks like PostgreSQL
			}
		}
		return ident{}, fmt.Errorf("sqllock: check server version: %w", err)
	}
	if !l.serverOK.Load() {
		if err := l.serverChecked(v); err != nil {
			return ident{}, err
		}
	}
	l.idents.set(dc, id)
	return id, nil
}

// serverChecked checks version, the server's version(), once for the
// Locker, and makes its statements for that major version.
func (l *Locker) serverChecked(v string) error {
	l.serverMu.Lock()
	defer l.serverMu.Unlock()
	if l.serverOK.Load() {
		return nil
	}
	if err := supported(v); err != nil {
		return err
	}
	major := majorVersion(v)
	l.major.Store(int32(major))
	l.stmts.Store(sqltext.ForSettings(l.mode, l.settings(l.cfg.appName, false)))
	l.leased.Store(leases(l.cfg, major))
	l.serverOK.Store(true)
	return nil
}

// settings returns what a lock session needs, for the server's major
// version (0 before the server check), with application name appName
// (forced on the session when force is true).
func (l *Locker) settings(appName string, force bool) sqltext.Settings {
	major := int(l.major.Load())
	st := sessionSettings(l.cfg.orphanBound, appName, major)
	st.ForceAppName = force
	if leases(l.cfg, major) {
		st.IdleTimeoutMs = int(l.cfg.orphanBound / time.Millisecond)
	}
	return st
}

// sql returns the Locker's session-level statements, made for the server's
// major version by the server check, which every session-level call runs
// first.
func (l *Locker) sql() *statements {
	if s := l.stmts.Load(); s != nil {
		return s
	}
	return sqltext.ForSettings(l.mode, l.settings(l.cfg.appName, false))
}

// statementsFor returns the statements of a lock whose session is named
// named (an election candidate's: set on the session while it waits and
// while it holds the lock), or the Locker's own for "".
func (l *Locker) statementsFor(named string) *statements {
	if named == "" {
		return l.sql()
	}
	return sqltext.ForSettings(l.mode, l.settings(named, true))
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

// supported returns ErrUnsupportedServer for a version() string of a server
// whose advisory lock functions are not PostgreSQL's.
func supported(version string) error {
	for _, bad := range []string{"CockroachDB", "Redshift", "Materialize", "Spanner"} {
		if strings.Contains(version, bad) {
			return fmt.Errorf("%w: %s", ErrUnsupportedServer, version)
		}
	}
	if !strings.HasPrefix(version, "PostgreSQL ") {
		return fmt.Errorf("%w: version() is %q", ErrUnsupportedServer, version)
	}
	if major := majorVersion(version); major > 0 && major < minServerVersion {
		return fmt.Errorf("%w: PostgreSQL %d; sqllock needs PostgreSQL %d or later (the orphan bound's tcp_user_timeout)", ErrUnsupportedServer, major, minServerVersion)
	}
	return nil
}

// minServerVersion is the oldest PostgreSQL major version sqllock takes
// locks on: older servers are refused with [ErrUnsupportedServer]. The
// tests run on PostgreSQL 13, 15, 17 and 18.
const minServerVersion = 12

// waitSlice returns the lock_timeout of a wait statement (see waitSQL),
// as "<n>ms": half the server's deadlock_timeout, asked on w at the
// Locker's first wait and again after a wait was reported a deadlock
// (which says the setting was lowered since).
func (e *engine) waitSlice(ctx context.Context, w waiter) (string, error) {
	if s := e.slice.Load(); s != nil {
		return *s, nil
	}
	var ms int64
	if err := w.queryRow(ctx, sqltext.WaitSliceSQL, nil, &ms); err != nil {
		return "", err
	}
	s := strconv.FormatInt(ms, 10) + "ms"
	e.slice.Store(&s)
	return s, nil
}
