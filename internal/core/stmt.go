package core

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// The statements the core sends are written in internal/sqltext, which
// sqllockmock reads too. Every statement reads its answer with QueryRow
// (never Exec: some drivers report success for a statement that a
// cancellation interrupted), and each lock statement returns the backend
// pid and pg_is_in_recovery() in the same round trip. Keys reach the
// server as bind parameters, or, for lib/pq, whose parameterized queries
// cost two round trips, rendered into the SQL text by sqltext: keys are
// integers it formats itself, so no caller text ever becomes SQL.

// Key is an advisory lock key as the core and its statements take it.
type Key = sqltext.Key

// Kind is what a lock call asks for: one of PostgreSQL's eight advisory
// lock functions.
type Kind = sqltext.Kind

// statements are a Pool's session-level statements (see sqltext).
type statements = sqltext.Statements

// Tag returns how PostgreSQL stores k in pg_locks: classid, objid (both
// unsigned 32-bit) and objsubid.
func Tag(k Key) (classid, objid uint32, objsubid int) {
	if k.Pair {
		return uint32(k.Class), uint32(k.ID), pglocks.Pair
	}
	return uint32(uint64(k.V) >> 32), uint32(k.V), pglocks.Bigint
}

// KeyOfTag is the inverse of Tag. It returns false for an objsubid that is
// not an advisory form.
func KeyOfTag(t pglocks.Tag) (Key, bool) {
	switch t.Objsubid {
	case pglocks.Bigint:
		return Key{V: t.BigintKey()}, true
	case pglocks.Pair:
		c, i := t.PairKey()
		return Key{Pair: true, Class: c, ID: i}, true
	}
	return Key{}, false
}

// manyQuery runs a statement whose rows it hands to row, one by one: a
// session's way to send one (its lease, its context, its driver).
type manyQuery func(q string, args []any, row func([]driver.Value) error) error

// many sends fn (pg_try_advisory_lock, or pg_advisory_unlock) on every key
// in one statement through query, run on backend pid only, and returns, by
// position, whether the server answered true: the one decoder of every
// batch (a shared session's, a Session's). Every answer must come from
// backend pid (ErrSessionChanged otherwise), and every key must be
// answered. For more than sqltext.ManyRowsMax keys the answers come
// aggregated in one row (the positions not answered true).
func many(mode sqltext.Mode, query manyQuery, fn string, pid int64, keys []Key) ([]bool, error) {
	return manyOf(mode, query, fn, 0, pid, keys, nil)
}

// mixed is many for a batch of unlocks and tries, in one statement (of no
// more than sqltext.ManyRowsMax keys): the first unlocks keys are
// released, the others tried. Rows come as the server evaluates them,
// unlocks first: when the statement fails (a try refused by a full lock
// table), seen tells, by position, which answers were read before the
// error: when every unlock's was, the error certainly concerns the tries
// alone.
func mixed(mode sqltext.Mode, query manyQuery, unlocks int, pid int64, keys []Key) (got, seen []bool, err error) {
	seen = make([]bool, len(keys))
	got, err = manyOf(mode, query, "", unlocks, pid, keys, seen)
	return got, seen, err
}

// manyOf is many of fn, or, for fn "", mixed's; seen, when not nil, marks
// the positions answered.
func manyOf(mode sqltext.Mode, query manyQuery, fn string, unlocks int, pid int64, keys []Key, seen []bool) ([]bool, error) {
	// Run on backend pid only: a statement that a pooler sent to another
	// server session takes and releases nothing there.
	only, agg := strconv.FormatInt(pid, 10), ""
	if len(keys) > sqltext.ManyRowsMax {
		agg = sqltext.AggNotTaken
	}
	var q string
	var args []any
	if fn == "" {
		q, args = mode.MixedSQL(only, agg, unlocks, keys)
	} else {
		q, args = mode.ManySQL(fn, only, agg, keys)
	}
	got := make([]bool, len(keys))
	rows := 0
	err := query(q, args, func(v []driver.Value) error {
		rows++
		if agg == "" && v[1] == nil {
			return sessionChanged(pid, 0) // another backend: it ran nothing
		}
		if agg != "" && pglocks.Int(v[1]) != pid {
			return sessionChanged(pid, pglocks.Int(v[1]))
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
		if seen != nil {
			seen[i-1] = true
		}
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

// markPositions sets marks[i-1] for each position i (from 1) in v, a text
// array literal of integers such as "{2,5}", as a driver gives it.
func markPositions(v driver.Value, marks []bool) error {
	var lit string
	switch t := v.(type) {
	case string:
		lit = t
	case []byte:
		lit = string(t)
	default:
		return fmt.Errorf("sqllock: positions: %T", v)
	}
	lit = strings.TrimSuffix(strings.TrimPrefix(lit, "{"), "}")
	for lit != "" {
		num, rest, _ := strings.Cut(lit, ",")
		i, err := strconv.Atoi(num)
		if err != nil || i < 1 || i > len(marks) {
			return fmt.Errorf("sqllock: position %q out of range", num)
		}
		marks[i-1] = true
		lit = rest
	}
	return nil
}
