package sqllock

import "errors"

// Sentinel errors. Match them with [errors.Is]: the errors this package
// returns wrap them together with the underlying cause.
var (
	// ErrNotAcquired is returned by TryLock, TryRLock and the other
	// non-waiting calls when another session holds a conflicting lock, and by
	// every acquiring call whose context ended before the lock was granted;
	// in that case the error also matches the context's error
	// (context.Canceled or context.DeadlineExceeded). TryDo reports the
	// first case as (false, nil).
	ErrNotAcquired = errors.New("sqllock: lock not acquired")

	// ErrReleased is returned by the methods of a Lock (or Session) that was
	// already released, and by Unlock on a nil Lock.
	ErrReleased = errors.New("sqllock: lock already released")

	// ErrLockLost is wrapped by Lock.Err, and by Unlock, when the lock is no
	// longer held although it was never released: the session died, the
	// server restarted, or the keep-alive found the lock gone.
	ErrLockLost = errors.New("sqllock: lock lost")

	// ErrStandby is returned by the acquiring calls when the server is a hot
	// standby (pg_is_in_recovery() is true): locks taken there do not
	// conflict with the primary's. The lock is released before returning.
	// WithAllowStandby turns the check off.
	ErrStandby = errors.New("sqllock: server is a standby; its advisory locks do not conflict with the primary's")

	// ErrSessionChanged is returned, or wrapped by ErrLockLost, when a
	// statement on the pinned connection ran on a different backend than the
	// one that was granted the lock: a transaction-mode pooler (such as
	// PgBouncer with pool_mode=transaction) sits between the client and the
	// server. Use the transaction-scoped locks (LockTx, InTx) there.
	ErrSessionChanged = errors.New("sqllock: backend session changed under the connection (transaction-mode pooler?); session locks are unsafe here, use LockTx or InTx")

	// ErrDeadlock is returned when PostgreSQL aborts a lock wait because it
	// would deadlock (SQLSTATE 40P01).
	ErrDeadlock = errors.New("sqllock: deadlock detected")

	// ErrLockTableFull is returned when the server's shared lock table is
	// exhausted (SQLSTATE 53200, "out of shared memory"); raise
	// max_locks_per_transaction or hold fewer locks at once.
	ErrLockTableFull = errors.New("sqllock: server lock table is full")

	// ErrUnsupportedServer is returned when the server does not implement
	// PostgreSQL advisory locks (for example CockroachDB, whose advisory
	// lock functions do not lock anything).
	ErrUnsupportedServer = errors.New("sqllock: server does not support PostgreSQL advisory locks")

	// ErrInvalidKey is returned by ParseKey for malformed text and by every
	// call given the zero Key.
	ErrInvalidKey = errors.New("sqllock: invalid key")

	// ErrDuplicate is returned by Registry.Register when the name, or the
	// key, is already registered.
	ErrDuplicate = errors.New("sqllock: duplicate registry entry")
)
