// Package sqllockmock registers the go-sqlmock expectations that sqllock's
// statements need, so unit tests of code that uses sqllock never copy SQL
// text from its source.
//
// Build the Locker under test with keep-alive off, so that no background
// query runs at an unpredictable moment:
//
//	db, mock, _ := sqlmock.New()
//	locker := sqllock.New(db, sqllock.WithKeepAlive(0))
//	sqllockmock.ExpectServerCheck(mock) // once per Locker, before its first session lock
//	sqllockmock.ExpectTryLock(mock, key, true)
//	// ... expectations of the code that runs under the lock ...
//	sqllockmock.ExpectUnlock(mock, key)
//
// [Locker.Do] and [Locker.TryDo] issue the lock statement, then fn's
// statements, then the unlock statement: expect them in that order.
// Transaction-scoped locks run inside the transaction: ExpectBegin, then
// ExpectLockTx, then the transaction's statements, then ExpectCommit or
// ExpectRollback.
//
// The helpers match sqllock's statements with the default regular
// expression matcher. This repository tests the same code once against
// go-sqlmock with these helpers and once against a real PostgreSQL, so the
// helpers and the statements cannot drift apart.
//
// [Locker.Do]: https://pkg.go.dev/github.com/sqllock/sqllock#Locker.Do
// [Locker.TryDo]: https://pkg.go.dev/github.com/sqllock/sqllock#Locker.TryDo
package sqllockmock

import (
	"database/sql/driver"
	"regexp"
	"strconv"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqllock/sqllock"
)

// PID is the backend process id the helpers report for a lock; the unlock
// expectation answers from the same pid, as a real server would.
const PID = 4242

// ServerVersion is the version() the server check is answered with.
const ServerVersion = "PostgreSQL 16.4 on x86_64-pc-linux-gnu"

// ExpectServerCheck expects the version() query a Locker sends once, before
// its first session-level lock (Lock, TryLock, a Session, a Semaphore), to
// refuse servers without real advisory locks. Transaction-level locks
// (LockTx, InTx) send none: do not expect it for them.
func ExpectServerCheck(mock sqlmock.Sqlmock) *sqlmock.ExpectedQuery {
	return mock.ExpectQuery(exact("SELECT version()")).
		WillReturnRows(sqlmock.NewRows([]string{"version"}).AddRow(ServerVersion))
}

// ExpectLock expects Locker.Lock (and Do) to take k, and grants it. A
// waiting call starts with the non-waiting function, and a free lock is
// granted by it: this is the statement ExpectLock expects.
func ExpectLock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectSessionLock(mock, "pg_try_advisory_lock", k, true)
}

// ExpectLockAfterWait expects a Locker's first wait: Locker.Lock (and Do)
// finds k held, reads the server's deadlock_timeout (once per Locker), then
// waits for k, and is granted it after the wait: three statements.
func ExpectLockAfterWait(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	expectSessionLock(mock, "pg_try_advisory_lock", k, false)
	mock.ExpectQuery(exact("SELECT greatest(1, (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 500)::int8)")).
		WillReturnRows(sqlmock.NewRows([]string{"slice"}).AddRow(int64(500)))
	a, args := keyArgs(k, 1)
	args = append(args, "500ms")
	q := "SELECT true, pg_backend_pid(), pg_is_in_recovery() FROM (SELECT set_config('lock_timeout', $" + strconv.Itoa(len(args)) + ", true)) AS s(v), " +
		"LATERAL (SELECT pg_advisory_lock(" + a + ") WHERE s.v IS NOT NULL) AS l"
	return mock.ExpectQuery(exact(q)).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"acquired", "pid", "in_recovery"}).AddRow(true, PID, false))
}

// ExpectTryLock expects Locker.TryLock (and TryDo) to try k; acquired says
// whether the mock server grants it.
func ExpectTryLock(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	return expectSessionLock(mock, "pg_try_advisory_lock", k, acquired)
}

// ExpectRLock expects Locker.RLock to take k in shared mode, and grants it
// (with the non-waiting function, as ExpectLock does).
func ExpectRLock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectSessionLock(mock, "pg_try_advisory_lock_shared", k, true)
}

// ExpectTryRLock expects Locker.TryRLock to try k in shared mode.
func ExpectTryRLock(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	return expectSessionLock(mock, "pg_try_advisory_lock_shared", k, acquired)
}

// ExpectUnlock expects Lock.Unlock of the exclusive lock k, and confirms
// it.
func ExpectUnlock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectUnlock(mock, "pg_advisory_unlock", k)
}

// ExpectRUnlock expects Lock.Unlock of the shared lock k, and confirms it.
func ExpectRUnlock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectUnlock(mock, "pg_advisory_unlock_shared", k)
}

// ExpectLockTx expects LockTx to take k in the current transaction. For
// InTx, use ExpectInTxLock.
func ExpectLockTx(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	a, args := keyArgs(k, 1)
	return mock.ExpectQuery(exact("SELECT true FROM pg_advisory_xact_lock(" + a + ")")).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"bool"}).AddRow(true))
}

// ExpectInTxLock expects Locker.InTx to take k in the transaction it began
// (after ExpectBegin), and grants it. InTx starts with the non-waiting
// function, which also reports the backend pid.
func ExpectInTxLock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	a, args := keyArgs(k, 1)
	return mock.ExpectQuery(exact("SELECT pg_try_advisory_xact_lock(" + a + "), pg_backend_pid()")).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"pg_try_advisory_xact_lock", "pid"}).AddRow(true, PID))
}

// ExpectTryLockTx expects TryLockTx to try k in the current transaction.
func ExpectTryLockTx(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	a, args := keyArgs(k, 1)
	return mock.ExpectQuery(exact("SELECT pg_try_advisory_xact_lock(" + a + ")")).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"pg_try_advisory_xact_lock"}).AddRow(acquired))
}

// ExpectRLockTx expects RLockTx to take k in shared mode in the current
// transaction.
func ExpectRLockTx(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	a, args := keyArgs(k, 1)
	return mock.ExpectQuery(exact("SELECT true FROM pg_advisory_xact_lock_shared(" + a + ")")).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"bool"}).AddRow(true))
}

// ExpectTryRLockTx expects TryRLockTx to try k in shared mode in the
// current transaction.
func ExpectTryRLockTx(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	a, args := keyArgs(k, 1)
	return mock.ExpectQuery(exact("SELECT pg_try_advisory_xact_lock_shared(" + a + ")")).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"pg_try_advisory_xact_lock_shared"}).AddRow(acquired))
}

// expectSessionLock expects the non-waiting lock statement of fn, with
// which every session-level lock call starts.
func expectSessionLock(mock sqlmock.Sqlmock, fn string, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	a, args := keyArgs(k, 1)
	q := "SELECT " + fn + "(" + a + "), pg_backend_pid(), pg_is_in_recovery()"
	return mock.ExpectQuery(exactWithSettings(q)).WithArgs(args...).
		WillReturnRows(sqlmock.NewRows([]string{"acquired", "pid", "in_recovery"}).AddRow(acquired, PID, false))
}

func expectUnlock(mock sqlmock.Sqlmock, fn string, k sqllock.Key) *sqlmock.ExpectedQuery {
	a, args := keyArgs(k, 1)
	n := "$" + string(rune('1'+len(args)))
	q := "SELECT " + fn + "(" + a + ") WHERE pg_backend_pid() = " + n + "::int4"
	return mock.ExpectQuery(exact(q)).WithArgs(append(args, int64(PID))...).
		WillReturnRows(sqlmock.NewRows([]string{"released"}).AddRow(true))
}

// keyArgs returns the placeholders and bound values of k.
func keyArgs(k sqllock.Key, first int) (string, []driver.Value) {
	p := func(i int) string { return "$" + string(rune('0'+first+i)) }
	if c, id, ok := k.Pair(); ok {
		return p(0) + ", " + p(1), []driver.Value{int64(c), int64(id)}
	}
	v, _ := k.Int64()
	return p(0), []driver.Value{v}
}

func exact(q string) string { return "^" + regexp.QuoteMeta(q) + "$" }

// exactWithSettings matches q, with or without the session settings that
// a Locker appends to the statement of a connection's first lock
// (sqllock.WithOrphanBound, WithApplicationName).
func exactWithSettings(q string) string {
	return "^" + regexp.QuoteMeta(q) + `( FROM \(SELECT .* AS settings)?$`
}
