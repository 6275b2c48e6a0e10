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
// Each [Lock] pins one connection of the pool for its whole life and gives
// it back only after pg_advisory_unlock returned true on the backend that
// was granted the lock. When that cannot be confirmed (an error, a
// cancellation, a false result, another backend) the connection is
// discarded instead, and PostgreSQL releases the lock as the session ends.
// [Lock.Done] and [Lock.Err] report a lock lost while held (the session
// died, the server restarted), found by a keep-alive that checks pg_locks
// from another connection. [Locker.Do] runs a function under the lock and
// always releases it; [Locker.TryDo] is the cron pattern ("if another run
// holds the lock, skip this one"). Both cancel the function's context when
// the lock is lost.
//
// A [Session] holds many locks on one pinned connection, taking or releasing
// any number of keys in one round trip ([Session.TryLockMany],
// [Session.UnlockMany]): a lock per job in a job queue.
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
// return a bool ([TryLockTx], [TryRLockTx], [Session.TryLock],
// [Locker.TryDo]'s ran) report a lock held elsewhere as false with a nil
// error; their errors are failures.
//
// # Errors
//
// Every error matches one of the sentinels of errors.go with [errors.Is]
// when it has a meaning a caller can act on ([ErrNotAcquired],
// [ErrLockLost], [ErrDeadlock], ...); the message of the wrapping error says
// the details (the key, its registry name, the backend).
//
// # The traps it prevents
//
//   - A forgotten unlock: Do and TryDo always release; Unlock is safe to
//     defer and to call twice, on a nil Lock, and with a cancelled context.
//   - A lock that rides back into the pool: a Lock pins its connection and
//     returns it only after a confirmed unlock (the poolguard package catches
//     locks taken by hand).
//   - A cancelled wait that is granted anyway: the outcome is never guessed;
//     the connection is discarded and the error matches both
//     [ErrNotAcquired] and the context's error.
//   - Scattered, colliding keys: [Hash] gives 64-bit keys from names, and a
//     [Registry] refuses two names for one key.
//   - Keys decoded wrongly from pg_locks: Inspect rebuilds bigint keys from
//     classid and objid.
//   - Standbys and transaction poolers: locks on a standby fail with
//     [ErrStandby]; a backend that changes under a lock gives
//     [ErrSessionChanged]; servers without real advisory locks give
//     [ErrUnsupportedServer].
//
// A lock key is not a secret and not an authorization: any role in the
// database can take or wait on any key. Use namespaced keys per application.
//
// PostgreSQL's own documentation of advisory locks:
// https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS
// and of their functions:
// https://www.postgresql.org/docs/current/functions-admin.html#FUNCTIONS-ADVISORY-LOCKS
package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Locker takes session-level advisory locks through a *sql.DB. Each lock
// pins one connection of the pool for its whole life (see [Lock]).
//
// A Locker is safe for concurrent use by many goroutines. It holds no
// resources of its own beyond its locks: a keep-alive goroutine runs only
// while locks are held, and stops when the last one is released.
type Locker struct {
	db   *sql.DB
	cfg  config
	mode stmtMode
	mon  *monitor

	// observers are told of every lock call and event: the logger (when
	// WithLogger was given), then those of WithObserver. See events.go.
	observers []Observer

	// abandoned is non-nil for drivers that do not give up a read when its
	// context ends (lib/pq): their statements are bounded by boundedRaw,
	// and it holds the connections left to finish alone.
	abandoned *abandonSet

	// stmts are the session-level statements, with the settings a lock
	// session needs (see orphan.go); pids, each connection's backend pid,
	// as last seen.
	stmts atomic.Pointer[statements] // set by the server check; see sql
	pids  connSet

	slice atomic.Pointer[string] // see waitSlice

	serverMu sync.Mutex
	serverOK atomic.Bool // set under serverMu: the server was checked and is supported

	epochMu    sync.Mutex
	epochCtx   context.Context // guarded by epochMu: see unlockContext
	epochUntil time.Time       // guarded by epochMu

	stats lockerStats
}

// New returns a Locker that takes its locks through db.
//
// Defaults: keep-alive every 5 s, orphan bound 30 s, unlock bounded to
// 5 s, no logging, no registry, standbys refused, keys bound as parameters
// (rendered into the SQL text for lib/pq). New panics if db is nil, and on
// options that no Locker can use, with the error [CheckOptions] returns for
// them (a negative duration, an orphan bound out of range, or a
// keep-alive and an orphan bound, both given, that break the rule that a
// cut-off holder is told before the server frees its lock: see
// [WithOrphanBound]). A single setting never makes New panic: the other
// adapts to it. A program that reads its settings from a configuration
// calls CheckOptions first.
func New(db *sql.DB, opts ...Option) *Locker {
	if db == nil {
		panic("sqllock: New called with a nil *sql.DB (was the error of sql.Open ignored? It fails when no driver of that name is registered: import one, such as _ \"github.com/jackc/pgx/v5/stdlib\")")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		panic(err.Error())
	}
	logged := cfg.logger != nil
	if !logged {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	l := &Locker{db: db, cfg: cfg, mode: detectMode(db.Driver())}
	if logged {
		l.observers = append(l.observers, logObserver{l})
	}
	l.observers = append(l.observers, cfg.observers...)
	if l.mode == inlineKeys { // lib/pq (see detectMode)
		l.abandoned = &abandonSet{}
	}
	l.mon = newMonitor(l)
	return l
}

// Lock takes the exclusive lock k, waiting (in the server) as long as
// another session holds it. The wait never fails or blocks the holder's
// CREATE INDEX CONCURRENTLY (and its kin), which waits for old snapshots:
// it is made of statements shorter than the server's deadlock_timeout, one
// after the other, so a session-level lock_timeout does not bound it (use
// ctx). When ctx ends first, it returns an error that
// matches both [ErrNotAcquired] and ctx.Err(), and no lock stays held. Other
// errors: [ErrLockTableFull], [ErrStandby],
// [ErrUnsupportedServer], [ErrInvalidKey], and connection errors.
func (l *Locker) Lock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, 0)
}

// TryLock takes the exclusive lock k if no other session holds it, and
// otherwise returns an error matching [ErrNotAcquired] at once. Its other
// errors are those of [Locker.Lock].
func (l *Locker) TryLock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, kindTry)
}

// RLock takes the lock k in shared mode, waiting while another session holds
// it exclusively. Any number of sessions can share it. Errors are those of
// [Locker.Lock].
func (l *Locker) RLock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, kindShared)
}

// TryRLock takes the lock k in shared mode if no session holds it
// exclusively, and otherwise returns an error matching [ErrNotAcquired].
func (l *Locker) TryRLock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, kindTry|kindShared)
}

// Do runs fn while holding the exclusive lock k, waiting for it first as
// [Locker.Lock] does. The lock is released when fn returns or panics. fn's
// context is cancelled, with cause an error wrapping [ErrLockLost], if the
// lock is lost while fn runs: fn should then stop and return ctx.Err() (or
// context.Cause(ctx), which is the loss itself). Do returns the error of
// acquiring the lock, or fn's error combined with the unlock's in one error
// that matches both (a lost lock matches [ErrLockLost]).
func (l *Locker) Do(ctx context.Context, k Key, fn func(ctx context.Context) error) error {
	lk, err := l.Lock(ctx, k)
	if err != nil {
		return err
	}
	return lk.run(ctx, fn)
}

// TryDo runs fn while holding the exclusive lock k if it is free, the cron
// pattern: when another session holds k it returns
// (false, nil) at once without running fn. Otherwise it behaves like
// [Locker.Do] and returns ran = true.
func (l *Locker) TryDo(ctx context.Context, k Key, fn func(ctx context.Context) error) (ran bool, err error) {
	lk, err := l.TryLock(ctx, k)
	if err != nil {
		if errors.Is(err, ErrNotAcquired) && ctx.Err() == nil {
			return false, nil
		}
		return false, err
	}
	return true, lk.run(ctx, fn)
}

// regName returns k's registry name, or "".
func (l *Locker) regName(k Key) string {
	n, _ := l.cfg.registry.Name(k)
	return n
}

func (l *Locker) name(k Key) string {
	if n, ok := l.cfg.registry.Name(k); ok {
		return fmt.Sprintf("%s %q", k, n)
	}
	return k.String()
}

// run calls fn with a context that ends when ctx does or the lock is lost,
// then unlocks, even if fn panics.
func (lk *Lock) run(ctx context.Context, fn func(context.Context) error) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.context(), func() { cancel(lk.Err()) })
	defer func() {
		stop()
		cancel(nil)
		if w := lk.l.cfg.holdAtLeast; w > 0 && time.Since(lk.since) < w {
			if uerr := lk.UnlockAfter(w); uerr != nil && !errors.Is(uerr, ErrReleased) {
				err = runError(err, uerr)
			}
			return
		}
		err = runError(err, lk.Unlock(ctx))
	}()
	return fn(fctx)
}

// runError combines fn's error with the unlock's into one error that reads
// once and matches both with errors.Is. fn usually returns its context's
// error, or the cause (the very error Unlock returns), once a lost lock
// cancelled it.
func runError(fnErr, unlockErr error) error {
	switch {
	case unlockErr == nil:
		return fnErr
	case fnErr == nil || errors.Is(fnErr, unlockErr):
		return unlockErr
	case errors.Is(fnErr, context.Canceled) && errors.Is(unlockErr, ErrLockLost):
		return fmt.Errorf("%w (fn returned: %w)", unlockErr, fnErr)
	}
	return fmt.Errorf("%w; then %w", fnErr, unlockErr)
}
