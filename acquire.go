package sqllock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// How a session-level lock is taken: the non-waiting function first (one
// round trip when the lock is free), then, for a waiting call, statements
// shorter than half the server's deadlock_timeout until it is granted; a
// wait whose context ended is taken out of the server's queue.

// withHolders wraps the refusal err of k in a HeldError that says who
// holds k, or the keys given (a semaphore's slots; k is then the zero
// Key): one query, bounded to a second; without them on failure.
func (l *Locker) withHolders(k Key, err error, keys ...Key) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if len(keys) == 0 {
		keys = []Key{k}
	}
	hs, herr := Inspect(ctx, l.db, WithKeys(keys...), WithRegistry(l.cfg.registry))
	if herr != nil {
		hs = nil
	}
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].Granted && !hs[j].Granted })
	return &HeldError{Key: k, Holders: hs, err: err}
}

// acquireAttempts is how many connections acquire tries when the one it got
// turns out to be dead (after a server restart, idle pooled connections
// are). Retrying is safe: a session whose connection broke holds nothing.
const acquireAttempts = 3

// acquire implements the four session-level lock calls.
func (l *Locker) acquire(ctx context.Context, k Key, kind lockKind) (lk *Lock, err error) {
	if err := k.valid(); err != nil {
		return nil, err
	}
	if end := l.startAcquire(ctx, Acquisition{Key: k, Name: l.regName(k), Wait: !kind.IsTry(), Shared: kind.IsShared()}); end != nil {
		defer func() { end(lk, err) }()
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, notAcquired(l.name(k), err)
		}
		lk, err := l.acquireOnce(ctx, k, kind, start)
		if err == nil || attempt == acquireAttempts || !connectionBroken(err) || ctxEnded(ctx) {
			if err != nil && l.cfg.holders && errors.Is(err, ErrNotAcquired) && !errors.Is(err, errAbandoned) {
				err = l.withHolders(k, err)
			}
			return lk, err
		}
	}
}

func (l *Locker) acquireOnce(ctx context.Context, k Key, kind lockKind, start time.Time) (*Lock, error) {
	shared := kind.IsShared()
	conn, err := getConn(ctx, l.abandoned, l.db)
	if err != nil {
		if ctxEnded(ctx) {
			return nil, notAcquired(l.name(k), ctxErr(ctx))
		}
		return nil, fmt.Errorf("sqllock: lock %s: get connection: %w", l.name(k), err)
	}
	if err := l.checkServer(ctx, conn); err != nil {
		conn.Close() // no lock statement ran on it
		if ctxEnded(ctx) {
			return nil, notAcquired(l.name(k), ctxErr(ctx))
		}
		return nil, err
	}
	// A wait must know its backend's pid, which settles a cancelled wait
	// (see cancelWait). On a connection that waited before (its pid is
	// known), a waiting call goes straight to waiting; otherwise every call
	// starts with the non-waiting function, which returns the pid: an
	// uncontended lock costs one round trip either way, a contended one two
	// the first time.
	var dc any
	var waitPID int64
	direct := false
	if !kind.IsTry() {
		dc = driverConnOf(conn)
		waitPID, direct = l.pids.get(dc)
	}
	var ok, standby bool
	var pid int64
	if !direct {
		q, args := l.sql().TrySQL(kind|kindTry, k.sqlKey())
		err = queryRow(ctx, l.abandoned, conn, q, args, &ok, &pid, &standby)
		if err == nil {
			waitPID = pid
		}
	}
	if direct || err == nil && !ok && !kind.IsTry() && !(standby && !l.cfg.allowStandby) {
		l.log(ctx, slog.LevelDebug, "sqllock: waiting", k, slog.Bool("shared", shared), slog.Int64("pid", waitPID))
		for {
			var slice string
			if slice, err = l.waitSlice(ctx, conn); err != nil {
				break
			}
			q, args := l.sql().WaitSQL(kind&^kindTry, k.sqlKey(), slice)
			err = queryRow(ctx, l.abandoned, conn, q, args, &ok, &pid, &standby)
			if err == nil || ctxEnded(ctx) {
				break
			}
			if st := sqlState(err); st != "55P03" && st != "40P01" {
				break
			}
			// The wait's slice ended (55P03), or, should the server's
			// deadlock_timeout have been lowered since the Locker read it
			// (it reads it again then), PostgreSQL reported the
			// holder's CREATE INDEX CONCURRENTLY waiting for this statement's
			// snapshot as a deadlock (40P01): this session holds nothing but
			// its wait, so it is in no cycle of locks. Wait again, in a new
			// statement with a new snapshot.
			if sqlState(err) == "40P01" {
				l.stats.snapshotWaits.Add(1)
				l.slice.Store(nil)
			}
		}
		if err == nil {
			l.pids.set(dc, pid)
		}
		if ctxEnded(ctx) && !errors.Is(err, errAbandoned) {
			// The abandoned backend may still be queued for k (a driver
			// that closes the socket sends no cancel request): take it
			// out of the queue before anyone can grant it the lock. (Not
			// when the server stopped answering: nothing would reach it.)
			l.cancelWait(waitPID, k)
		}
	}
	if ctxEnded(ctx) {
		// Whatever the driver said, the outcome is uncertain: a cancelled
		// wait can be granted, and some drivers report a cancelled statement
		// as a success. Ending the session settles it: PostgreSQL releases
		// every lock of a session that ends.
		l.discard(conn, k, "context ended during the lock statement")
		if errors.Is(err, errAbandoned) {
			return nil, fmt.Errorf("%w (%w)", notAcquired(l.name(k), ctxErr(ctx)), errAbandoned)
		}
		return nil, notAcquired(l.name(k), ctxErr(ctx))
	}
	if err != nil {
		l.discard(conn, k, "lock statement failed")
		return nil, lockError(l.name(k), err)
	}
	if standby && !l.cfg.allowStandby {
		if !ok {
			conn.Close() // confirmed: this session holds nothing
			return nil, standbyError("lock " + l.name(k))
		}
		if err := l.release(conn, k, shared, pid); err != nil {
			return nil, errors.Join(standbyError("lock "+l.name(k)), err)
		}
		return nil, standbyError("lock " + l.name(k))
	}
	if !ok {
		l.stats.contended.Add(1)
		conn.Close() // confirmed: this session holds nothing
		return nil, fmt.Errorf("%w: %s is held by another session", ErrNotAcquired, l.name(k))
	}
	lk := newLock(l, k, shared, conn, pid)
	l.stats.took(1)
	l.mon.add(lk)
	return lk, nil
}

// cancelWaitTimeout bounds cancelWait.
const cancelWaitTimeout = 2 * time.Second

// cancelWait takes backend pid, whose wait for k its client abandoned, out
// of k's queue, from another pooled connection, and waits (bounded) until
// it has left. Some drivers (pgx) close the socket of a cancelled statement
// without a cancel request; the backend then stays queued until it is
// granted the lock, and holds it until it notices that its client is gone.
// The wait statement may not even have started when the client gave up
// (it sits in the backend's socket buffer): cancelWait then watches the
// backend until it runs the statement (and cancels it), finishes it, or
// ends. It is best effort: when no connection can be had in time, the
// server still releases the lock as the abandoned session ends.
func (l *Locker) cancelWait(pid int64, k Key) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelWaitTimeout)
	defer cancel()
	for ctx.Err() == nil {
		var where int
		if err := l.db.QueryRowContext(ctx, sqltext.CancelWaitSQL, pid).Scan(&where); err != nil || where == 0 || where == 3 {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
