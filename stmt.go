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

// lockFunc names one of PostgreSQL's advisory lock functions.
type lockFunc struct {
	name string // pg_advisory_lock, pg_try_advisory_xact_lock_shared, ...
	try  bool   // returns boolean; otherwise void and waits
}

// lockFns holds every lock function, indexed by try, shared, xact.
var lockFns = func() (t [2][2][2]lockFunc) {
	for i, try := range []bool{false, true} {
		for j, shared := range []bool{false, true} {
			for k, xact := range []bool{false, true} {
				t[i][j][k] = buildLockFn(try, shared, xact)
			}
		}
	}
	return t
}()

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func lockFn(try, shared, xact bool) lockFunc { return lockFns[b2i(try)][b2i(shared)][b2i(xact)] }

func buildLockFn(try, shared, xact bool) lockFunc {
	var b strings.Builder
	b.WriteString("pg_")
	if try {
		b.WriteString("try_")
	}
	b.WriteString("advisory_")
	if xact {
		b.WriteString("xact_")
	}
	b.WriteString("lock")
	if shared {
		b.WriteString("_shared")
	}
	return lockFunc{name: b.String(), try: try}
}

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
	session, xact map[lockFunc][2]string // by function, then [bigint, pair]
	unlock        [2][2]string           // [exclusive, shared][bigint, pair]
}) {
	c.session, c.xact = map[lockFunc][2]string{}, map[lockFunc][2]string{}
	for _, try := range []bool{false, true} {
		for _, shared := range []bool{false, true} {
			for f, k := range []Key{Int64(0), Pair(0, 0)} {
				fn, xfn := lockFn(try, shared, false), lockFn(try, shared, true)
				sv, xv := c.session[fn], c.xact[xfn]
				sv[f], _ = bindKeys.buildSessionLockSQL(fn, k)
				xv[f], _ = bindKeys.buildXactLockSQL(xfn, k)
				c.session[fn], c.xact[xfn] = sv, xv
				c.unlock[b2i(shared)][f], _ = bindKeys.buildUnlockSQL(shared, k, 0)
			}
		}
	}
	return c
}()

func formIndex(k Key) int { return b2i(k.IsPair()) }

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
func (m stmtMode) sessionLockSQL(fn lockFunc, k Key) (string, []any) {
	if m == bindKeys {
		return bound.session[fn][formIndex(k)], bindArgs(k)
	}
	return m.buildSessionLockSQL(fn, k)
}

func (m stmtMode) buildSessionLockSQL(fn lockFunc, k Key) (string, []any) {
	a, args := m.keyArgs(k, 1)
	if fn.try {
		return "SELECT " + fn.name + "(" + a + "), pg_backend_pid(), pg_is_in_recovery()", args
	}
	return "SELECT true, pg_backend_pid(), pg_is_in_recovery() FROM " + fn.name + "(" + a + ")", args
}

// unlockSQL returns the statement that releases a session-level lock, but
// only on the backend that was granted it: on any other backend it unlocks
// nothing and returns NULL. Its single row is (released bool or NULL, pid).
func (m stmtMode) unlockSQL(shared bool, k Key, pid int64) (string, []any) {
	if m == bindKeys {
		return bound.unlock[b2i(shared)][formIndex(k)], bindArgs(k, pid)
	}
	return m.buildUnlockSQL(shared, k, pid)
}

func (m stmtMode) buildUnlockSQL(shared bool, k Key, pid int64) (string, []any) {
	a, args := m.keyArgs(k, 1)
	if m == inlineKeys {
		return "SELECT CASE WHEN pg_backend_pid() = " + strconv.FormatInt(pid, 10) + " THEN " + unlockFn(shared) + "(" + a + ") END, pg_backend_pid()", nil
	}
	n := len(args) + 1
	return "SELECT CASE WHEN pg_backend_pid() = $" + strconv.Itoa(n) + "::int4 THEN " + unlockFn(shared) + "(" + a + ") END, pg_backend_pid()", append(args, pid)
}

// xactLockSQL returns the statement that takes a transaction-level lock. Its
// single row is (acquired bool).
func (m stmtMode) xactLockSQL(fn lockFunc, k Key) (string, []any) {
	if m == bindKeys {
		return bound.xact[fn][formIndex(k)], bindArgs(k)
	}
	return m.buildXactLockSQL(fn, k)
}

func (m stmtMode) buildXactLockSQL(fn lockFunc, k Key) (string, []any) {
	a, args := m.keyArgs(k, 1)
	if fn.try {
		return "SELECT " + fn.name + "(" + a + ")", args
	}
	return "SELECT true FROM " + fn.name + "(" + a + ")", args
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
