package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
)

// The server guard: advisory locks only mean something on PostgreSQL
// itself (and on its primary; see ErrStandby).

// checkServer refuses servers that do not implement PostgreSQL advisory
// locks. The answer is cached for the Locker's life; a failed check is
// retried on the next call.
func (l *Locker) checkServer(ctx context.Context, conn *sql.Conn) error {
	if l.serverOK.Load() {
		return nil
	}
	l.serverMu.Lock()
	defer l.serverMu.Unlock()
	if l.serverOK.Load() {
		return nil
	}
	var v string
	if err := conn.QueryRowContext(ctx, versionSQL).Scan(&v); err != nil {
		return fmt.Errorf("sqllock: check server version: %w", err)
	}
	if err := supported(v); err != nil {
		return err
	}
	l.serverOK.Store(true)
	return nil
}

// supported returns ErrUnsupportedServer for a version() string of a server
// whose advisory lock functions are not PostgreSQL's.
func supported(version string) error {
	for _, bad := range []string{"CockroachDB", "Redshift", "Materialize", "Spanner"} {
		if strings.Contains(version, bad) {
			return fmt.Errorf("%w: %s", ErrUnsupportedServer, version)
		}
	}
	rest, ok := strings.CutPrefix(version, "PostgreSQL ")
	if !ok {
		return fmt.Errorf("%w: version() is %q", ErrUnsupportedServer, version)
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	if major, err := strconv.Atoi(rest[:end]); err == nil && major < MinServerVersion {
		return fmt.Errorf("%w: PostgreSQL %d; sqllock needs PostgreSQL %d or later (the orphan bound's tcp_user_timeout)", ErrUnsupportedServer, major, MinServerVersion)
	}
	return nil
}

// MinServerVersion is the oldest PostgreSQL major version sqllock takes
// locks on: older servers are refused with [ErrUnsupportedServer]. The
// tests run on PostgreSQL 13, 15, 17 and 18.
const MinServerVersion = 12

// waitSlice returns the lock_timeout of a wait statement (see waitSQL),
// as "<n>ms": half the server's deadlock_timeout, asked on conn at the
// Locker's first wait and again after a wait was reported a deadlock
// (which says the setting was lowered since).
func (l *Locker) waitSlice(ctx context.Context, conn *sql.Conn) (string, error) {
	if s := l.slice.Load(); s != nil {
		return *s, nil
	}
	var ms int64
	if err := queryRow(ctx, l.abandoned, conn, waitSliceSQL, nil, &ms); err != nil {
		return "", err
	}
	s := strconv.FormatInt(ms, 10) + "ms"
	l.slice.Store(&s)
	return s, nil
}
