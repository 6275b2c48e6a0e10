// Package sqllockmock registers the go-sqlmock expectations that sqllock's
// statements need, so unit tests of code that uses sqllock never copy SQL
// text from its source.
//
// Build the Locker under test with keep-alive off, so that no background
// query runs at an unpredictable moment; it is otherwise the Locker a
// program runs. A lock on one of the Locker's shared sessions sends the
// statements a lock on a session of its own does, so the same helpers
// describe both, for calls made one after another (concurrent calls are
// batched, an order no list of expectations can describe):
//
//	db, mock, _ := sqlmock.New()
//	locker := sqllock.New(db, sqllock.WithKeepAlive(0))
//	sqllockmock.ExpectServerCheck(mock) // once per Locker and connection (a mock has one), before its first session lock
//	sqllockmock.ExpectTryLock(mock, key, true)
//	// ... expectations of the code that runs under the lock ...
//	sqllockmock.ExpectUnlock(mock, key)
//
// [Locker.Do] and [Locker.TryDo] issue the lock statement, then fn's
// statements, then the unlock statement: expect them in that order.
// Transaction-scoped locks run inside the transaction: ExpectBegin, then
// ExpectLockTx (ExpectInTxLock for InTx), then the transaction's
// statements, then ExpectCommit or ExpectRollback. These hold whatever
// context the code under test passes (context.Background(), t.Context(),
// one with a deadline): every lock call starts with a statement that does
// not depend on its context, and a free key is granted by it.
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
	"strings"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// PID is the backend process id the helpers report for a lock; the unlock
// expectation answers from the same pid, as a real server would.
const PID = 4242

// ServerVersion is the version() the server check is answered with.
const ServerVersion = "PostgreSQL 16.4 on x86_64-pc-linux-gnu"

// ExpectServerCheck expects the version() query a Locker sends on each
// connection before its first session-level lock there (Lock, TryLock, a
// Session, a Semaphore), to refuse servers without real advisory locks: a
// mock database has one connection, so expect it once per Locker.
// Transaction-level locks (LockTx, InTx) send none: do not expect it for
// them. A test that forgets it gets an error that says so ("the mock
// database did not expect the server check ... call
// sqllockmock.ExpectServerCheck(mock) first"), which wraps go-sqlmock's.
func ExpectServerCheck(mock sqlmock.Sqlmock) *sqlmock.ExpectedQuery {
	return mock.ExpectQuery(exact(sqltext.VersionSQL)).
		WillReturnRows(sqlmock.NewRows([]string{"version", "pid", "server_start", "backend_start"}).AddRow(ServerVersion, PID, int64(0), int64(0)))
}

// ExpectLock expects Locker.Lock (and Do) to take k, and grants it. A
// waiting call starts with the non-waiting function (one that passes no
// one waiting in the key's line), and a free lock is granted by it: this
// is the statement ExpectLock expects.
func ExpectLock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectPolite(mock, 0, k, true)
}

// ExpectLockAfterWait expects a Locker's first wait: Locker.Lock (and Do)
// finds k held, reads the server's deadlock_timeout (once per Locker),
// takes its ticket in the key's line, then waits for k, and is granted it
// after the wait: four statements.
func ExpectLockAfterWait(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	expectPolite(mock, 0, k, false)
	mock.ExpectQuery(exact(sqltext.WaitSliceSQL)).
		WillReturnRows(sqlmock.NewRows([]string{"slice"}).AddRow(int64(500)))
	class := sqltext.TicketClass(key(k))
	q, args := statements.RegisterSQL(class, false, "500ms", mark, true)
	mock.ExpectQuery(pattern(q)).WithArgs(values(args)...).
		WillReturnRows(sqlmock.NewRows([]string{"ticket", "pid", "in_recovery", "allowed"}).AddRow(int64(1), PID, false, true))
	q, args = statements.SliceSQL(0, key(k), class, 1, "500ms", mark)
	return mock.ExpectQuery(pattern(q)).WithArgs(values(args)...).
		WillReturnRows(sqlmock.NewRows([]string{"granted", "pid", "in_recovery", "others", "late"}).AddRow(int64(0), PID, false, int64(0), false))
}

// ExpectTryLock expects Locker.TryLock (and TryDo) to try k; acquired says
// whether the mock server grants it.
func ExpectTryLock(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	return expectTry(mock, 0, k, acquired)
}

// ExpectRLock expects Locker.RLock to take k in shared mode, and grants it
// (with the non-waiting function, as ExpectLock does).
func ExpectRLock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectPolite(mock, sqltext.Shared, k, true)
}

// ExpectTryRLock expects Locker.TryRLock to try k in shared mode.
func ExpectTryRLock(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	return expectTry(mock, sqltext.Shared, k, acquired)
}

// ExpectUnlock expects Lock.Unlock of the exclusive lock k, and confirms
// it.
func ExpectUnlock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectUnlock(mock, false, k)
}

// ExpectRUnlock expects Lock.Unlock of the shared lock k, and confirms it.
func ExpectRUnlock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectUnlock(mock, true, k)
}

// ExpectLockTx expects LockTx to take k in the current transaction, and
// grants it, whatever the context LockTx is given (none, one that can be
// cancelled, one with a deadline): every transaction-level lock call
// starts with the same non-waiting statement, which grants a free key, and
// only a call that finds the key held sends statements that depend on its
// context. It is also the statement of Locker.InTx and InTxWith (see
// ExpectInTxLock).
func ExpectLockTx(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectXact(mock, 0, k, true)
}

// ExpectInTxLock expects Locker.InTx (or InTxWith) to take k in the
// transaction it began (after ExpectBegin), and grants it, whatever the
// context: the same expectation as ExpectLockTx, under the name of the
// call it is for.
func ExpectInTxLock(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return ExpectLockTx(mock, k)
}

// ExpectTryLockTx expects TryLockTx to try k in the current transaction,
// whatever the context; acquired says whether the mock server grants it.
func ExpectTryLockTx(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	return expectXact(mock, sqltext.Try, k, acquired)
}

// ExpectRLockTx expects RLockTx to take k in shared mode in the current
// transaction, and grants it, whatever the context (as ExpectLockTx).
func ExpectRLockTx(mock sqlmock.Sqlmock, k sqllock.Key) *sqlmock.ExpectedQuery {
	return expectXact(mock, sqltext.Shared, k, true)
}

// ExpectTryRLockTx expects TryRLockTx to try k in shared mode in the
// current transaction, whatever the context.
func ExpectTryRLockTx(mock sqlmock.Sqlmock, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	return expectXact(mock, sqltext.Try|sqltext.Shared, k, acquired)
}

// settings stands, in the statements the helpers expect, for the
// expression with which a Locker applies (or resets) the settings of a
// lock session, which depend on its options (sqllock.WithOrphanBound,
// WithApplicationName) and on the server's version, and for the condition
// a statement puts on the session's owner mark, which depends on whether
// the session is set up yet: pattern matches it with any text.
const settings = "\x00"

// statements are sqllock's own statements (bind mode: go-sqlmock is not
// lib/pq), with settings in place of the session settings.
var statements = sqltext.Described(settings)

// plain are the statements of a session set up already (the Locker's
// second lock on a shared session, and later ones), which carry no
// settings: some are shorter than statements' (same arguments).
var plain = sqltext.Plain(sqltext.Bind)

// expectTry expects the non-waiting lock statement of kind, with which
// every session-level lock call starts.
func expectTry(mock sqlmock.Sqlmock, kind sqltext.Kind, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	q, args := statements.TrySQL(kind|sqltext.Try, key(k), mark)
	set, _ := plain.TrySQL(kind|sqltext.Try, key(k), mark) // on a session set up already
	return mock.ExpectQuery(either(q, set)).WithArgs(values(args)...).
		WillReturnRows(sqlmock.NewRows([]string{"acquired", "pid", "in_recovery"}).AddRow(acquired, PID, false))
}

// expectPolite expects the first statement of a waiting lock call of kind:
// the non-waiting function, which passes no one in the key's line.
func expectPolite(mock sqlmock.Sqlmock, kind sqltext.Kind, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	q, args := statements.PoliteTrySQL(kind, key(k), sqltext.TicketClass(key(k)), mark)
	set, _ := plain.PoliteTrySQL(kind, key(k), sqltext.TicketClass(key(k)), mark)
	return mock.ExpectQuery(either(q, set)).WithArgs(values(args)...).
		WillReturnRows(sqlmock.NewRows([]string{"acquired", "pid", "in_recovery"}).AddRow(acquired, PID, false))
}

func expectUnlock(mock sqlmock.Sqlmock, shared bool, k sqllock.Key) *sqlmock.ExpectedQuery {
	q, args := statements.UnlockSQL(shared, key(k), PID)
	set, _ := plain.UnlockSQL(shared, key(k), PID) // on a session set up already
	return mock.ExpectQuery(either(q, set)).WithArgs(values(args)...).
		WillReturnRows(sqlmock.NewRows([]string{"released"}).AddRow(true))
}

// expectXact expects the non-waiting statement of kind, with which every
// transaction-level lock call starts, answered by a primary.
func expectXact(mock sqlmock.Sqlmock, kind sqltext.Kind, k sqllock.Key, acquired bool) *sqlmock.ExpectedQuery {
	q, args := sqltext.Bind.XactTrySQL(kind, key(k))
	return mock.ExpectQuery(exact(q)).WithArgs(values(args)...).
		WillReturnRows(sqlmock.NewRows([]string{"acquired", "pid", "in_recovery"}).AddRow(acquired, PID, false))
}

// key returns k as the statements take it.
func key(k sqllock.Key) sqltext.Key {
	c, i, pair := k.Pair()
	v, _ := k.Int64()
	return sqltext.Key{Pair: pair, V: v, Class: c, ID: i}
}

// mark stands, in the statements the helpers expect, for the owner mark
// of the Locker's session, which is its own: values matches it with any
// argument.
const mark = "mark"

// values returns a statement's bound values as go-sqlmock expects them.
func values(args []any) []driver.Value {
	vs := make([]driver.Value, len(args))
	for i, a := range args {
		vs[i] = a
		if a == mark {
			vs[i] = sqlmock.AnyArg()
		}
	}
	return vs
}

func exact(q string) string { return "^" + regexp.QuoteMeta(q) + "$" }

// pattern matches q exactly, but for the settings expression, which
// matches any text.
func pattern(q string) string {
	return "^" + strings.ReplaceAll(regexp.QuoteMeta(q), settings, ".*") + "$"
}

// either is the pattern of q (as pattern's) or exactly of alt.
func either(q, alt string) string {
	return "^(?:" + strings.ReplaceAll(regexp.QuoteMeta(q), settings, ".*") + "|" + regexp.QuoteMeta(alt) + ")$"
}
