package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"github.com/sqllock/sqllock/internal/sqltext"
	"regexp"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllockmock"
)

// These tests use go-sqlmock for outcomes a real server cannot easily be
// made to produce on demand.

func newMock(t *testing.T) (*sql.DB, sqlmock.Sqlmock) {
	t.Helper()
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Error(err)
		}
		db.Close()
	})
	return db, mock
}

func TestUnsupportedServer(t *testing.T) {
	tests := []struct{ name, version string }{
		{"cockroach", "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27)"},
		{"not postgres", "MySQL 8.0.33"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, mock := newMock(t)
			l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
			mock.ExpectQuery(regexp.QuoteMeta("SELECT version()")).
				WillReturnRows(sqlmock.NewRows([]string{"version", "pid", "server_start", "backend_start"}).AddRow(tt.version, 1, 0, 0))
			if _, err := l.TryLock(bg(), sqllock.Int64(1)); !errors.Is(err, sqllock.ErrUnsupportedServer) {
				t.Fatalf("TryLock() = %v, want ErrUnsupportedServer", err)
			}
			if st := l.Stats(); st.Acquired != 0 || st.Held != 0 {
				t.Fatalf("Stats() = %+v, want nothing acquired", st)
			}
		})
	}
}

func TestServerCheckIsCached(t *testing.T) {
	db, mock := newMock(t)
	l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
	sqllockmock.ExpectServerCheck(mock)
	for i := 0; i < 3; i++ {
		sqllockmock.ExpectTryLock(mock, sqllock.Int64(1), true)
		sqllockmock.ExpectUnlock(mock, sqllock.Int64(1))
		lk, err := l.TryLock(bg(), sqllock.Int64(1))
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUnlockOutcomes(t *testing.T) {
	k := sqllock.Int64(7)
	tests := []struct {
		name     string
		reply    func(*sqlmock.ExpectedQuery)
		want     []error
		errIsNil bool
	}{
		{"confirmed", func(q *sqlmock.ExpectedQuery) {
			q.WillReturnRows(sqlmock.NewRows([]string{"r"}).AddRow(true))
		}, nil, true},
		{"not held", func(q *sqlmock.ExpectedQuery) {
			q.WillReturnRows(sqlmock.NewRows([]string{"r"}).AddRow(false))
		}, []error{sqllock.ErrLockLost}, false},
		{"other backend", func(q *sqlmock.ExpectedQuery) {
			q.WillReturnRows(sqlmock.NewRows([]string{"r"})) // no row: another backend
		}, []error{sqllock.ErrLockLost, sqllock.ErrSessionChanged}, false},
		{"connection error", func(q *sqlmock.ExpectedQuery) {
			q.WillReturnError(errors.New("read tcp: connection reset by peer"))
		}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, mock := newMock(t)
			l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
			sqllockmock.ExpectServerCheck(mock)
			sqllockmock.ExpectLock(mock, k)
			tt.reply(sqllockmock.ExpectUnlock(mock, k))
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			err = lk.Unlock(bg())
			if tt.errIsNil != (err == nil) {
				t.Fatalf("Unlock() = %v", err)
			}
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("Unlock() = %v, want it to match %v", err, w)
				}
			}
			discarded := int64(1)
			if tt.errIsNil {
				discarded = 0
			}
			if st := l.Stats(); st.Discarded != discarded {
				t.Errorf("Stats().Discarded = %d, want %d (a doubtful connection is never pooled)", st.Discarded, discarded)
			}
			if errors.Is(err, sqllock.ErrLockLost) && !errors.Is(lk.Err(), sqllock.ErrLockLost) {
				t.Errorf("Err() = %v after a lost unlock", lk.Err())
			}
		})
	}
}

func TestStandbyRefused(t *testing.T) {
	db, mock := newMock(t)
	k := sqllock.Pair(1, 2)
	sqllockmock.ExpectServerCheck(mock)
	sqllockmock.ExpectTryLock(mock, k, true).
		WillReturnRows(sqlmock.NewRows([]string{"a", "p", "r"}).AddRow(true, sqllockmock.PID, true))
	sqllockmock.ExpectUnlock(mock, k)
	l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
	if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrStandby) {
		t.Fatalf("TryLock() on a standby = %v, want ErrStandby", err)
	}
	if st := l.Stats(); st.Held != 0 || st.Discarded != 0 {
		t.Fatalf("Stats() = %+v: the standby lock must be released and the connection kept", st)
	}
}

// TestStandbyRefusedTx: a transaction-level call whose first statement is
// answered by a standby (in_recovery true, nothing taken) returns
// ErrStandby at once, whatever its context, and sends nothing more; InTx
// does not run fn.
func TestStandbyRefusedTx(t *testing.T) {
	k := sqllock.Int64(5)
	standby := func(q *sqlmock.ExpectedQuery) {
		q.WillReturnRows(sqlmock.NewRows([]string{"acquired", "pid", "in_recovery"}).AddRow(false, sqllockmock.PID, true))
	}
	calls := []struct {
		name   string
		expect func(sqlmock.Sqlmock) *sqlmock.ExpectedQuery
		call   func(ctx context.Context, tx *sql.Tx) error
	}{
		{"LockTx", func(m sqlmock.Sqlmock) *sqlmock.ExpectedQuery { return sqllockmock.ExpectLockTx(m, k) },
			func(ctx context.Context, tx *sql.Tx) error { return sqllock.LockTx(ctx, tx, k) }},
		{"RLockTx", func(m sqlmock.Sqlmock) *sqlmock.ExpectedQuery { return sqllockmock.ExpectRLockTx(m, k) },
			func(ctx context.Context, tx *sql.Tx) error { return sqllock.RLockTx(ctx, tx, k) }},
		{"TryLockTx", func(m sqlmock.Sqlmock) *sqlmock.ExpectedQuery { return sqllockmock.ExpectTryLockTx(m, k, false) },
			func(ctx context.Context, tx *sql.Tx) error { _, err := sqllock.TryLockTx(ctx, tx, k); return err }},
		{"TryRLockTx", func(m sqlmock.Sqlmock) *sqlmock.ExpectedQuery { return sqllockmock.ExpectTryRLockTx(m, k, false) },
			func(ctx context.Context, tx *sql.Tx) error { _, err := sqllock.TryRLockTx(ctx, tx, k); return err }},
	}
	contexts := []struct {
		name string
		ctx  func(t *testing.T) context.Context
	}{
		{"background", func(*testing.T) context.Context { return bg() }},
		{"cancellable", func(t *testing.T) context.Context { return t.Context() }},
		{"deadline", func(t *testing.T) context.Context {
			ctx, cancel := context.WithTimeout(bg(), time.Minute)
			t.Cleanup(cancel)
			return ctx
		}},
	}
	for _, c := range contexts {
		for _, call := range calls {
			t.Run(call.name+"/"+c.name, func(t *testing.T) {
				db, mock := newMock(t)
				mock.ExpectBegin()
				standby(call.expect(mock))
				mock.ExpectRollback()
				tx, err := db.BeginTx(bg(), nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback()
				if err := call.call(c.ctx(t), tx); !errors.Is(err, sqllock.ErrStandby) {
					t.Fatalf("%s() answered by a standby = %v, want ErrStandby", call.name, err)
				}
			})
		}
		t.Run("InTx/"+c.name, func(t *testing.T) {
			db, mock := newMock(t)
			mock.ExpectBegin()
			standby(sqllockmock.ExpectInTxLock(mock, k))
			mock.ExpectRollback()
			ran := false
			err := sqllock.New(db, sqllock.WithKeepAlive(0)).InTx(c.ctx(t), k, nil, func(*sql.Tx) error { ran = true; return nil })
			if !errors.Is(err, sqllock.ErrStandby) || ran {
				t.Fatalf("InTx() answered by a standby = %v (fn ran: %v), want ErrStandby", err, ran)
			}
		})
	}
}

func TestLockErrorsClassified(t *testing.T) {
	k := sqllock.Int64(3)
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"deadlock by message", errors.New("ERROR: deadlock detected (SQLSTATE 40P01)"), sqllock.ErrDeadlock},
		{"out of shared memory", errors.New("pq: out of shared memory"), sqllock.ErrLockTableFull},
		{"lock_timeout", sqlStateErr("55P03"), sqllock.ErrNotAcquired},
		{"statement_timeout", sqlStateErr("57014"), sqllock.ErrNotAcquired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, mock := newMock(t)
			sqllockmock.ExpectServerCheck(mock)
			sqllockmock.ExpectLock(mock, k).WillReturnError(tt.err)
			l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
			_, err := l.Lock(bg(), k)
			if !errors.Is(err, tt.want) || !errors.Is(err, tt.err) {
				t.Fatalf("Lock() = %v, want %v wrapping the cause", err, tt.want)
			}
		})
	}
}

type sqlStateErr string

func (e sqlStateErr) Error() string    { return "server error " + string(e) }
func (e sqlStateErr) SQLState() string { return string(e) }

// TestUnlockIsBounded: an unlock that hangs is abandoned after the unlock
// timeout (at most 1.25 of it), its connection discarded, even when the
// caller's context is already cancelled.
func TestUnlockIsBounded(t *testing.T) {
	db, mock := newMock(t)
	k := sqllock.Int64(12)
	sqllockmock.ExpectServerCheck(mock)
	sqllockmock.ExpectLock(mock, k)
	sqllockmock.ExpectUnlock(mock, k).WillDelayFor(time.Minute)
	l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0), sqllock.WithUnlockTimeout(200*time.Millisecond))
	lk, err := l.Lock(bg(), k)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg())
	cancel()
	start := time.Now()
	err = lk.Unlock(ctx)
	d := time.Since(start)
	if err == nil || d < 150*time.Millisecond || d > 2*time.Second {
		t.Fatalf("Unlock() of a hanging statement = %v after %v, want an error after 200-250ms", err, d)
	}
	if st := l.Stats(); st.Discarded != 1 {
		t.Fatalf("Stats() = %+v, want the connection discarded", st)
	}
}

// TestSharedUnlockOutcomes: on a shared session, a certain answer touches
// one lock and an uncertain one takes the session's every lock. An unlock
// the server says found no lock loses that Lock only; an unlock statement
// that fails discards the session, and every Lock on it reports the loss.
// (A real server cannot be made to drop one lock of a live session.)
func TestSharedUnlockOutcomes(t *testing.T) {
	db, mock := newMock(t)
	l := sqllock.New(db, sqllock.WithKeepAlive(0))
	sqllockmock.ExpectServerCheck(mock)
	keys := []sqllock.Key{sqllock.Int64(1), sqllock.Int64(2), sqllock.Int64(3)}
	for _, k := range keys {
		v, _ := k.Int64()
		mock.ExpectQuery(`pg_try_advisory_lock\(\$1\)`).WithArgs(v, sqlmock.AnyArg()).
			WillReturnRows(sqlmock.NewRows([]string{"acquired", "pid", "in_recovery"}).AddRow(true, sqllockmock.PID, false))
	}
	locks := make([]*sqllock.Lock, len(keys))
	for i, k := range keys {
		lk, err := l.TryLock(bg(), k)
		if err != nil {
			t.Fatalf("TryLock(%v) = %v", k, err)
		}
		if lk.PID() != sqllockmock.PID || sqllock.ConnOf(lk) != nil {
			t.Fatalf("TryLock(%v): PID %d, own Conn %v; want the shared session", k, lk.PID(), sqllock.ConnOf(lk))
		}
		locks[i] = lk
	}
	// Certain: the server says the session did not hold key 2.
	mock.ExpectQuery(`pg_advisory_unlock\(\$1\).*WHERE pg_backend_pid\(\) = \$2`).WithArgs(int64(2), int64(sqllockmock.PID)).
		WillReturnRows(sqlmock.NewRows([]string{"released"}).AddRow(false))
	if err := locks[1].Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("Unlock of a lock the server did not hold = %v, want ErrLockLost", err)
	}
	for _, i := range []int{0, 2} {
		if err := locks[i].Err(); err != nil {
			t.Fatalf("lock %v after its neighbour's certain loss: Err() = %v, want nil", locks[i].Key(), err)
		}
	}
	// Uncertain: the unlock statement of key 1 fails.
	mock.ExpectQuery(`pg_advisory_unlock\(\$1\)`).WithArgs(int64(1), int64(sqllockmock.PID)).
		WillReturnError(errors.New("canceling statement due to statement timeout"))
	if err := locks[0].Unlock(bg()); err == nil {
		t.Fatalf("Unlock with a failed statement = nil, want an error")
	}
	select {
	case <-locks[2].Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("lock %v on the discarded session: Done not closed", locks[2].Key())
	}
	if err := locks[2].Err(); !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("lock %v on the discarded session: Err() = %v, want ErrLockLost", locks[2].Key(), err)
	}
	if err := locks[2].Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("Unlock of a lock on the discarded session = %v, want ErrLockLost", err)
	}
	if st := l.Stats(); st.Held != 0 || st.Discarded != 1 || st.SharedSessions != 0 {
		t.Errorf("Stats() = %+v; want nothing held, one connection discarded, no shared session", st)
	}
}

// TestServerCheckLockTableFull: a lock call whose first statement on a new
// connection, the server check, meets a full lock table (its catalogue
// reads take locks too) is told ErrLockTableFull, as a lock statement
// would be.
func TestServerCheckLockTableFull(t *testing.T) {
	tests := []struct {
		name   string
		opt    sqllock.Option
		checks int // a shared session that cannot open leaves the call to a session of its own
	}{{"dedicated", sqllock.WithDedicatedSessions(), 1}, {"shared", sqllock.WithKeepAlive(0), 2}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, mock := newMock(t)
			l := sqllock.New(db, tt.opt, sqllock.WithKeepAlive(0))
			for range tt.checks {
				mock.ExpectQuery(regexp.QuoteMeta("SELECT version(), pg_backend_pid()")).WillReturnError(sqlStateErr("53200"))
				mock.ExpectQuery("^" + regexp.QuoteMeta(sqltext.PlainVersionSQL) + "$").WillReturnError(sqlStateErr("53200"))
			}
			if _, err := l.TryLock(bg(), sqllock.Int64(1)); !errors.Is(err, sqllock.ErrLockTableFull) {
				t.Fatalf("TryLock() = %v, want ErrLockTableFull", err)
			}
		})
	}
}

// TestStrayCheckOnAnotherBackend: after a try the server failed with a
// certain refusal (a full lock table), the session reads which locks its
// backend holds, to release what the try took before it failed; an answer
// from another backend (a pooler moved the session) says nothing of them:
// the session ends, and its locks are reported lost, rather than kept
// with a key the failed try may hold.
func TestStrayCheckOnAnotherBackend(t *testing.T) {
	db, mock := newMock(t)
	l := sqllock.New(db, sqllock.WithKeepAlive(0))
	sqllockmock.ExpectServerCheck(mock)
	sqllockmock.ExpectTryLock(mock, sqllock.Int64(1), true)
	held, err := l.TryLock(bg(), sqllock.Int64(1))
	if err != nil {
		t.Fatal(err)
	}
	sqllockmock.ExpectTryLock(mock, sqllock.Int64(2), false).WillReturnError(sqlStateErr("53200"))
	mock.ExpectQuery(regexp.QuoteMeta("SELECT pg_backend_pid(), l.classid::int8")).
		WillReturnRows(sqlmock.NewRows([]string{"pid", "classid", "objid", "objsubid", "mode", "granted"}).AddRow(int64(sqllockmock.PID+1), nil, nil, nil, nil, nil))
	if _, err := l.TryLock(bg(), sqllock.Int64(2)); !errors.Is(err, sqllock.ErrLockTableFull) {
		t.Fatalf("TryLock() on a full lock table = %v, want ErrLockTableFull", err)
	}
	if err := held.Err(); !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("Err() of the session's other lock = %v, want ErrLockLost (the session ended)", err)
	}
}
