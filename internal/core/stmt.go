package core

import (
	"database/sql"
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

// batchQuery runs a batch statement, whose answer is one row of one
// text column (sql.ErrNoRows when it answers none), storing it in dest: a
// session's way to send one (its lease, its context, its driver).
type batchQuery func(q string, args []any, dest ...any) error

// many sends fn (pg_try_advisory_lock, or pg_advisory_unlock) on every key
// in one statement through query, run on backend pid only, and returns, by
// position, whether the server answered true (all false with an error):
// the one decoder of every batch (a shared session's, a Session's). An
// answer from another backend (none: it ran nothing there) is
// ErrSessionChanged. When the statement fails, nothing is known of what it
// did: the server answers a batch as a whole.
func many(mode sqltext.Mode, query batchQuery, fn string, pid int64, keys []Key) ([]bool, error) {
	return batch(mode, query, fn, -1, pid, keys)
}

// mixed is many for a batch of unlocks and tries, in one statement: the
// first unlocks keys are released, the others tried.
func mixed(mode sqltext.Mode, query batchQuery, unlocks int, pid int64, keys []Key) ([]bool, error) {
	return batch(mode, query, "", unlocks, pid, keys)
}

// batch is many of fn, or, for unlocks >= 0, mixed's.
func batch(mode sqltext.Mode, query batchQuery, fn string, unlocks int, pid int64, keys []Key) ([]bool, error) {
	// Run on backend pid only: a statement that a pooler sent to another
	// server session takes and releases nothing there.
	only := strconv.FormatInt(pid, 10)
	var q string
	var args []any
	if unlocks >= 0 {
		q, args = mode.MixedSQL(only, unlocks, keys)
	} else {
		q, args = mode.ManySQL(fn, only, keys)
	}
	var missed string
	err := query(q, args, &missed)
	if errors.Is(err, sql.ErrNoRows) {
		err = sessionChanged(pid, 0) // another backend: it ran nothing
	}
	got := make([]bool, len(keys)) // all false, whatever the error
	if err == nil {
		err = markPositions(missed, got)
	}
	if err != nil {
		clear(got)
		return got, err
	}
	for i := range got {
		got[i] = !got[i]
	}
	return got, nil
}

// markPositions sets marks[i-1] for each position i (from 1) in lit, a
// text array literal of integers such as "{2,5}".
func markPositions(lit string, marks []bool) error {
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
