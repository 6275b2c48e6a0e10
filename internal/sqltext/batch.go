package sqltext

import (
	"strconv"
	"strings"
)

// KeepAliveSQL returns, for lists of expected locks, the 1-based positions of
// those that are not granted to their backend any more, each with why:
//
//	1  the server does not show the lock granted to that pid, whose
//	   session lives on
//	2  another server answers (another start than the one granted it:
//	   restarted, or failed over to)
//	3  that pid is another backend now (another start: the pid was reused)
//	4  no backend has that pid: its session ended
//
// A lock's server and backend starts are those VersionSQL read on its
// connection (0: unknown, not compared). The lists are passed as array
// literals in text, which every driver can bind.
var KeepAliveSQL = markKeepAlive + `WITH s AS (SELECT ` + serverStart + ` AS server),
 b AS (SELECT a.pid, ` + micros("a.backend_start") + ` AS backend FROM pg_catalog.pg_stat_get_activity(NULL) AS a)
SELECT h.i, CASE WHEN h.server <> 0 AND h.server <> s.server THEN 2
  WHEN b.pid IS NULL THEN 4
  WHEN h.backend <> 0 AND h.backend <> b.backend THEN 3 ELSE 1 END
 FROM unnest($1::text::int4[], $2::text::int8[], $3::text::int8[], $4::text::int4[], $5::text::bool[], $6::text::int8[], $7::text::int8[])
 WITH ORDINALITY AS h(pid, classid, objid, objsubid, shared, server, backend, i)
 CROSS JOIN s LEFT JOIN b ON b.pid = h.pid
 WHERE (h.server <> 0 AND h.server <> s.server)
  OR (h.backend <> 0 AND h.backend <> coalesce(b.backend, 0))
  OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted
  AND l.pid = h.pid AND l.classid::int8 = h.classid AND l.objid::int8 = h.objid AND l.objsubid = h.objsubid
  AND l.mode = CASE WHEN h.shared THEN 'ShareLock' ELSE 'ExclusiveLock' END)`

// ClearSnapshotSQL drops the statistics a transaction has read so far:
// pg_stat_activity is read once per transaction, and a pinned session's
// transaction lives long (see BeginPinnedSQL).
const ClearSnapshotSQL = markKeepAlive + "SELECT pg_stat_clear_snapshot()"

// WaitedOnSQL lists, of the backends whose pids are in $1 (an array
// literal in text), those whose transaction another backend waits for
// (CREATE INDEX CONCURRENTLY and its kin wait so for every transaction
// that held an old snapshot as they began their last phase): a row per
// pid. A pinned session's transaction (see BeginPinnedSQL) can be one,
// through any statement it ran at that moment, and lives as long as the
// locks it holds.
const WaitedOnSQL = markKeepAlive + `SELECT DISTINCT m.pid::int8 FROM pg_catalog.pg_locks m
 JOIN pg_catalog.pg_locks w ON w.locktype = 'virtualxid' AND w.virtualxid = m.virtualxid AND NOT w.granted
 WHERE m.locktype = 'virtualxid' AND m.granted AND m.pid = ANY ($1::text::int4[])`

// WaitedOnMeSQL answers whether another backend waits for the end of
// this backend's transaction (see WaitedOnSQL): a pinned session's wait
// asks it after each slice that ended ungranted, since a CREATE INDEX
// CONCURRENTLY that began its last phase as a slice ran waits for the
// whole transaction, which a waiter keeps open until it is granted and
// has released.
const WaitedOnMeSQL = markSession + `SELECT EXISTS (SELECT FROM pg_catalog.pg_locks m
 JOIN pg_catalog.pg_locks w ON w.locktype = 'virtualxid' AND w.virtualxid = m.virtualxid AND NOT w.granted
 WHERE m.locktype = 'virtualxid' AND m.granted AND m.pid = pg_backend_pid())`

// BatchMax is the most keys a session's queue sends in one batch
// statement (BatchSQL): a bound on its text, not on its cost,
// which its answer keeps to one short row whatever the number of keys.
const BatchMax = 1000

// Batch is what a batch statement does with its keys.
type Batch uint8

const (
	BatchTry    Batch = iota // pg_try_advisory_lock on every key
	BatchUnlock              // pg_advisory_unlock on every key
	BatchMixed               // its first keys released, the others tried
	BatchKinds  = 3
)

// BatchSQL returns batch statement b, which calls its function on every
// key in keys, in their order, on backend onlyPID only, with its
// arguments; for BatchMixed, the first unlocks keys are released
// (pg_advisory_unlock), the others tried (pg_try_advisory_lock). Its
// single row is the positions (from 1) of the keys whose call did not
// answer true (not taken, not released), as a text array literal ('{}'
// when every call did); on any other backend it calls nothing and answers
// no row. One row costs the server and the client less than a row per
// key (docs/benchmarks.md). The keys are passed as array literals in
// text, which every driver can bind (see BatchText and BatchArgs), or, in
// Inline mode, rendered into the text.
func (m Mode) BatchSQL(b Batch, onlyPID string, keys []Key, unlocks int) (string, []any) {
	args, _, pairs := BatchArgs(nil, nil, keys, unlocks, b == BatchMixed)
	q := BatchText(b, pairs, onlyPID)
	if m != Inline {
		return q, args
	}
	strs := make([]string, len(args))
	for i, a := range args {
		strs[i] = a.(string)
	}
	return m.Arrays(q, strs...)
}

// BatchText returns the text of batch statement b (see BatchSQL) on
// backend onlyPID, its keys bound: $1 the keys, bigint keys as they are
// and pair keys packed (class in the high 32 bits, id in the low); then,
// for BatchMixed, how many are released; then, when pairs, which keys are
// pairs. A session sends few distinct texts: its pid is in them, and its
// keys are not.
func BatchText(b Batch, pairs bool, onlyPID string) string {
	params, cols := "$1::text::int8[]", "u(v, i)"
	call := func(fn string) string { return fn + "(u.v)" }
	n := 2
	if b == BatchMixed {
		n++
	}
	if pairs {
		params += ", $" + strconv.Itoa(n) + "::text::bool[]"
		cols = "u(v, p, i)"
		call = func(fn string) string {
			return "CASE WHEN u.p THEN " + fn + "((u.v >> 32)::int4, ((u.v << 32) >> 32)::int4) ELSE " + fn + "(u.v) END"
		}
	}
	var got string
	switch b {
	case BatchTry:
		got = call("pg_try_advisory_lock")
	case BatchUnlock:
		got = call("pg_advisory_unlock")
	default:
		got = "CASE WHEN u.i <= $2::text::int8 THEN " + call("pg_advisory_unlock") + " ELSE " + call("pg_try_advisory_lock") + " END"
	}
	// The positions come from a subquery (ARRAY), not an aggregate: a
	// backend that had run nothing but SELECT 1 failed its first statement
	// with an aggregate on a full lock table, before calling anything
	// (measured on PostgreSQL 15), and a batch's unlocks must still run
	// there, its tries refused. The condition on the backend is a one-time
	// filter, checked before the subquery runs.
	return batchMarks[b] + "SELECT ARRAY(SELECT u.i FROM unnest(" + params + ") WITH ORDINALITY AS " + cols +
		" WHERE " + got + " IS NOT TRUE)::text WHERE pg_backend_pid() = " + onlyPID
}

// batchMarks are the markers of the batch statements, by Batch.
var batchMarks = [BatchKinds]string{BatchTry: markTry, BatchUnlock: markUnlock, BatchMixed: markBatch}

// BatchArgs appends to args the arguments of a batch statement of keys
// (see BatchText): the keys' array literal, built in buf (returned, for
// use again once the arguments are sent), how many are released when
// mixed, and, when keys has pair keys (pairs), which are. The array
// literals are made without an allocation per key.
func BatchArgs(args []any, buf []byte, keys []Key, unlocks int, mixed bool) (_ []any, _ []byte, pairs bool) {
	buf = append(buf[:0], '{')
	for i, k := range keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		if k.Pair {
			pairs = true
			buf = strconv.AppendInt(buf, int64(k.Class)<<32|int64(uint32(k.ID)), 10)
		} else {
			buf = strconv.AppendInt(buf, k.V, 10)
		}
	}
	buf = append(buf, '}')
	args = append(args, string(buf))
	if mixed {
		args = append(args, strconv.Itoa(unlocks))
	}
	if pairs {
		buf = append(buf[:0], '{')
		for i, k := range keys {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, "ft"[b2i(k.Pair)])
		}
		buf = append(buf, '}')
		args = append(args, string(buf))
	}
	return args, buf, pairs
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Arrays returns q with its array parameters ($1, $2, ...: text literals
// of arrays of numbers and booleans that this package formats) bound, or,
// in Inline mode, rendered into the text: lib/pq spends a round trip
// preparing any statement with parameters.
func (m Mode) Arrays(q string, lits ...string) (string, []any) {
	if m != Inline {
		args := make([]any, len(lits))
		for i, l := range lits {
			args[i] = l
		}
		return q, args
	}
	for i := len(lits); i >= 1; i-- { // $10 before $1
		q = strings.ReplaceAll(q, "$"+strconv.Itoa(i)+"::text", "'"+lits[i-1]+"'::text")
	}
	return q, nil
}
