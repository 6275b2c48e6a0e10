package stmt

import (
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

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

// BatchQuery runs a batch statement, whose answer is one row of one
// text column (sql.ErrNoRows when it answers none), storing it in dest: a
// session's way to send one (its lease, its context, its driver).
type BatchQuery func(q string, args []any, dest ...any) error

// Many sends batch b (sqltext.BatchTry or sqltext.BatchUnlock) of keys in
// one statement through query, run on backend pid only, and returns, by
// position, whether the server answered true (all false with an error):
// the one decoder of every batch (a shared session's, a Session's). An
// answer from another backend (none: it ran nothing there) is
// ErrSessionChanged. When the statement fails, nothing is known of what
// it did: the server answers a batch as a whole. bb, when not nil, holds
// the statement's parts for use again, and the answer (valid until bb's
// next batch).
func Many(mode sqltext.Mode, query BatchQuery, b sqltext.Batch, pid int64, keys []sqltext.Key, bb *BatchBufs) ([]bool, error) {
	return Batch(mode, query, b, 0, pid, keys, bb)
}

// Batch is many of b; for sqltext.BatchMixed, a batch of unlocks and
// tries in one statement: the first unlocks keys are released, the
// others tried.
// It runs on backend pid only: a statement that a pooler sent to another
// server session takes and releases nothing there.
func Batch(mode sqltext.Mode, query BatchQuery, b sqltext.Batch, unlocks int, pid int64, keys []sqltext.Key, bb *BatchBufs) ([]bool, error) {
	if bb == nil {
		bb = new(BatchBufs)
	}
	var q string
	var args []any
	if mode == sqltext.Inline {
		q, args = mode.BatchSQL(b, strconv.FormatInt(pid, 10), keys, unlocks)
	} else {
		var pairs bool
		args, bb.lit, pairs = sqltext.BatchArgs(bb.args[:0], bb.lit, keys, unlocks, b == sqltext.BatchMixed)
		q = bb.text(b, pairs, pid)
	}
	bb.dest[0] = &bb.missed
	err := query(q, args, bb.dest[:]...)
	missed := bb.missed
	clear(bb.args[:])
	bb.missed = ""
	if errors.Is(err, sql.ErrNoRows) {
		err = SessionChanged(pid, 0) // another backend: it ran nothing
	}
	got := append(bb.got[:0], make([]bool, len(keys))...) // all false, whatever the error
	bb.got = got
	if err == nil {
		err = MarkPositions(missed, got)
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

// BatchBufs are the parts of a session's batch statements kept for its
// next (used by the runner of its queue only): the texts it sent, its
// arguments, its keys' array literal, and its answer.
type BatchBufs struct {
	pid    int64
	texts  [sqltext.BatchKinds][2]string // by kind, then without and with pair keys: for pid
	args   [3]any
	lit    []byte
	got    []bool
	missed string // the answer
	dest   [1]any // &missed
}

// text returns sqltext.BatchText of b on backend pid, made once.
func (bb *BatchBufs) text(b sqltext.Batch, pairs bool, pid int64) string {
	if bb.pid != pid {
		bb.pid, bb.texts = pid, [sqltext.BatchKinds][2]string{}
	}
	t := &bb.texts[b][B2i(pairs)]
	if *t == "" {
		*t = sqltext.BatchText(b, pairs, strconv.FormatInt(pid, 10))
	}
	return *t
}

// MarkPositions sets marks[i-1] for each position i (from 1) in lit, a
// text array literal of integers such as "{2,5}"; anything else is an
// error (an answer that is not one must not read as "every key taken").
func MarkPositions(lit string, marks []bool) error {
	if len(lit) < 2 || lit[0] != '{' || lit[len(lit)-1] != '}' {
		return fmt.Errorf("sqllock: positions %q are not an array literal", lit)
	}
	lit = lit[1 : len(lit)-1]
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

func B2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
