package sqllock

import (
	"context"
	"database/sql"
	"sort"

	"github.com/sqllock/sqllock/internal/core"
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
	l *Locker
	o *core.Owned // its locks, on its one session (see core.Owned)
}

// Session pins a connection for a new Session. It checks that the server is
// not a standby (unless WithAllowStandby) in the same round trip that learns
// the backend pid. ctx bounds only this call.
func (l *Locker) Session(ctx context.Context) (*Session, error) {
	mustContext(ctx, "Locker.Session")
	o, err := l.pool.Open(ctx)
	if err != nil {
		return nil, err
	}
	return &Session{l: l, o: o}, nil
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
	return s.o.Lock(ctx, k.sqlKey())
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
	got, err := s.o.TryLock(ctx, sqlKeys(keys))
	if err != nil {
		return nil, err
	}
	return keysOf(got), nil
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
	return s.o.Unlock(sqlKeys(keys))
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
	return s.o.Close()
}

// Conn returns the pinned connection: the session that holds the locks.
// Statements of yours on it run as you run them; when the Session is lost
// (Done is closed), the connection is discarded as soon as the statement
// of yours on it, if any, returns. Once Conn was called, [Session.Close]
// closes the connection instead of giving it back to the pool: what your
// statements changed on the session (settings, temporary tables, prepared
// statements) never reaches the pool's other users.
func (s *Session) Conn() *sql.Conn {
	if s == nil {
		return nil
	}
	return s.o.Conn()
}

// PID returns the backend process id of the session.
func (s *Session) PID() int {
	if s == nil {
		return 0
	}
	return int(s.o.PID())
}

// Done returns a channel that is closed when the Session is closed or lost.
func (s *Session) Done() <-chan struct{} {
	if s == nil {
		return closedChan
	}
	return s.o.Done()
}

// Err returns nil while the Session is usable, ErrReleased after Close, and
// an error wrapping ErrLockLost once it is lost. It never waits for a call
// in progress.
func (s *Session) Err() error {
	if s == nil {
		return ErrReleased
	}
	return s.o.Err()
}

// Held returns the keys the Session holds, sorted. It never waits for a
// call in progress.
func (s *Session) Held() []Key {
	keys := keysOf(s.o.Held())
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	return keys
}
