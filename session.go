package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Session holds many exclusive session-level locks on one pinned
// connection: a lock per job in a job queue, or a leader's many resources.
// TryLock and Unlock take or release any number of keys in one round
// trip; one keep-alive query per interval covers all of them.
//
// Every lock of a Session lives and dies with its one PostgreSQL session:
// when the Session is lost (the session ended, the server restarted, a
// blocking Lock was cancelled, an unlock found a key not held), all its locks
// are gone at once, Done is closed and Err wraps [ErrLockLost]; its
// connection is discarded.
//
// PostgreSQL keeps all locks of all sessions in one shared table of about
// max_locks_per_transaction × (max_connections + max_prepared_transactions)
// entries (6,400 with the defaults). A Session with thousands of keys uses
// that much of it; when it is full, TryLock returns [ErrLockTableFull],
// releases whatever the failed call took, and the Session keeps its earlier
// locks.
//
// A Session is safe for concurrent use; its calls run one at a time. After
// Close, its methods return [ErrReleased].
type Session struct {
	pinned          // its backend, state, err, Done (see pinned.go)
	c      *carrier // its server session, which owns the connection

	// calls serialises the Session's calls, and is held across their
	// round trips.
	calls callSlot

	// pinned's mu guards the fields below. It is never held across a round
	// trip, so that the keep-alive, Err and Held never wait for a call in
	// progress (a blocking Lock can wait for a long time).
	held      keySet // keys held now
	releasing keySet // keys whose unlock is under way
	sorted    []Key  // cache of Held(), nil when stale
}

// Session pins a connection for a new Session. It checks that the server is
// not a standby (unless WithAllowStandby) in the same round trip that learns
// the backend pid. ctx bounds only this call.
func (l *Locker) Session(ctx context.Context) (*Session, error) {
	mustContext(ctx, "Locker.Session")
	sent := monoNow()
	mark := l.newMark()
	conn, pid, id, err := l.pinSession(ctx, "session", mark)
	if err != nil {
		return nil, err
	}
	s := &Session{pinned: pinned{l: l, pid: pid, id: id, lease: l.newLease(sent)}, calls: make(callSlot, 1)}
	s.c = newOwned(l, conn, id, mark, pid, s.lease, s)
	l.mon.add(s)
	return s, nil
}

// Lock takes k, waiting while another session holds it; a key the Session
// already holds is not taken twice (Lock returns nil). A ctx with a
// deadline bounds the wait in the server, which ends it just before the
// deadline: Lock then returns an error matching [ErrNotAcquired] and
// context.DeadlineExceeded, and the Session keeps its locks. Because a
// wait the client gives up may still be granted, a ctx cancelled during the
// wait (or a deadline too close to call) ends the whole Session (all its
// locks are released by the server), with the same error. Prefer TryLock,
// or a deadline, in a Session whose other locks matter.
//
// While Lock waits, the keep-alive keeps watching the Session's other
// locks, and Err, Held and Done answer at once.
func (s *Session) Lock(ctx context.Context, k Key) error {
	mustContext(ctx, "Session.Lock")
	if err := k.valid(); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.end()
	if s.holds(k) {
		return nil
	}
	if err := ctx.Err(); err != nil { // nothing sent: the Session is intact
		return notAcquired(s.l.name(k), err)
	}
	// The engine's wait for a Session: one statement, visible to
	// PostgreSQL's deadlock detector (the Session holds other locks).
	var o outcome
	if err := s.c.withConn(func(conn *sql.Conn) error {
		o = s.l.waitOn(ctx, connWaiter{conn, s.l.abandoned, s.c.mark}, sessionLevel, s.l.sql(), 0, k, s.pid, waitOne)
		return o.err
	}); o.err == nil && err != nil {
		o.err = err // the session was ended before the wait began
	}
	// The Session's server was checked when it opened: a standby's answer
	// is not asked about again.
	switch v, err := judge(ctx, o, s.l.name(k), true, s.pid); {
	case v == uncertain && errors.Is(o.err, sql.ErrConnDone) && s.Err() != nil:
		return s.Err() // lost (by the keep-alive) before the wait began
	case v == refused:
		return err
	case v == uncertain:
		s.lose(err)
		if errors.Is(err, ErrSessionChanged) {
			return s.Err()
		}
		return err
	}
	if err := s.Err(); err != nil {
		// Granted to a session found lost during the wait: it goes, and
		// what it holds with it.
		return err
	}
	s.add([]Key{k})
	return nil
}

// TryLock tries to take every key in keys that no other session holds, in
// one round trip, and returns those the Session holds once it returns, in
// the order given: a key it already held is not taken twice, and is
// returned; a repeated key is returned once. With one key:
//
//	got, err := s.TryLock(ctx, k)
//	if err == nil && len(got) == 1 { ... }
//
// When the server's lock table is full it returns [ErrLockTableFull] and
// releases whatever this call took. A ctx already done returns an error matching [ErrNotAcquired] and leaves
// the Session as it was; a ctx that ends during the statement ends the
// Session, since what it took is then unknown.
func (s *Session) TryLock(ctx context.Context, keys ...Key) ([]Key, error) {
	mustContext(ctx, "Session.TryLock")
	for _, k := range keys {
		if err := k.valid(); err != nil {
			return nil, err
		}
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	defer s.end()
	if err := ctx.Err(); err != nil && len(keys) > 0 { // nothing sent: the Session is intact
		return nil, notAcquired(s.l.name(keys[0]), err)
	}
	want := s.notHeld(keys)
	if len(want) == 0 {
		return s.heldOf(keys), nil
	}
	query := func(q string, args []any, row func([]driver.Value) error) error {
		return s.c.queryRowsCtx(ctx, q, args, row)
	}
	took, err := many(s.l.mode, query, "pg_try_advisory_lock", s.pid, sqlKeys(want))
	if ctxEnded(ctx) || err != nil {
		return nil, s.tryLockManyFailed(ctx, want, err)
	}
	got := make([]Key, 0, len(want))
	for i, k := range want {
		if took[i] {
			got = append(got, k)
		}
	}
	s.add(got)
	s.l.stats.contended.Add(int64(len(want) - len(got)))
	return s.heldOf(keys), nil
}

// tryLockManyFailed settles a TryLock statement that failed (err) or
// whose ctx ended, and returns the error to report.
func (s *Session) tryLockManyFailed(ctx context.Context, want []Key, err error) error {
	switch {
	case errors.Is(err, sql.ErrConnDone) && s.Err() != nil:
		return s.Err() // lost (by the keep-alive) before the statement
	case ctxEnded(ctx):
		s.lose(fmt.Errorf("TryLock was cancelled: %w", ctxErr(ctx)))
		return notAcquired(s.l.name(want[0]), ctxErr(ctx))
	case errors.Is(err, ErrSessionChanged):
		s.lose(err)
		return s.Err()
	case sqlState(err) == "53200":
		// Session locks taken by the failed statement stay held: find and
		// release them, keeping the Session's earlier locks.
		if rerr := s.c.releaseStray(sqlKeys(want)); rerr != nil {
			s.lose(fmt.Errorf("after a full lock table: %w", rerr))
		}
		return fmt.Errorf("%w: TryLock of %d keys: %w", ErrLockTableFull, len(want), err)
	}
	s.lose(fmt.Errorf("TryLock failed: %w", err))
	return lockError(s.l.name(want[0]), err)
}

// Unlock releases keys in one round trip; a key given twice is released
// once. Each must be held by the Session: unlocking a key it does not hold
// is an error, and nothing happens on the server. When PostgreSQL does not
// confirm every unlock on the Session's backend, the Session is lost (and
// its connection discarded) and the error wraps [ErrLockLost]. Like
// Lock.Unlock, it ignores ctx's cancellation and is bounded by the unlock
// timeout.
func (s *Session) Unlock(ctx context.Context, keys ...Key) error {
	mustContext(ctx, "Session.Unlock")
	if err := s.begin(context.Background()); err != nil {
		return err
	}
	defer s.end()
	uniq, missing := s.heldOnce(keys)
	if missing != nil {
		return fmt.Errorf("sqllock: unlock %s: not held by this session", s.l.name(*missing))
	}
	if err := s.unlockKeys(uniq); err != nil {
		return err
	}
	return nil
}

// unlockKeys releases keys, which the session holds, in one statement, and
// forgets them; when an unlock is not confirmed on the Session's backend it
// loses the Session. The caller holds calls.
func (s *Session) unlockKeys(keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	s.markReleasing(keys)
	released := false
	defer func() { s.endRelease(keys, released) }()
	answers, err := many(s.l.mode, s.c.queryRows, "pg_advisory_unlock", s.pid, sqlKeys(keys))
	what, all := s.l.name(keys[0]), err == nil
	for i, ok := range answers {
		if !ok && all {
			what, all = s.l.name(keys[i]), false
		}
	}
	if len(keys) > 1 {
		what = fmt.Sprintf("%s (of %d keys)", what, len(keys))
	}
	// An unlock not confirmed on the Session's backend, certainly or not,
	// loses the whole Session: its locks live and die together.
	if _, uerr := unlockAnswer(what, s.pid, err, all); uerr != nil {
		s.lose(uerr)
		if errors.Is(uerr, ErrLockLost) {
			return s.Err()
		}
		return uerr
	}
	released = true
	return nil
}

// Close releases every lock the Session holds, confirming each unlock, and
// returns the connection to the pool, its settings as they came (or, when
// [Session.Conn] handed it out, closes it); when an unlock is not
// confirmed, the connection is discarded and the error wraps ErrLockLost.
// Close on a closed Session returns ErrReleased; on a lost one, its Err.
func (s *Session) Close(ctx context.Context) error {
	mustContext(ctx, "Session.Close")
	if s == nil {
		return ErrReleased
	}
	s.calls.lock()
	defer s.end()
	s.mu.Lock()
	state, err := s.state, s.err
	keys := make([]Key, 0, s.held.len())
	s.held.each(func(k Key) { keys = append(keys, k) })
	s.mu.Unlock()
	switch state {
	case stateReleased:
		return ErrReleased
	case stateLost:
		s.setReleased(err)
		return err
	}
	if err := s.unlockKeys(keys); err != nil {
		s.setReleased(s.Err())
		return err
	}
	s.l.mon.remove(s)
	s.settle(stateReleased, ErrReleased)
	return s.c.closeOwned()
}

// pinSession takes a connection of the pool for a Session: the server
// checked, the backend's pid learnt, and the lock session's settings
// applied, its owner mark mark, in one round trip once the server is
// known. what names the caller in errors.
func (l *Locker) pinSession(ctx context.Context, what, mark string) (*sql.Conn, int64, ident, error) {
	conn, err := getConn(ctx, l.db)
	if err != nil {
		return nil, 0, ident{}, fmt.Errorf("sqllock: %s: get connection: %w", what, err)
	}
	id, err := l.checkServer(ctx, conn)
	if err != nil {
		l.putBack(conn)
		return nil, 0, ident{}, err
	}
	var pid int64
	var standby bool
	q, args := l.sql().SessionSQL(mark)
	if err := queryRow(ctx, l.abandoned, conn, q, args, &pid, &standby, skip); err != nil || pid == 0 {
		if err == nil {
			err = foreignSession() // nothing was applied
		}
		// Its settings may be applied: not given back. (A statement the
		// Locker abandoned closes its connection as it returns: the
		// discard does not wait for it.)
		l.discard(conn, Key{}, what+": "+err.Error())
		return nil, 0, ident{}, fmt.Errorf("sqllock: %s: %w", what, err)
	}
	if standby && !l.cfg.allowStandby {
		l.closeSession(conn, pid)
		return nil, 0, ident{}, standbyError(what)
	}
	return conn, pid, id, nil
}

// closeSession sets the settings of a Session's connection back and gives
// it back to the pool; when that is not confirmed on backend pid, it
// discards the connection instead.
func (l *Locker) closeSession(conn *sql.Conn, pid int64) error {
	q, args := l.sql().ResetSQL(pid)
	if err := queryRow(l.unlockContext(), l.abandoned, conn, q, args, skip); err != nil {
		l.discard(conn, Key{}, "session settings not reset")
		return nil
	}
	return conn.Close()
}

// markPositions sets marks[i-1] for each position i (from 1) in v, a text
// array literal of integers such as "{2,5}", as a driver gives it.
func markPositions(v driver.Value, marks []bool) error {
	var lit string
	switch t := v.(type) {
	case string:
		lit = t
	case []byte:
		lit = string(t)
	default:
		return fmt.Errorf("sqllock: positions: %T", v)
	}
	lit = strings.TrimSuffix(strings.TrimPrefix(lit, "{"), "}")
	for lit != "" {
		num, rest, _ := strings.Cut(lit, ",")
		i, err := strconv.Atoi(num)
		if err != nil || i < 1 || i > len(marks) {
			return fmt.Errorf("sqllock: position %q out of range", num)
		}
		marks[i-1] = true
		lit = rest
	}
	return nil
}
