package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// settle turns the outcome of an acquisition on conn, a connection of the
// Locker's, into a Lock, or ends it: a ctx that ended, whatever the driver
// said (a cancelled wait can be granted, and some drivers report a
// cancelled statement as a success), or a failed statement, leave the
// outcome uncertain, and the connection is discarded (PostgreSQL releases
// every lock of a session that ends); a lock granted on a standby is
// released; a refused one gives conn back to the pool. mark is the
// session's owner mark; what names the call in errors.
func (l *Locker) settle(ctx context.Context, conn *sql.Conn, id ident, st *statements, mark string, k Key, shared bool, o outcome, what string) (*Lock, error) {
	v, err := judge(ctx, o, what, l.cfg.allowStandby, 0)
	if v == refused && o.err != nil && !errors.Is(o.err, errDeadline) {
		// A lock statement that failed, even for a reason the server is
		// sure of, may have taken its key first (the settings it applies
		// come after the grant): the connection is not given back. (A
		// wait the server ended at ctx's deadline took nothing: the
		// engine asked the session.)
		v = uncertain
	}
	switch v {
	case refused:
		if o.err == nil && !o.ok && !o.standby {
			l.stats.contended.Add(1)
		}
		l.giveBack(conn, o) // confirmed: this session holds nothing
		return nil, err
	case uncertain:
		l.discard(conn, k, "lock statement: "+err.Error())
		return nil, err
	case unwanted:
		// Released as a lock on a session of its own is, then refused;
		// no Lock was handed out, so none is told or counted.
		c := newDedicated(l, conn, id, st, mark, o.pid, l.newLease(o.sent))
		if rerr := c.releaseKey(k, shared); rerr != nil {
			return nil, errors.Join(err, rerr)
		}
		return nil, err
	}
	lk := newLock(newDedicated(l, conn, id, st, mark, o.pid, l.newLease(o.sent)), k, shared)
	l.stats.took(1)
	l.mon.add(lk)
	return lk, nil
}

// verdict is what the outcome of an acquisition means for the session it
// ran on.
type verdict uint8

const (
	granted   verdict = iota // the session holds the lock
	refused                  // certain: the session holds no more than before, and is intact
	unwanted                 // granted on a standby: to be released, and refused
	uncertain                // the session may hold the lock: it must end
)

// judge is the one rule book for the outcome o of an acquisition of the
// lock named what: it returns what o means for the session, and the
// call's error (nil when granted). Its owner applies the verdict: a
// connection of the Locker's is given back or discarded (settle), a
// Session keeps its locks or is lost, a transaction is rolled back by
// its caller (settleTx). A ctx that ended makes any answer uncertain but
// one read in time (o.certain: a cancelled wait can still be granted, and
// a driver can report a cancelled statement as a success); a failed
// statement is uncertain, but for the server's certain refusals (a
// deadlock victim, a full lock table: nothing was taken). standbyOK says
// a standby's grant counts (WithAllowStandby, or a session checked when
// it opened); pid, when not 0, is the backend that must have answered.
func judge(ctx context.Context, o outcome, what string, standbyOK bool, pid int64) (verdict, error) {
	switch {
	case errors.Is(o.err, errDeadline):
		// The server ended the wait at ctx's deadline: not granted.
		return refused, notAcquired(what, context.DeadlineExceeded)
	case ctxEnded(ctx) && !o.certain:
		err := notAcquired(what, ctxErr(ctx))
		if errors.Is(o.err, errAbandoned) {
			err = fmt.Errorf("%w (%w)", err, errAbandoned)
		}
		return uncertain, err
	case o.err != nil:
		if st := sqlState(o.err); st == "40P01" || st == "53200" {
			return refused, lockError(what, o.err)
		}
		return uncertain, lockError(what, o.err)
	case pid != 0 && o.pid != pid:
		return uncertain, sessionChanged(pid, o.pid)
	case o.standby && !standbyOK:
		if o.ok {
			return unwanted, standbyError("lock " + what)
		}
		return refused, standbyError("lock " + what)
	case !o.ok:
		return refused, fmt.Errorf("%w: %s "+heldElsewhere, ErrNotAcquired, what)
	}
	return granted, nil
}

// giveBack returns conn, which holds no lock, to the pool: as it came, its
// settings set back first when the outcome says it had them (o.tuned).
func (l *Locker) giveBack(conn *sql.Conn, o outcome) {
	if o.tuned {
		l.closeSession(conn, o.pid)
		return
	}
	conn.Close()
}
