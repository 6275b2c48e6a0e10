package sqllock

import (
	"database/sql/driver"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The statements this package sends are written in internal/sqltext, which
// sqllockmock reads too. Every statement reads its answer with QueryRow
// (never Exec: some drivers report success for a statement that a
// cancellation interrupted), and each lock statement returns the backend
// pid and pg_is_in_recovery() in the same round trip. Keys reach the
// server as bind parameters, or, for lib/pq, whose parameterized queries
// cost two round trips, rendered into the SQL text by sqltext: keys are
// integers it formats itself, so no caller text ever becomes SQL.

// lockKind is what a lock call asks for: one of PostgreSQL's eight
// advisory lock functions.
type lockKind = sqltext.Kind

const (
	kindTry    = sqltext.Try
	kindShared = sqltext.Shared
	kindXact   = sqltext.Xact
)

// stmtMode selects how keys reach the server.
type stmtMode = sqltext.Mode

const (
	bindKeys   = sqltext.Bind
	inlineKeys = sqltext.Inline
)

// statements are a Locker's session-level statements (see sqltext).
type statements = sqltext.Statements

// sqlKey returns k as the statements take it.
func (k Key) sqlKey() sqltext.Key {
	c, i, pair := k.Pair()
	v, _ := k.Int64()
	return sqltext.Key{Pair: pair, V: v, Class: c, ID: i}
}

// sqlKeys returns keys as the statements take them.
func sqlKeys(keys []Key) []sqltext.Key {
	out := make([]sqltext.Key, len(keys))
	for i, k := range keys {
		out[i] = k.sqlKey()
	}
	return out
}

// detectMode picks inlineKeys for lib/pq and bindKeys for every other
// driver (see sqltext.DetectMode).
func detectMode(d driver.Driver) stmtMode { return sqltext.DetectMode(d) }
