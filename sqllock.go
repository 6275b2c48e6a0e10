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

	// abandoned is non-nil for drivers that do not give up a read when its
	// context ends (lib/pq): their statements are bounded by boundedRaw,
	// and it holds the connections left to finish alone.
	abandoned *abandonSet

	// settings is the FROM clause that applies the orphan bound to a
	// lock's session ("" when off); tuned, the connections that have it.
	// See orphan.go.
	settings string
	tuned    tunedSet
	suffix   func(dc any) string // l.settingsFor, bound once
	tunedAdd func(dc any)        // l.tuned.add, bound once

	serverMu sync.Mutex
	serverOK bool // guarded by serverMu: the server was checked and is supported

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
// options that break the rule that a cut-off holder is told before the
// server frees its lock (see [WithOrphanBound]).
func New(db *sql.DB, opts ...Option) *Locker {
	if db == nil {
		panic("sqllock: New called with a nil *sql.DB (was the error of sql.Open ignored? It fails when no driver of that name is registered: import one, such as _ \"github.com/jackc/pgx/v5/stdlib\")")
	}
	cfg := config{keepAlive: DefaultKeepAlive, unlockTimeout: DefaultUnlockTimeout, orphanBound: DefaultOrphanBound}
	for _, o := range opts {
		o.apply(&cfg)
	}
	checkBounds(cfg.keepAlive, cfg.orphanBound)
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	l := &Locker{db: db, cfg: cfg, mode: detectMode(db.Driver())}
	if l.mode == inlineKeys { // lib/pq (see detectMode)
		l.abandoned = &abandonSet{}
	}
	var exprs []string
	if cfg.orphanBound > 0 {
		exprs = settingsFor(cfg.orphanBound).exprs()
	}
	if cfg.appName != "" {
		exprs = append(exprs, appNameExpr(cfg.appName))
	}
	if l.settings = settingsClause(exprs); l.settings != "" {
		l.suffix, l.tunedAdd = l.settingsFor, l.tuned.add
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

// withHolders wraps the refusal err of k in a HeldError that says who
// holds k (one query, bounded to a second; without it on failure).
func (l *Locker) withHolders(k Key, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	hs, herr := Holders(ctx, l.db, k)
	if herr != nil {
		hs = nil
	}
	for i := range hs {
		hs[i].Name, _ = l.cfg.registry.Name(k)
	}
	return &HeldError{Key: k, Holders: hs, err: err}
}

// log sends an event about key k (the zero Key: none) to the logger, if it
// takes events of that level.
func (l *Locker) log(ctx context.Context, level slog.Level, msg string, k Key, attrs ...slog.Attr) {
	if !l.cfg.logger.Enabled(ctx, level) {
		return
	}
	if k.valid() == nil {
		attrs = append([]slog.Attr{slog.String("key", l.name(k))}, attrs...)
	}
	l.cfg.logger.LogAttrs(ctx, level, msg, attrs...)
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

// acquireAttempts is how many connections acquire tries when the one it got
// turns out to be dead (after a server restart, idle pooled connections
// are). Retrying is safe: a session whose connection broke holds nothing.
const acquireAttempts = 3

// acquire implements the four session-level lock calls.
func (l *Locker) acquire(ctx context.Context, k Key, kind lockKind) (lk *Lock, err error) {
	if err := k.valid(); err != nil {
		return nil, err
	}
	if end := l.observeAcquire(ctx, Acquisition{Key: k, Name: l.regName(k), Wait: !kind.try(), Shared: kind.shared()}); end != nil {
		defer func() { end(lk, err) }()
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, notAcquired(l.name(k), err)
		}
		lk, err := l.acquireOnce(ctx, k, kind, start)
		if err == nil || attempt == acquireAttempts || !connectionBroken(err) || ctxEnded(ctx) {
			if err != nil && l.cfg.holders && errors.Is(err, ErrNotAcquired) {
				err = l.withHolders(k, err)
			}
			return lk, err
		}
	}
}

func (l *Locker) acquireOnce(ctx context.Context, k Key, kind lockKind, start time.Time) (*Lock, error) {
	shared := kind.shared()
	conn, err := l.db.Conn(ctx)
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
	// Every call starts with the non-waiting function: an uncontended lock
	// costs one round trip either way, and a wait then knows its backend's
	// pid, which settles a cancelled wait (see cancelWait).
	q, args := l.mode.sessionLockSQL(kind|kindTry, k)
	var ok, standby bool
	var pid int64
	err = queryRowSuffix(ctx, l.abandoned, conn, q, l.suffix, l.tunedAdd, args, &ok, &pid, &standby)
	if err == nil && !ok && !kind.try() && !(standby && !l.cfg.allowStandby) {
		if l.cfg.logger.Enabled(ctx, slog.LevelDebug) {
			l.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "sqllock: waiting", slog.String("key", l.name(k)),
				slog.Bool("shared", shared), slog.Int64("pid", pid))
		}
		q, args = l.mode.waitSQL(kind&^kindTry, k)
		waitPID := pid
		for {
			err = queryRow(ctx, l.abandoned, conn, q, args, &ok, &pid, &standby)
			if err == nil || ctxEnded(ctx) {
				break
			}
			if st := sqlState(err); st != "55P03" && st != "40P01" {
				break
			}
			// The wait's slice ended (55P03), or, should the server's
			// deadlock_timeout have changed under it, PostgreSQL reported the
			// holder's CREATE INDEX CONCURRENTLY waiting for this statement's
			// snapshot as a deadlock (40P01): this session holds nothing but
			// its wait, so it is in no cycle of locks. Wait again, in a new
			// statement with a new snapshot.
			if sqlState(err) == "40P01" {
				l.stats.snapshotWaits.Add(1)
			}
		}
		if ctxEnded(ctx) {
			// The abandoned backend may still be queued for k (a driver
			// that closes the socket sends no cancel request): take it
			// out of the queue before anyone can grant it the lock.
			l.cancelWait(waitPID, k)
		}
	}
	if ctxEnded(ctx) {
		// Whatever the driver said, the outcome is uncertain: a cancelled
		// wait can be granted, and some drivers report a cancelled statement
		// as a success. Ending the session settles it: PostgreSQL releases
		// every lock of a session that ends.
		l.discard(conn, k, "context ended during the lock statement")
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
	if l.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		l.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "sqllock: acquired", slog.String("key", l.name(k)),
			slog.Bool("shared", shared), slog.Int64("pid", pid), slog.Duration("wait", time.Since(start)))
	}
	return lk, nil
}
