package sqllock_test

// Outcomes a real server cannot easily be made to give, shown with
// go-sqlmock: a standby's grant whose release fails, a lock statement
// that fails with a refusal the server is sure of.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllockmock"
)

type outcomeCounter struct{ lost, released atomic.Int64 }

func (o *outcomeCounter) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	return nil
}

func (o *outcomeCounter) Event(_ context.Context, e sqllock.Event) {
	switch e.Kind {
	case sqllock.EventLost:
		o.lost.Add(1)
	case sqllock.EventReleased:
		o.released.Add(1)
	}
}

// TestStandbyGrantReleaseFails: a standby's grant, which the call
// releases before it refuses, is a lock no caller ever held: when its
// release fails, the session is discarded, and no Lock is reported lost
// or counted (Stats.Held stays 0, no EventLost).
func TestStandbyGrantReleaseFails(t *testing.T) {
	db, mock := newMock(t)
	k := sqllock.Pair(1, 2)
	sqllockmock.ExpectServerCheck(mock)
	sqllockmock.ExpectTryLock(mock, k, true).
		WillReturnRows(sqlmock.NewRows([]string{"a", "p", "r"}).AddRow(true, sqllockmock.PID, true))
	sqllockmock.ExpectUnlock(mock, k).WillReturnError(errors.New("unlock failed"))
	obs := &outcomeCounter{}
	l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0), sqllock.WithObserver(obs))
	if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrStandby) {
		t.Fatalf("TryLock() on a standby = %v, want ErrStandby", err)
	}
	st := l.Stats()
	if st.Held != 0 || st.Lost != 0 || obs.lost.Load() != 0 {
		t.Errorf("Stats() = Held %d Lost %d, EventLost x%d: want 0/0/0 (no lock was ever held by the caller)", st.Held, st.Lost, obs.lost.Load())
	}
}

// TestFailedLockStatementDiscards: a lock statement on a connection of
// the Locker's that failed, even with a refusal the server is sure of (a
// full lock table, 53200), may have taken its key first (the settings it
// applies come after the grant): the connection is discarded, not given
// back to the pool.
func TestFailedLockStatementDiscards(t *testing.T) {
	db, mock := newMock(t)
	k := sqllock.Int64(7)
	sqllockmock.ExpectServerCheck(mock)
	sqllockmock.ExpectTryLock(mock, k, true).WillReturnError(sqlStateErr("53200"))
	l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
	if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrLockTableFull) {
		t.Fatalf("TryLock() = %v, want ErrLockTableFull", err)
	}
	if st := l.Stats(); st.Discarded != 1 {
		t.Errorf("Stats().Discarded = %d: the session whose lock statement failed went back to the pool unchecked", st.Discarded)
	}
}
