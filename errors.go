package sqllock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/core"
)

// Sentinel errors. Match them with [errors.Is]: the errors this package
// returns wrap them together with the underlying cause.
var (
	// ErrNotAcquired is returned by TryLock, TryRLock and the other
	// non-waiting calls when another session holds a conflicting lock, and by
	// every acquiring call whose context ended before the lock was granted;
	// in that case the error also matches the context's error
	// (context.Canceled or context.DeadlineExceeded). TryDo reports the
	// first case as (false, nil).
	ErrNotAcquired = stmt.ErrNotAcquired

	// ErrReleased is returned by the methods of a Lock (or Session) that was
	// already released, and by Unlock on a nil Lock.
	ErrReleased = stmt.ErrReleased

	// ErrLockLost is wrapped by Lock.Err, and by Unlock, when the lock is no
	// longer held although it was never released: the session died, the
	// server restarted, or the keep-alive found the lock gone.
	ErrLockLost = stmt.ErrLockLost

	// ErrStandby is returned by the acquiring calls when the server is a hot
	// standby (pg_is_in_recovery() is true): locks taken there do not
	// conflict with the primary's. Nothing is left held: a session-level
	// lock is released before returning, a transaction-level one is never
	// taken. WithAllowStandby turns the check off for a Locker's calls
	// (InTx among them); LockTx and kin always refuse a standby.
	ErrStandby = stmt.ErrStandby

	// ErrSessionChanged is returned, or wrapped by ErrLockLost, when a
	// statement on the pinned connection ran on a different backend than the
	// one that was granted the lock: a transaction-mode pooler (such as
	// PgBouncer with pool_mode=transaction) sits between the client and the
	// server. Use the transaction-scoped locks (LockTx, InTx) there.
	ErrSessionChanged = stmt.ErrSessionChanged

	// ErrDeadlock is returned when PostgreSQL aborts a lock wait because it
	// would deadlock (SQLSTATE 40P01).
	ErrDeadlock = stmt.ErrDeadlock

	// ErrLockTableFull is returned when the server's shared lock table is
	// exhausted (SQLSTATE 53200, "out of shared memory"); raise
	// max_locks_per_transaction or hold fewer locks at once.
	ErrLockTableFull = stmt.ErrLockTableFull

	// ErrUnsupportedServer is returned when the server does not implement
	// PostgreSQL advisory locks (for example CockroachDB, whose advisory
	// lock functions do not lock anything).
	ErrUnsupportedServer = stmt.ErrUnsupportedServer

	// ErrInvalidKey is returned by ParseKey for malformed text and by every
	// call given the zero Key.
	ErrInvalidKey = stmt.ErrInvalidKey

	// ErrNotLeader is returned by Election.Proclaim when the Election does
	// not lead: it was never elected, or its last term was resigned or
	// lost (the error then also matches ErrLockLost).
	ErrNotLeader = errors.New("sqllock: not the leader")

	// ErrClosed is returned, with ErrNotAcquired, by every lock call of a
	// Locker that is closing or closed (see [Locker.Close]); the Err of a
	// Lock that Close released matches it, with ErrReleased.
	ErrClosed = core.ErrClosed

	// ErrDuplicate is returned by Registry.Register when the name, or the
	// key, is already registered.
	ErrDuplicate = errors.New("sqllock: duplicate registry entry")
)

// mustContext panics when ctx is nil, naming call, the exported function
// or method given it: a nil context is a programmer's error, caught at the
// call before anything is sent or any state changes. Further down it would
// do harm: database/sql, given one, panics while holding its own mutex and
// leaves the whole *sql.DB stuck, and an Unlock would release the lock,
// then panic with its handle left in a false state.
func mustContext(ctx context.Context, call string) {
	if ctx == nil {
		panic("sqllock: " + call + " called with a nil context")
	}
}

// HeldError is the error of a lock that could not be taken, from a Locker
// made [WithHolders]: it says who held (or waited for) the key when the
// call gave up. It matches [ErrNotAcquired], and the context's error when
// a wait ended, with errors.Is; get it with errors.As.
type HeldError struct {
	Key     Key
	Holders []HeldLock // holders first, then waiters; empty when they could not be read
	err     error
}

// Error implements error: the refusal, naming the first holder once, as
// in "sqllock: lock not acquired: 42 is held by pid 1234 (application
// "billing", idle) from 10.0.0.7 since 15:04:05", or a wait's end and
// "; held by" the holder. Of a session of another role (one whose query
// the server hides from this role), it gives only the backend: error
// strings end up in logs that other people read, and what another role
// names its sessions is not theirs to see there ([HeldError].Holders
// keeps every field).
func (e *HeldError) Error() string {
	msg := e.err.Error()
	for _, h := range e.Holders {
		if !h.Granted {
			continue
		}
		by := h.holder()
		if h.Hidden {
			by = fmt.Sprintf("backend %d, a session of another role", h.PID)
		}
		if rest, ok := strings.CutSuffix(msg, stmt.HeldElsewhere); ok {
			return rest + "is held by " + by // a refusal: "another session" named
		}
		if e.Key == (Key{}) {
			return msg + "; one slot held by " + by // a semaphore's
		}
		return msg + "; held by " + by
	}
	return msg
}

// Unwrap returns the refusal (which wraps ErrNotAcquired).
func (e *HeldError) Unwrap() error { return e.err }
