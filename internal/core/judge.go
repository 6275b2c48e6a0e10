package core

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"
)

// verdict is what the outcome of an acquisition means for the session it
// ran on.
type verdict uint8

const (
	granted   verdict = iota // the session holds the lock
	refused                  // certain: the session holds no more than before, and is intact
	unwanted                 // granted on a standby: to be released, and refused
	uncertain                // the session may hold the lock: it must end
	// stray: the server refused the statement for sure (a deadlock's
	// victim, a full lock table), but a statement that failed may have
	// been granted its key first (the settings it applies come after the
	// grant, and a session-level lock outlives the statement): the key is
	// released if held, or the session ends.
	stray
)

// judge is the one rule book for the outcome o of an acquisition of the
// lock named what (called only when an error needs it): it returns what o
// means for the session, and the call's error (nil when granted). Its
// caller applies the verdict: a session of the Pool's is kept, given back
// or ended (settle), an Owned keeps its locks or is lost, a transaction
// is rolled back by its caller. A ctx that ended makes any answer
// uncertain but one read in time (o.Certain: a cancelled wait can still be
// granted, and a driver can report a cancelled statement as a success); a
// failed statement is uncertain, but for the server's certain refusals (a
// deadlock victim, a full lock table: nothing was taken). standbyOK says a
// standby's grant counts; pid, when not 0, is the backend that must have
// answered.
func judge(ctx context.Context, o wait.Outcome, what namer, standbyOK bool, pid int64) (verdict, error) {
	switch {
	case errors.Is(o.Err, wait.ErrDeadline):
		// The server ended the wait at ctx's deadline: not granted.
		return refused, stmt.NotAcquired(what.String(), context.DeadlineExceeded)
	case errors.Is(o.Err, wait.ErrLeft):
		// The wait left its line as ctx ended: not granted.
		return refused, stmt.NotAcquired(what.String(), stmt.CtxErr(ctx))
	case errors.Is(o.Err, wait.ErrRestart):
		// The wait left its line to end its transaction: not granted,
		// and the call waits on in a new session.
		return refused, wait.ErrRestart
	case stmt.CtxEnded(ctx) && !o.Certain:
		err := stmt.NotAcquired(what.String(), stmt.CtxErr(ctx))
		if errors.Is(o.Err, stmt.ErrAbandoned) {
			err = fmt.Errorf("%w (%w)", err, stmt.ErrAbandoned)
		}
		return uncertain, err
	case o.Err != nil:
		if stmt.Deadlocked(o.Err) || stmt.LockTableFull(o.Err) {
			return stray, stmt.LockError(what.String(), o.Err)
		}
		return uncertain, stmt.LockError(what.String(), o.Err)
	case pid != 0 && o.PID != pid:
		return uncertain, stmt.SessionChanged(pid, o.PID)
	case o.Standby && !standbyOK:
		if o.OK {
			return unwanted, stmt.StandbyError("lock " + what.String())
		}
		return refused, stmt.StandbyError("lock " + what.String())
	case !o.OK:
		return refused, fmt.Errorf("%w: %s %s", stmt.ErrNotAcquired, what.String(), stmt.HeldElsewhere)
	}
	return granted, nil
}

// judgeShared is judge for the answer to a try on a shared session,
// which its runner read in time (certain): a plain grant is granted, and
// judge, with the key's name it formats, is spared the common case.
func judgeShared(ctx context.Context, ok bool, err error, what namer) (verdict, error) {
	if err == nil && ok {
		return granted, nil
	}
	return judge(ctx, wait.Outcome{OK: ok, Err: err, Certain: true}, what, true, 0)
}

// unlockAnswer is the one rule book for the answer to an unlock of k on
// backend pid (err and released, as the statement gave them): nil when the
// server confirmed it there, and otherwise the call's error and whether the
// session is in doubt (it may still hold the lock, or ended at a moment no
// one can tell) and must end. A certain "not held" (false, on that
// backend) is an error wrapping stmt.ErrLockLost that touches that one lock:
// the critical section may not have been exclusive.
func unlockAnswer(p *Pool, k Key, pid int64, err error, released bool) (uncertain bool, _ error) {
	return unlockVerdict(namer{p: p, k: k}, pid, err, released)
}

// unlockVerdict is unlockAnswer for the lock named what.
func unlockVerdict(what namer, pid int64, err error, released bool) (uncertain bool, _ error) {
	switch {
	case err == nil && released:
		return false, nil
	case err == nil:
		return false, fmt.Errorf("%w: unlock of %s on backend %d found no such lock", stmt.ErrLockLost, what.String(), pid)
	case errors.Is(err, sql.ErrNoRows) || errors.Is(err, stmt.ErrSessionChanged):
		// No row: the statement ran on another backend than the one
		// granted the lock.
		return true, fmt.Errorf("%w: lock %s: %w", stmt.ErrLockLost, what.String(), stmt.SessionChanged(pid, 0))
	case errors.Is(err, sql.ErrConnDone) || !errors.Is(err, stmt.ErrAbandoned) && stmt.ConnectionBroken(err):
		// The session ended (terminated, restarted, cut off; database/sql
		// closes a connection its driver found broken) before the unlock:
		// the lock went with it, at a moment no one can tell.
		return true, fmt.Errorf("%w: %s: its session (backend %d) ended before the unlock: %w", stmt.ErrLockLost, what.String(), pid, err)
	}
	return true, fmt.Errorf("sqllock: unlock %s: %w (the session is discarded; the server releases the lock as it ends)", what.String(), err)
}

// settle turns the outcome of an acquisition of k on s, a dedicated
// session of the Pool's, into a Hold, or ends s: a ctx that ended,
// whatever the driver said (a cancelled wait can be granted, and some
// drivers report a cancelled statement as a success), or a failed
// statement, leave the outcome uncertain, and s is discarded (PostgreSQL
// releases every lock of a session that ends); a lock granted on a
// standby is released; a refused one gives s back to the pool. what names
// the call in errors.
func (p *Pool) settle(ctx context.Context, s *session, k Key, shared bool, into *Hold, o wait.Outcome, what namer) (*Hold, error) {
	v, err := judge(ctx, o, what, p.cfg.AllowStandby, 0)
	switch v {
	case refused:
		if o.Err == nil && !o.OK && !o.Standby {
			p.stats.contended.Add(1)
		}
		s.close() // confirmed: the session holds nothing; back to the pool as it came
		return nil, err
	case uncertain, stray:
		// A stray key is not looked for: the session, which holds
		// nothing else, ends.
		s.discard(errors.New("lock statement: " + err.Error()))
		return nil, err
	case unwanted:
		// Released as a lock on a session of its own is, then refused;
		// no Hold was handed out, so none is told or counted.
		if uncertain, rerr := s.unlock(k, shared); rerr != nil {
			if !uncertain {
				s.discard(rerr)
			}
			return nil, errors.Join(err, rerr)
		}
		s.close()
		return nil, err
	}
	s.ls.sent(o.Sent)
	h := newHold(into, s, k, shared)
	if h == nil {
		// Ended meanwhile (the keep-alive found it lost): what it took
		// went with it.
		return nil, stmt.LockError(what.String(), s.err())
	}
	p.stats.took(1)
	p.mon.addHeld(h)
	return h, nil
}
