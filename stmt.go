package sqllock

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
)

// The statements this package sends. Every statement reads its answer with
// QueryRow (never Exec: some drivers report success for a statement that a
// cancellation interrupted), and each lock statement returns the backend pid
// and pg_is_in_recovery() in the same round trip.
//
// Keys reach the server either as bind parameters ($1), or, for drivers
// whose parameterized queries cost two round trips (lib/pq), rendered into
// the SQL text by this package. Keys are integers this package formats
// itself, so no caller text ever becomes SQL.

// lockKind is what a lock call asks for; each combination of its bits is
// one of PostgreSQL's eight advisory lock functions.
type lockKind uint8

const (
	kindTry    lockKind = 1 << iota // do not wait: return whether the lock was taken
	kindShared                      // shared mode; otherwise exclusive
	kindXact                        // transaction-level; otherwise session-level

	kindCount = 8
)

func (k lockKind) try() bool    { return k&kindTry != 0 }
func (k lockKind) shared() bool { return k&kindShared != 0 }

// sharedKind returns kindShared when shared is true.
func sharedKind(shared bool) lockKind {
	if shared {
		return kindShared
	}
	return 0
}

// lockFuncs names the function of every lockKind.
var lockFuncs = func() (t [kindCount]string) {
	for k := range lockKind(kindCount) {
		var b strings.Builder
		b.WriteString("pg_")
		if k.try() {
			b.WriteString("try_")
		}
		b.WriteString("advisory_")
		if k&kindXact != 0 {
			b.WriteString("xact_")
		}
		b.WriteString("lock")
		if k.shared() {
			b.WriteString("_shared")
		}
		t[k] = b.String()
	}
	return t
}()

func (k lockKind) fn() string { return lockFuncs[k] }

func unlockFn(shared bool) string {
	if shared {
		return "pg_advisory_unlock_shared"
	}
	return "pg_advisory_unlock"
}

// stmtMode selects how keys reach the server.
type stmtMode uint8

const (
	bindKeys   stmtMode = iota // $1 or $1, $2
	inlineKeys                 // literals in the SQL text
)

// keyArgs returns the argument list of k for a function call, and the bind
// values, starting at parameter number first.
func (m stmtMode) keyArgs(k Key, first int) (string, []any) {
	if c, i, ok := k.Pair(); ok {
		if m == inlineKeys {
			return strconv.FormatInt(int64(c), 10) + ", " + strconv.FormatInt(int64(i), 10), nil
		}
		return "$" + strconv.Itoa(first) + ", $" + strconv.Itoa(first+1), []any{int64(c), int64(i)}
	}
	v, _ := k.Int64()
	if m == inlineKeys {
		// A negative literal needs the cast to stay a bigint argument.
		return "(" + strconv.FormatInt(v, 10) + ")::bigint", nil
	}
	return "$" + strconv.Itoa(first), []any{v}
}

// bound caches the bind-mode statements, which do not depend on the key's
// value: built once, they cost no allocation per lock.
var bound = func() (c struct {
	lock   [kindCount][2]string // by kind, then [bigint, pair]
	wait   [2][2]string         // [exclusive, shared][bigint, pair]
	unlock [2][2]string         // [exclusive, shared][bigint, pair]
}) {
	for kind := range lockKind(kindCount) {
		for f, k := range []Key{Int64(0), Pair(0, 0)} {
			if kind == 0 || kind == kindShared {
				c.wait[sharedIndex(kind.shared())][f], _ = bindKeys.buildWaitSQL(kind, k, "")
			}
			if kind&kindXact != 0 {
				c.lock[kind][f], _ = bindKeys.buildXactLockSQL(kind, k)
			} else {
				c.lock[kind][f], _ = bindKeys.buildSessionLockSQL(kind, k)
			}
			if kind == 0 || kind == kindShared {
				c.unlock[sharedIndex(kind.shared())][f], _ = bindKeys.buildUnlockSQL(kind.shared(), k, 0)
			}
		}
	}
	return c
}()

// formIndex is 0 for the bigint form of k and 1 for the pair form.
func formIndex(k Key) int {
	if k.IsPair() {
		return 1
	}
	return 0
}

// sharedIndex is 0 for exclusive and 1 for shared.
func sharedIndex(shared bool) int { return int(sharedKind(shared) >> 1) }

// bindArgs returns the bound values of k.
func bindArgs(k Key, extra ...any) []any {
	if c, i, ok := k.Pair(); ok {
		return append([]any{int64(c), int64(i)}, extra...)
	}
	v, _ := k.Int64()
	return append([]any{v}, extra...)
}

// sessionLockSQL returns the statement that takes a session-level lock. Its
// single row is (acquired bool, pid int, in_recovery bool).
func (m stmtMode) sessionLockSQL(kind lockKind, k Key) (string, []any) {
	if m == bindKeys {
		return bound.lock[kind][formIndex(k)], bindArgs(k)
	}
	return m.buildSessionLockSQL(kind, k)
}

func (m stmtMode) buildSessionLockSQL(kind lockKind, k Key) (string, []any) {
	a, args := m.keyArgs(k, 1)
	if kind.try() {
		return "SELECT " + kind.fn() + "(" + a + "), pg_backend_pid(), pg_is_in_recovery()", args
	}
	return "SELECT true, pg_backend_pid(), pg_is_in_recovery() FROM " + kind.fn() + "(" + a + ")", args
}

// waitSQL returns the statement with which a Locker waits for a
// session-level lock (kind is exclusive or shared, not try). Its single row
// is that of sessionLockSQL. The wait lasts at most half the server's
// deadlock_timeout (a lock_timeout local to the statement, error 55P03),
// and the caller waits again until it is granted: the statement's snapshot
// never lives long enough for a CREATE INDEX CONCURRENTLY (or REINDEX
// CONCURRENTLY, DETACH PARTITION CONCURRENTLY, ...) of the holder, which
// waits for old snapshots, to be reported a deadlock. A session that
// holds nothing but its wait is in no genuine deadlock, so nothing is lost.
func (m stmtMode) waitSQL(kind lockKind, k Key, slice string) (string, []any) {
	if m == bindKeys {
		return bound.wait[sharedIndex(kind.shared())][formIndex(k)], bindArgs(k, slice)
	}
	return m.buildWaitSQL(kind, k, slice)
}

func (m stmtMode) buildWaitSQL(kind lockKind, k Key, slice string) (string, []any) {
	a, args := m.keyArgs(k, 1)
	timeout := "'" + slice + "'"
	if m == bindKeys {
		timeout = "$" + strconv.Itoa(len(args)+1)
		args = append(args, slice)
	}
	return "SELECT true, pg_backend_pid(), pg_is_in_recovery() FROM (SELECT set_config('lock_timeout', " + timeout + ", true)) AS s(v), " +
		"LATERAL (SELECT " + kind.fn() + "(" + a + ") WHERE s.v IS NOT NULL) AS l", args
}

// waitSliceSQL returns half the server's deadlock_timeout in
// milliseconds (at least 1): the lock_timeout of a wait statement. (Asked
// once, not in every wait: reading and converting the setting costs a
// tenth of an uncontended lock statement.)
const waitSliceSQL = "SELECT greatest(1, (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 500)::int8)"

// unlockSQL returns the statement that releases a session-level lock, but
// only on the backend that was granted it: its single row is (released
// bool) on that backend, and it returns no row (and unlocks nothing) on any
// other. (SQL evaluates WHERE before the select list; one column and no
// CASE cost the server less than returning the pid too: 0.8% of a pgx
// cycle.)
func (m stmtMode) unlockSQL(shared bool, k Key, pid int64) (string, []any) {
	if m == bindKeys {
		return bound.unlock[sharedIndex(shared)][formIndex(k)], bindArgs(k, pid)
	}
	return m.buildUnlockSQL(shared, k, pid)
}

func (m stmtMode) buildUnlockSQL(shared bool, k Key, pid int64) (string, []any) {
	a, args := m.keyArgs(k, 1)
	if m == inlineKeys {
		return "SELECT " + unlockFn(shared) + "(" + a + ") WHERE pg_backend_pid() = " + strconv.FormatInt(pid, 10), nil
	}
	n := len(args) + 1
	return "SELECT " + unlockFn(shared) + "(" + a + ") WHERE pg_backend_pid() = $" + strconv.Itoa(n) + "::int4", append(args, pid)
}

// xactLockSQL returns the statement that takes a transaction-level lock. Its
// single row is (acquired bool).
func (m stmtMode) xactLockSQL(kind lockKind, k Key) (string, []any) {
	kind |= kindXact
	if m == bindKeys {
		return bound.lock[kind][formIndex(k)], bindArgs(k)
	}
	return m.buildXactLockSQL(kind, k)
}

func (m stmtMode) buildXactLockSQL(kind lockKind, k Key) (string, []any) {
	a, args := m.keyArgs(k, 1)
	if kind.try() {
		return "SELECT " + kind.fn() + "(" + a + ")", args
	}
	return "SELECT true FROM " + kind.fn() + "(" + a + ")", args
}

// detectMode picks inlineKeys for lib/pq, whose parameterized queries cost
// an extra round trip (an unnamed prepare, then the execution), and bindKeys
// for every other driver: pgx caches one prepared statement per SQL text, so
// a text per key would churn its cache.
func detectMode(d driver.Driver) stmtMode {
	if strings.HasPrefix(strings.TrimPrefix(fmt.Sprintf("%T", d), "*"), "pq.") {
		return inlineKeys
	}
	return bindKeys
}

// keepAliveSQL returns, for lists of expected locks, the 1-based positions of
// those that are not granted to their backend any more. The lists are passed
// as array literals in text, which every driver can bind.
const keepAliveSQL = `SELECT h.i FROM unnest($1::text::int4[], $2::text::int8[], $3::text::int8[], $4::text::int4[], $5::text::bool[])
 WITH ORDINALITY AS h(pid, classid, objid, objsubid, shared, i)
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted
  AND l.pid = h.pid AND l.classid::int8 = h.classid AND l.objid::int8 = h.objid AND l.objsubid = h.objsubid
  AND l.mode = CASE WHEN h.shared THEN 'ShareLock' ELSE 'ExclusiveLock' END)`

const (
	// aggNotTaken lists the positions of the keys not taken, as a text
	// array literal ('{}' when every key was).
	aggNotTaken = "coalesce(array_agg(t.i) FILTER (WHERE t.got IS NOT TRUE), '{}')::text"
	// aggConfirmed counts the keys released.
	aggConfirmed = "count(*) FILTER (WHERE t.got)"
)

// manyRowsMax is the most keys whose results manySQL returns as a row
// each; for more it aggregates them into one row. Rows cost per key to send
// and decode (5,000 keys: 10,000 rows for a TryLockMany and UnlockMany,
// most of their time); the aggregate costs the server more to plan and run
// (lib/pq's statements, which are planned every time: +25 µs for 1 key).
// The two break even near 100 keys.
const manyRowsMax = 64

// manySQL returns a statement that calls fn (an exclusive lock or unlock
// function) on every key. With agg empty it answers a row per key:
// (position from 1, result, pid); otherwise one row: (agg, pid), where agg
// aggregates the rows t(i, got). With onlyPID, the function runs only on
// that backend (NULL elsewhere). Keys are passed as array literals in
// text, which every driver can bind.
func (m stmtMode) manySQL(fn, onlyPID, agg string, keys []Key) (string, []any) {
	// Four array literals, built without an allocation per key.
	pair := make([]byte, 0, 2*len(keys)+2)
	v := make([]byte, 0, 8*len(keys)+2)
	c := make([]byte, 0, 4*len(keys)+2)
	d := make([]byte, 0, 4*len(keys)+2)
	for i, k := range keys {
		sep := byte(',')
		if i == 0 {
			sep = '{'
		}
		pair, v, c, d = append(pair, sep), append(v, sep), append(c, sep), append(d, sep)
		if cl, id, ok := k.Pair(); ok {
			pair = append(pair, 't')
			v = append(v, '0')
			c = strconv.AppendInt(c, int64(cl), 10)
			d = strconv.AppendInt(d, int64(id), 10)
		} else {
			n, _ := k.Int64()
			pair = append(pair, 'f')
			v = strconv.AppendInt(v, n, 10)
			c = append(c, '0')
			d = append(d, '0')
		}
	}
	call := "CASE WHEN u.pair THEN " + fn + "(u.c, u.d) ELSE " + fn + "(u.v) END"
	if onlyPID != "" {
		call = "CASE WHEN pg_backend_pid() = " + onlyPID + " THEN " + call + " END"
	}
	rows := "SELECT u.i, " + call + " AS got, pg_backend_pid()" +
		" FROM unnest($1::text::bool[], $2::text::int8[], $3::text::int4[], $4::text::int4[]) WITH ORDINALITY AS u(pair, v, c, d, i)"
	q := rows
	if agg != "" {
		q = "SELECT " + agg + ", pg_backend_pid() FROM (" + rows + ") AS t"
	}
	return m.arrays(q, string(append(pair, '}')), string(append(v, '}')), string(append(c, '}')), string(append(d, '}')))
}

// arrays returns q with its array parameters ($1, $2, ...: text literals
// of arrays of numbers and booleans that this package formats) bound, or,
// in inlineKeys mode, rendered into the text: lib/pq spends a round trip
// preparing any statement with parameters.
func (m stmtMode) arrays(q string, lits ...string) (string, []any) {
	if m != inlineKeys {
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

// inspectSQL reads the advisory locks of the current database with their
// sessions. Keys are decoded in Go from classid, objid and objsubid; the
// wait start is read through to_jsonb so that servers older than 14, which
// lack pg_locks.waitstart, answer too.
const inspectSQL = `SELECT l.classid::int8, l.objid::int8, l.objsubid::int4, l.mode, l.granted,
 coalesce(l.pid, 0), coalesce(a.application_name, ''), coalesce(a.state, ''), coalesce(a.query, ''),
 coalesce(to_jsonb(l) ->> 'waitstart', ''), coalesce(host(a.client_addr), ''), coalesce(to_jsonb(a) ->> 'state_change', ''),
 CASE WHEN l.granted OR l.pid IS NULL THEN '{}' ELSE pg_blocking_pids(l.pid)::text END
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
 AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())`

// cancelWaitSQL takes backend $1, whose client abandoned its wait for an
// advisory lock, out of the wait, and answers where it is:
//
//	0  gone (its session ended)
//	1  not yet at the wait statement (it may still read it from its socket)
//	2  running the wait statement: cancelled now
//	3  done with the wait statement (cancelled, or granted)
//
// The backend is the caller's own abandoned connection, which no one else
// can be using: whatever it is running is that wait statement.
const cancelWaitSQL = `SELECT coalesce((SELECT CASE
   WHEN a.query NOT SIMILAR TO '%pg\_advisory\_(xact\_)?lock(\_shared)?\(%' THEN 1
   WHEN a.state <> 'active' THEN 3
   ELSE 2 + 0 * pg_cancel_backend(a.pid)::int END
 FROM pg_catalog.pg_stat_activity a WHERE a.pid = $1::int4), 0)`

// versionSQL asks which server this is (see supported).
const versionSQL = "SELECT version()"

// sessionSQL starts a Session: its backend, and whether it is a standby.
const sessionSQL = "SELECT pg_backend_pid(), pg_is_in_recovery()"

// reclaimSQL releases the advisory locks of backend $1 when it runs there,
// and otherwise ends that backend (a role may end its own sessions). See
// Locker.reclaim.
const reclaimSQL = `SELECT CASE WHEN pg_backend_pid() = $1::int4
 THEN (SELECT true FROM pg_advisory_unlock_all()) ELSE pg_terminate_backend($1::int4) END`
