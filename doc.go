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
// released by PostgreSQL when the transaction ends, and work behind any
// pooler; a Locker made [WithTransactionPooler] takes session-level locks
// behind a transaction-mode pooler. [Inspect] lists the advisory locks of
// the current database with their keys decoded.
//
// # Deadlines
//
// A wait ends when its context does, with an error that matches
// [ErrNotAcquired] and ctx.Err(); no lock stays held, even one PostgreSQL
// granted at the last moment. How each kind of wait keeps its deadline:
//
//   - On the Locker's own sessions ([Locker.Lock], [Locker.RLock],
//     [Locker.Do], [Semaphore.Acquire], [Session.Lock]), the wait asks
//     the server to end it (its own lock_timeout) shortly before the
//     deadline: a tenth of the time left, from 50 to 100 ms, and at least
//     three of the Locker's recent round trips (more after a wait whose
//     answer came too late). The answer "not granted" is then certain, the
//     connection goes back to the pool, and a Session keeps its other
//     locks. A Locker's waits ([Locker.Lock] and kin, a semaphore's, a
//     candidate's) then wait once more, until the deadline itself: a key
//     released within the margin is granted, and a call is never refused
//     while its context is live (it returns a round trip or so after the
//     deadline). An answer that a loaded machine delivers after the deadline
//     is still read for up to 250 ms: the call returns that late, with a
//     certain answer. An answer later still costs the session, and the
//     wait is taken out of the server's queue from another connection
//     before the call returns (on a server too loaded to answer, up to
//     2 s more). A lock_timeout set for a role or database does not end
//     these waits: each wait statement sets its own.
//   - The try that a waiting call sends first, whatever its context: a
//     try granted as the context ended is given back before the call
//     returns, which reports the key not acquired.
//   - A transaction's wait ([LockTx], [RLockTx], [Locker.InTx]) first
//     tries without waiting: a free key costs one round trip. Its wait
//     carries the deadline as its own lock_timeout, so it returns by the
//     deadline even when the driver's cancel never reached the server; a
//     shorter lock_timeout of the transaction's own still applies and ends
//     the wait with [ErrNotAcquired], and the transaction keeps its
//     setting. Under a context that can be cancelled and has no deadline,
//     it waits in slices of 2 s (or twice deadlock_timeout) inside a
//     savepoint, sqllock_wait: a cancel that never arrived costs at most a
//     slice.
//   - A call whose context has already ended sends nothing.
//
// PostgreSQL can grant a lock in the instant its lock_timeout fires, fail
// the statement, and keep the grant: after every such timeout, the
// session is asked, so that the lock is returned to the caller and never
// left on a pooled connection.
//
// # Arrival order
//
// Waiters of one key are served in the order they arrived, within a
// Locker and across processes.
//
// Within a Locker, the callers that wait for one key ([Locker.Lock],
// [Locker.RLock], [Locker.Do], an [Election]'s candidates; a
// [Semaphore]'s Acquire, one queue per semaphore) queue in Go, and only
// the first waits in the server, on a session of its own: W waiters on K
// keys cost at most K waiting sessions. A caller whose context ends leaves
// the queue at once. A [Locker.TryLock] is refused while the Locker's own
// callers wait for its key. A release with a caller of the same Locker
// queued hands the key to that caller without a round trip, for at most
// 10 ms after the server last granted it to the Locker; then the release
// goes to the server, where a waiter of another process is served first.
//
// Across processes, the server's clock orders the waiters. Each waiter of
// a Locker's queue takes a ticket in the key's line as it calls: an advisory
// lock on a pair key of the key's own class (a 31-bit hash of the key, top
// bit set) whose number is the server's clock in milliseconds. It rings
// the key's doorbell (the pair key (class, 0), taken shared), then waits
// only for the ticket just before its own, and, when none is left, for the
// key itself. The first waiter of the queue takes its ticket on a session
// of its own, where it waits. The callers queued behind it take theirs,
// in queue order, on one of the Locker's shared sessions, which costs them
// no session of their own; once first, each waits with it. With
// [WithDedicatedSessions] or [WithTransactionPooler], or a pool too small
// to share sessions, a queued caller takes its ticket once it is first.
// At most one waiter of all the processes waits on the key,
// and a release wakes exactly one. Every wait is a statement shorter than
// half the server's deadlock_timeout, so that a holder's CREATE INDEX
// CONCURRENTLY, which waits for older snapshots, is never held up by the
// waiters; the ticket keeps the waiter's place from one statement to the
// next. Granted, the waiter gives its ticket and doorbell back in the same
// statement. A waiter whose context ends gives them back; one that
// crashes, freezes or is cut off loses them with its session, which the
// server ends within the orphan bound ([WithOrphanBound]). Within a
// Locker, a release hands the key to the next goroutine only when a check
// found no waiter in line with an earlier ticket than that goroutine's (a
// goroutine without one: a check of the doorbell, sent after it queued,
// found no one in line).
//
// The line does not order waits that take no ticket: a program's own
// pg_advisory_lock waits in PostgreSQL's queue beside the line's first
// waiter, and can be served before waiters of the line that arrived
// earlier; a [Session]'s Lock and a transaction's wait are one statement
// in that queue too. A try takes a free key whoever waits. Tickets are
// advisory locks: [Inspect] reports each as a waiter for its key, since
// its arrival. Two keys whose classes collide (one chance in 2^31 for a
// given pair) share a line, which only orders their waiters together.
//
// The line's tags are pair keys of negative classes, which any program can
// take. A backend that holds a ticket but does not ring the doorbell is no
// waiter of the line, and no one waits for it. When the doorbell cannot be
// rung for a slice (a program holds it exclusively; a semaphore's first
// slot, should its class be the line's), or no ticket is free, a waiter
// waits for the key itself without a place in line: the line loses its
// order, never its progress, and the Locker logs a warning once.
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
