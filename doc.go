// Package sqllock makes PostgreSQL advisory locks safe to use from any
// database/sql application.
//
// An advisory lock is a lock on a number you choose (a [Key]): PostgreSQL
// only records who holds it. It lets a team say "only one of us runs this
// cron, migration or job" with nothing but PostgreSQL.
//
// # Lifecycle
//
// A [Locker] takes session-level locks through a *sql.DB:
//
//	locker := sqllock.New(db)
//	lk, err := locker.Lock(ctx, sqllock.Hash("cron:reindex_posts"))
//	if err != nil { ... }
//	defer lk.Unlock(ctx)
//
// A [Lock] lives on a session that the Locker keeps out of the pool while
// it holds locks: by default one of a few sessions (at most 16 per Locker)
// that its exclusive locks share; a session of its own for a lock that
// waited for a held key, a shared-mode lock, a semaphore permit, or any
// lock of a Locker made [WithDedicatedSessions]. A session goes back to
// the pool only after pg_advisory_unlock returned true for each of its
// locks, on the backend that was granted them. When that cannot be
// confirmed (an error, a cancellation, a false result, another backend)
// the session is discarded instead, and PostgreSQL releases its locks as
// the session ends. A Locker's callers that wait for one key queue inside
// it, in arrival order, and only the first waits in the server: many
// waiters cost no more sessions than the keys they wait for.
// [Lock.Done] and [Lock.Err] report a lock lost while held (the session
// died, the server restarted), found by a keep-alive that checks pg_locks
// from another connection. [Locker.Do] runs a function under the lock and
// always releases it; [Locker.TryDo] is the cron pattern ("if another run
// holds the lock, skip this one"). Both cancel the function's context when
// the lock is lost.
//
// A [Session] holds many locks on one pinned connection, taking or releasing
// any number of keys in one round trip ([Session.TryLock],
// [Session.Unlock]): a lock per job in a job queue.
//
// Transaction-level locks ([LockTx], [TryLockTx], [Locker.InTx]) are
// released by PostgreSQL when the transaction ends; they are the only
// advisory locks that work behind a transaction-mode pooler. [Inspect] lists
// the advisory locks of the current database with their keys decoded.
//
// # Not acquired
//
// Calls that return a handle ([Locker.Lock], [Locker.TryLock], ...) report
// a lock held elsewhere, or a context that ended first, as an error that
// matches [ErrNotAcquired] (and, for a context, ctx.Err() too). Calls that
// return a bool ([TryLockTx], [TryRLockTx], [Locker.TryDo]'s ran) report a
// lock held elsewhere as false with a nil error, and [Session.TryLock]
// leaves such a key out of the keys it returns; their errors are failures.
//
// # Errors
//
// Every error matches one of the package's Err variables with [errors.Is]
// when it has a meaning a caller can act on ([ErrNotAcquired],
// [ErrLockLost], [ErrDeadlock], ...); the message of the wrapping error says
// the details (the key, its registry name, the backend). Each variable's
// documentation says which calls return it.
//
// Misuse panics instead, at the call and before anything is sent: a nil
// *sql.DB given to [New], and a nil context given to any call that takes
// one (the panic names the call: "sqllock: Locker.Lock called with a nil
// context"). Use context.Background() or context.TODO() where no context
// is at hand.
//
// # The traps it prevents
//
// A forgotten unlock, a lock that rides back into the pool, a cancelled
// wait granted anyway, colliding keys, keys misread from pg_locks, locks
// on a standby or behind a transaction pooler: the repository's
// docs/traps.md says what each trap is and what this package does about
// it, in one place:
// https://github.com/sqllock/sqllock/blob/main/docs/traps.md
// (the guide beside it maps PostgreSQL's functions to this API:
// https://github.com/sqllock/sqllock/blob/main/docs/guide.md).
//
// A lock key is not a secret and not an authorization: any role in the
// database can take or wait on any key. Use namespaced keys per application.
//
// PostgreSQL's own documentation of advisory locks:
// https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS
// and of their functions:
// https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS
package sqllock
