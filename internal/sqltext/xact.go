package sqltext

import (
	"database/sql/driver"
	"fmt"
	"strconv"
	"strings"
)

// WaitSliceSQL returns half the server's deadlock_timeout in
// milliseconds (at least 1): the lock_timeout of a wait statement (asked
// once per Locker, not in every wait).
const WaitSliceSQL = markWait + "SELECT greatest(1, (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 500)::int8)"

// XactTrySQL returns the statement with which every transaction-level
// lock call starts, whatever its context and whether or not it may wait:
// it tries the lock without waiting (one round trip when the key is free),
// and reports the backend and whether the server is a standby. On a
// standby it takes nothing: pg_is_in_recovery() is read once, in a
// subquery kept apart (OFFSET 0), and the try function is called only
// when it is false (a standby's advisory locks do not conflict with the
// primary's). Its single row is (acquired bool, pid int, in_recovery
// bool). Only a call that finds the key held, and may wait, sends a wait
// statement after it (XactLockSQL, XactDeadlineLockSQL).
func (m Mode) XactTrySQL(kind Kind, k Key) (string, []any) {
	if m == Bind {
		return bound.xactTry[sharedIndex(kind.IsShared())][formIndex(k)], bindArgs(nil, k)
	}
	return m.BuildXactTrySQL(kind, k)
}

func (m Mode) BuildXactTrySQL(kind Kind, k Key) (string, []any) {
	a, args := m.KeyArgs(k, 1)
	fn := (kind | Xact | Try).Fn()
	return markTry + "SELECT CASE WHEN s.r THEN false ELSE " + fn + "(" + a + ") END, pg_backend_pid(), s.r" +
		" FROM (SELECT pg_is_in_recovery() AS r OFFSET 0) AS s", args
}

// XactLockSQL returns the statement with which a transaction waits for a
// transaction-level lock (kind's Try is ignored) for as long as it takes.
// Its single row is (acquired bool).
func (m Mode) XactLockSQL(kind Kind, k Key) (string, []any) {
	if m == Bind {
		return bound.xact[sharedIndex(kind.IsShared())][formIndex(k)], bindArgs(nil, k)
	}
	return m.BuildXactLockSQL(kind, k)
}

func (m Mode) BuildXactLockSQL(kind Kind, k Key) (string, []any) {
	a, args := m.KeyArgs(k, 1)
	return markWait + "SELECT true FROM " + (kind&^Try | Xact).Fn() + "(" + a + ")", args
}

// XactDeadlineLockSQL returns the statement with which a transaction
// waits for a transaction-level lock (kind's Try is ignored) for at most
// timeout (a duration the server reads, such as "250ms"): the wait's own
// lock_timeout, 55P03 when it fires, so that the server keeps the
// caller's deadline even when the driver's cancel never reaches it. A
// lock_timeout of the transaction's own that is shorter still applies,
// and so does one of "0" (none) meaning none: the shorter wins. The
// transaction's setting is set back as the lock is granted (a 55P03
// aborts the transaction anyway). Its single row is (acquired bool).
func (m Mode) XactDeadlineLockSQL(kind Kind, k Key, timeout string) (string, []any) {
	kind = kind&^Try | Xact
	a, args := m.KeyArgs(k, 1)
	t := "'" + timeout + "'"
	if m == Bind {
		t = "$" + strconv.Itoa(len(args)+1)
		args = append(args, timeout)
	}
	return markWait + "SELECT set_config('lock_timeout', o.old, true) IS NOT NULL" +
		" FROM (SELECT current_setting('lock_timeout') AS old OFFSET 0) AS o," +
		" LATERAL (SELECT set_config('lock_timeout', CASE WHEN o.old::interval > '0' AND o.old::interval < " + t + "::text::interval THEN o.old ELSE " + t + "::text END, true) OFFSET 0) AS s(v)," +
		" LATERAL (SELECT " + kind.Fn() + "(" + a + ") WHERE s.v IS NOT NULL) AS l", args
}

// RecoverySQL asks whether the server is a standby: InTx asks it when a
// BEGIN is refused (lib/pq begins read-write transactions, which a
// standby refuses).
const RecoverySQL = markCheck + "SELECT pg_is_in_recovery()"

// DetectMode picks Inline for lib/pq, whose parameterized queries cost
// an extra round trip (an unnamed prepare, then the execution), and Bind
// for every other driver: pgx caches one prepared statement per SQL text, so
// a text per key would churn its cache.
func DetectMode(d driver.Driver) Mode {
	if strings.HasPrefix(strings.TrimPrefix(fmt.Sprintf("%T", d), "*"), "pq.") {
		return Inline
	}
	return Bind
}
