package sqllockmock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/sqllockmock"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

var (
	reindexKey = sqllock.Hash("cron:reindex_posts")
	reportKey  = sqllock.Pair(2, 100)
	readKey    = sqllock.Int64(-5)
)

// userCode is what an application does with sqllock; the test runs it
// against go-sqlmock with the helpers and against a real PostgreSQL.
func userCode(ctx context.Context, db *sql.DB) error {
	locker := sqllock.New(db, sqllock.WithKeepAlive(0))
	// The cron pattern, with a statement under the lock.
	if _, err := locker.TryDo(ctx, reindexKey, func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, "UPDATE posts SET indexed = true")
		return err
	}); err != nil {
		return err
	}
	// A blocking exclusive lock and a shared one.
	lk, err := locker.Lock(ctx, reindexKey)
	if err != nil {
		return err
	}
	if err := lk.Unlock(ctx); err != nil {
		return err
	}
	for _, try := range []bool{false, true} {
		get := locker.RLock
		if try {
			get = locker.TryRLock
		}
		r, err := get(ctx, readKey)
		if err != nil {
			return err
		}
		if err := r.Unlock(ctx); err != nil {
			return err
		}
	}
	// A transaction-scoped lock around a write.
	if err := locker.InTx(ctx, reportKey, nil, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO reports (day) VALUES (1)")
		return err
	}); err != nil {
		return err
	}
	// The other transaction-scoped calls.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := sqllock.RLockTx(ctx, tx, readKey); err != nil {
		return err
	}
	if ok, err := sqllock.TryRLockTx(ctx, tx, readKey); err != nil || !ok {
		return err
	}
	if ok, err := sqllock.TryLockTx(ctx, tx, reindexKey); err != nil || !ok {
		return err
	}
	return tx.Commit()
}

func TestUserCodeWithMock(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sqllockmock.ExpectServerCheck(mock)
	sqllockmock.ExpectTryLock(mock, reindexKey, true)
	mock.ExpectExec("UPDATE posts").WillReturnResult(sqlmock.NewResult(0, 3))
	sqllockmock.ExpectUnlock(mock, reindexKey)
	sqllockmock.ExpectLock(mock, reindexKey)
	sqllockmock.ExpectUnlock(mock, reindexKey)
	sqllockmock.ExpectRLock(mock, readKey)
	sqllockmock.ExpectRUnlock(mock, readKey)
	sqllockmock.ExpectTryRLock(mock, readKey, true)
	sqllockmock.ExpectRUnlock(mock, readKey)
	mock.ExpectBegin()
	sqllockmock.ExpectInTxLock(mock, reportKey)
	mock.ExpectExec("INSERT INTO reports").WillReturnResult(sqlmock.NewResult(1, 1))
	mock.ExpectCommit()
	mock.ExpectBegin()
	sqllockmock.ExpectRLockTx(mock, readKey)
	sqllockmock.ExpectTryRLockTx(mock, readKey, true)
	sqllockmock.ExpectTryLockTx(mock, reindexKey, true)
	mock.ExpectCommit()
	if err := userCode(context.Background(), db); err != nil {
		t.Fatalf("userCode() against sqlmock = %v", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

func TestUserCodeWithPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	for _, q := range []string{"CREATE TABLE posts (indexed bool)", "INSERT INTO posts VALUES (false)", "CREATE TABLE reports (day int)"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := userCode(context.Background(), db); err != nil {
		t.Fatalf("userCode() against PostgreSQL = %v", err)
	}
	var indexed bool
	var reports int
	if err := db.QueryRow("SELECT bool_and(indexed), (SELECT count(*) FROM reports) FROM posts").Scan(&indexed, &reports); err != nil || !indexed || reports != 1 {
		t.Fatalf("effects: indexed %v, reports %d, %v", indexed, reports, err)
	}
	locks, err := sqllock.Inspect(context.Background(), db, nil)
	if err != nil || len(locks) != 0 {
		t.Fatalf("locks left: %v, %v", locks, err)
	}
}

// TestHelpersFailOnOtherCalls: an expectation for one call does not accept
// another (the helpers are exact).
func TestHelpersFailOnOtherCalls(t *testing.T) {
	tests := []struct {
		name string
		call func(*sqllock.Locker) error
	}{
		{"RLock against ExpectTryLock", func(l *sqllock.Locker) error {
			_, err := l.RLock(context.Background(), sqllock.Int64(1))
			return err
		}},
		{"TryLock of another key", func(l *sqllock.Locker) error {
			_, err := l.TryLock(context.Background(), sqllock.Int64(2))
			return err
		}},
		{"TryLock of the pair form", func(l *sqllock.Locker) error {
			_, err := l.TryLock(context.Background(), sqllock.Pair(0, 1))
			return err
		}},
		{"TryRLock against ExpectTryLock", func(l *sqllock.Locker) error {
			_, err := l.TryRLock(context.Background(), sqllock.Int64(1))
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, mock, err := sqlmock.New()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			sqllockmock.ExpectServerCheck(mock)
			sqllockmock.ExpectTryLock(mock, sqllock.Int64(1), true)
			err = tt.call(sqllock.New(db, sqllock.WithKeepAlive(0)))
			if err == nil || !strings.Contains(err.Error(), "could not match") && !strings.Contains(err.Error(), "do not match") {
				t.Fatalf("call = %v, want a sqlmock mismatch", err)
			}
		})
	}
}

// TestExpectLockAfterWait: a Lock that finds the key held, waits, and is
// granted matches ExpectLockAfterWait.
func TestExpectLockAfterWait(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	k := sqllock.Pair(3, 4)
	sqllockmock.ExpectServerCheck(mock)
	sqllockmock.ExpectLockAfterWait(mock, k)
	sqllockmock.ExpectUnlock(mock, k)
	l := sqllock.New(db, sqllock.WithKeepAlive(0))
	lk, err := l.Lock(context.Background(), k)
	if err != nil {
		t.Fatalf("Lock = %v", err)
	}
	if err := lk.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

// contexts are the kinds of context code under test may pass to a lock
// call: none that ends, one that can be cancelled, one with a deadline.
var contexts = []struct {
	name string
	ctx  func(t *testing.T) context.Context
}{
	{"background", func(*testing.T) context.Context { return context.Background() }},
	{"cancellable", func(t *testing.T) context.Context { return t.Context() }},
	{"deadline", func(t *testing.T) context.Context {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		t.Cleanup(cancel)
		return ctx
	}},
}

// TestTxHelpersAnyContext: the documented sequence (ExpectBegin, the lock
// helper, the transaction's statements, ExpectCommit) passes for every
// transaction-level helper whatever context the code under test passes.
func TestTxHelpersAnyContext(t *testing.T) {
	k := sqllock.Pair(7, 8)
	tests := []struct {
		name   string
		expect func(sqlmock.Sqlmock)
		// call runs the lock call and a statement in a transaction.
		call func(ctx context.Context, db *sql.DB) error
	}{
		{"ExpectLockTx", func(m sqlmock.Sqlmock) { sqllockmock.ExpectLockTx(m, k) }, inTx(func(ctx context.Context, tx *sql.Tx) error {
			return sqllock.LockTx(ctx, tx, k)
		})},
		{"ExpectRLockTx", func(m sqlmock.Sqlmock) { sqllockmock.ExpectRLockTx(m, k) }, inTx(func(ctx context.Context, tx *sql.Tx) error {
			return sqllock.RLockTx(ctx, tx, k)
		})},
		{"ExpectTryLockTx", func(m sqlmock.Sqlmock) { sqllockmock.ExpectTryLockTx(m, k, true) }, inTx(func(ctx context.Context, tx *sql.Tx) error {
			return wantTry(sqllock.TryLockTx(ctx, tx, k))(true)
		})},
		{"ExpectTryLockTx not acquired", func(m sqlmock.Sqlmock) { sqllockmock.ExpectTryLockTx(m, k, false) }, inTx(func(ctx context.Context, tx *sql.Tx) error {
			return wantTry(sqllock.TryLockTx(ctx, tx, k))(false)
		})},
		{"ExpectTryRLockTx", func(m sqlmock.Sqlmock) { sqllockmock.ExpectTryRLockTx(m, k, true) }, inTx(func(ctx context.Context, tx *sql.Tx) error {
			return wantTry(sqllock.TryRLockTx(ctx, tx, k))(true)
		})},
		{"ExpectInTxLock", func(m sqlmock.Sqlmock) { sqllockmock.ExpectInTxLock(m, k) }, func(ctx context.Context, db *sql.DB) error {
			return sqllock.New(db, sqllock.WithKeepAlive(0)).InTx(ctx, k, nil, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO reports (day) VALUES (1)")
				return err
			})
		}},
		{"ExpectLockTx for InTx", func(m sqlmock.Sqlmock) { sqllockmock.ExpectLockTx(m, k) }, func(ctx context.Context, db *sql.DB) error {
			return sqllock.New(db, sqllock.WithKeepAlive(0)).InTx(ctx, k, nil, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "INSERT INTO reports (day) VALUES (1)")
				return err
			})
		}},
	}
	for _, tt := range tests {
		for _, c := range contexts {
			t.Run(tt.name+"/"+c.name, func(t *testing.T) {
				db, mock, err := sqlmock.New()
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				mock.ExpectBegin()
				tt.expect(mock)
				mock.ExpectExec("INSERT INTO reports").WillReturnResult(sqlmock.NewResult(1, 1))
				mock.ExpectCommit()
				if err := tt.call(c.ctx(t), db); err != nil {
					t.Fatalf("call under a %s context = %v", c.name, err)
				}
				if err := mock.ExpectationsWereMet(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// inTx returns code under test that begins a transaction, takes a lock in
// it with lock, inserts a row and commits.
func inTx(lock func(ctx context.Context, tx *sql.Tx) error) func(ctx context.Context, db *sql.DB) error {
	return func(ctx context.Context, db *sql.DB) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := lock(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO reports (day) VALUES (1)"); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// wantTry turns a try's answer into an error unless it is want, nil.
func wantTry(ok bool, err error) func(want bool) error {
	return func(want bool) error {
		if err != nil || ok != want {
			return fmt.Errorf("try = %v, %v; want %v, nil", ok, err, want)
		}
		return nil
	}
}

// TestForgottenServerCheckNamed: a test that forgets ExpectServerCheck
// gets an error that names it in plain words (no regular expression of
// the mock's), whatever comes next in its list of expectations, and
// whichever call sends the check; the mock's own error is wrapped. A
// check the test expects, with an error of its own, gets that error.
func TestForgottenServerCheckNamed(t *testing.T) {
	const want = "did not expect the server check, a Locker's first statement on each connection: call sqllockmock.ExpectServerCheck(mock) first"
	k := sqllock.Hash("cron:reindex_posts")
	tests := []struct {
		name   string
		expect func(mock sqlmock.Sqlmock)
		call   func(ctx context.Context, l *sqllock.Locker) error
	}{
		{"TryLock, its expectation next", func(mock sqlmock.Sqlmock) { sqllockmock.ExpectTryLock(mock, k, true) },
			func(ctx context.Context, l *sqllock.Locker) error { _, err := l.TryLock(ctx, k); return err }},
		{"Lock, no expectation left", func(sqlmock.Sqlmock) {},
			func(ctx context.Context, l *sqllock.Locker) error { _, err := l.Lock(ctx, k); return err }},
		{"RLock, an Exec next", func(mock sqlmock.Sqlmock) { mock.ExpectExec("UPDATE posts") },
			func(ctx context.Context, l *sqllock.Locker) error { _, err := l.RLock(ctx, k); return err }},
		{"Semaphore", func(sqlmock.Sqlmock) {},
			func(ctx context.Context, l *sqllock.Locker) error {
				_, err := l.Semaphore("exports", 2).TryAcquire(ctx)
				return err
			}},
		{"Session", func(sqlmock.Sqlmock) {},
			func(ctx context.Context, l *sqllock.Locker) error { _, err := l.Session(ctx); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, mock, err := sqlmock.New()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			tt.expect(mock)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = tt.call(ctx, sqllock.New(db, sqllock.WithKeepAlive(0)))
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("error = %v, want one that says %q", err, want)
			}
			if msg := err.Error(); strings.Contains(msg, "regexp") || strings.Contains(msg, "version()") || len(msg) > 300 {
				t.Errorf("error = %q (%d bytes): want plain words, not the mock's comparison of statements", msg, len(msg))
			}
			if errors.Unwrap(err) == nil {
				t.Errorf("error %v wraps nothing, want the mock's own error", err)
			}
		})
	}
	t.Run("expected, with an error", func(t *testing.T) {
		db, mock, err := sqlmock.New()
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		refused := errors.New("the test's own refusal")
		sqllockmock.ExpectServerCheck(mock).WillReturnError(refused)
		// (A session of its own: a shared session whose check failed is
		// followed by one of its own, which checks again.)
		_, err = sqllock.New(db, sqllock.WithKeepAlive(0), sqllock.WithDedicatedSessions()).TryLock(context.Background(), k)
		if !errors.Is(err, refused) || strings.Contains(err.Error(), "ExpectServerCheck") {
			t.Fatalf("TryLock() = %v, want the test's own error, and no advice", err)
		}
	})
}
