package sqllock

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"

	"github.com/sqllock/sqllock/internal/pglocks"
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

// manyQuery runs a statement whose rows it hands to row, one by one: a
// session's way to send one (its lease, its context, its driver).
type manyQuery func(q string, args []any, row func([]driver.Value) error) error

// many sends fn (pg_try_advisory_lock, or pg_advisory_unlock, which then
// runs on backend pid only) on every key in one statement through query,
// and returns, by position, whether the server answered true: the one
// decoder of every batch (a shared session's, a Session's). Every answer
// must come from backend pid (ErrSessionChanged otherwise), and every key
// must be answered. For more than sqltext.ManyRowsMax keys the answers
// come aggregated in one row (the positions not answered true).
func many(mode stmtMode, query manyQuery, fn string, pid int64, keys []sqltext.Key) ([]bool, error) {
	// Run on backend pid only: a statement that a pooler sent to another
	// server session takes and releases nothing there.
	only, agg := strconv.FormatInt(pid, 10), ""
	if len(keys) > sqltext.ManyRowsMax {
		agg = sqltext.AggNotTaken
	}
	q, args := mode.ManySQL(fn, only, agg, keys)
	got := make([]bool, len(keys))
	rows := 0
	err := query(q, args, func(v []driver.Value) error {
		rows++
		if p := pglocks.Int(v[len(v)-1]); p != pid {
			return sessionChanged(pid, p)
		}
		if agg != "" {
			missed := make([]bool, len(keys))
			if err := markPositions(v[0], missed); err != nil {
				return err
			}
			for i := range got {
				got[i] = !missed[i]
			}
			return nil
		}
		i := pglocks.Int(v[0])
		if i < 1 || int(i) > len(keys) {
			return errors.New("sqllock: answer out of range")
		}
		got[i-1] = v[1] == true
		return nil
	})
	want := len(keys)
	if agg != "" {
		want = 1
	}
	if err == nil && rows != want {
		err = fmt.Errorf("sqllock: %d answers for %d keys", rows, len(keys))
	}
	return got, err
}
