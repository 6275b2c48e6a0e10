package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Locker takes session-level advisory locks through a *sql.DB, on
// sessions it keeps out of the pool while they hold locks: its exclusive
// locks share a few (at most 16, and at most a quarter of the pool's
// SetMaxOpenConns limit when it has one), and a lock that waited for a
// held key, a shared-mode lock, a semaphore permit and a [Session] each
// keep a session of their own (see [Locker.Lock], [WithDedicatedSessions]).
//
// A Locker is safe for concurrent use by many goroutines. It holds no
// resources of its own beyond its locks: a keep-alive goroutine runs only
// while locks are held, and stops when the last one is released.
type Locker struct {
	engine // db, the driver's statement mode, round trips (see acquire.go)
	cfg    config
	mon    *monitor

	// observers are told of every lock call and event: the logger (when
	// WithLogger was given), then those of WithObserver. See events.go.
	observers []Observer

	// stmts are the session-level statements, with the settings a lock
	// session needs (see orphan.go); pids, each connection's backend pid,
	// as last seen.
	stmts atomic.Pointer[statements] // set by the server check; see sql
	pids  connSet[int64]
	// idents, each connection's identity (see checkServer).
	idents connSet[ident]

	// share is the sessions shared by the Locker's exclusive locks, and
	// plain their statements (the settings are applied once per session).
	share sharing
	plain *statements

	// markBase and marks make the owner marks of its sessions (newMark).
	markBase string
	marks    atomic.Uint64

	serverMu sync.Mutex
	serverOK atomic.Bool  // set under serverMu: the server was checked and is supported
	major    atomic.Int32 // set with serverOK: the server's major version
	leased   atomic.Bool  // set with serverOK: lock sessions are leased (see lease.go)

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
	l := &Locker{engine: engine{db: db, mode: detectMode(db.Driver())}, cfg: cfg}
	l.trace = func(ctx context.Context, msg string, k Key, attrs ...slog.Attr) {
		l.log(ctx, slog.LevelDebug, msg, k, attrs...)
	}
	if logged {
		l.observers = append(l.observers, logObserver{l})
	}
	l.observers = append(l.observers, cfg.observers...)
	if l.mode == inlineKeys { // lib/pq (see detectMode)
		l.abandoned = &abandonSet{}
	}
	l.mon = newMonitor(l)
	l.plain = sqltext.Plain(l.mode)
	l.markBase = strconv.FormatUint(rand.Uint64(), 36)
	return l
}

// newMark returns an owner mark for a new lock session (see
// sqltext.Statements): unique to it, among every process's.
func (l *Locker) newMark() string {
	return l.markBase + "." + strconv.FormatUint(l.marks.Add(1), 36)
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
//
// The lock is taken on one of the few server sessions (at most 16) that
// the Locker shares among its exclusive locks, when the key is free; when
// it is held elsewhere, Lock waits on a session of its own (the shared
// session it tried on, when that carries no other lock) and keeps it.
// Either way the Lock is a handle of its own, and its fate is its
// session's (a session that ends loses every lock on it).
// [WithDedicatedSessions] gives every lock a session of its own; a
// [Session] holds locks on a session whose connection is the caller's to
// use.
func (l *Locker) Lock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.Lock")
	return l.acquire(ctx, k, 0, "")
}

// TryLock takes the exclusive lock k if no other session holds it, and
// otherwise returns an error matching [ErrNotAcquired] at once. Its other
// errors are those of [Locker.Lock].
func (l *Locker) TryLock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.TryLock")
	return l.acquire(ctx, k, kindTry, "")
}

// RLock takes the lock k in shared mode, waiting while another session holds
// it exclusively. Any number of sessions can share it. Errors are those of
// [Locker.Lock].
func (l *Locker) RLock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.RLock")
	return l.acquire(ctx, k, kindShared, "")
}

// TryRLock takes the lock k in shared mode if no session holds it
// exclusively, and otherwise returns an error matching [ErrNotAcquired].
func (l *Locker) TryRLock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.TryRLock")
	return l.acquire(ctx, k, kindTry|kindShared, "")
}

// Do runs fn while holding the exclusive lock k, waiting for it first as
// [Locker.Lock] does. The lock is released when fn returns or panics. fn's
// context is cancelled, with cause an error wrapping [ErrLockLost], if the
// lock is lost while fn runs: fn should then stop and return ctx.Err() (or
// context.Cause(ctx), which is the loss itself). Do returns the error of
// acquiring the lock, or fn's error combined with the unlock's in one error
// that matches both (a lost lock matches [ErrLockLost]). opts are this
// task's own settings ([WithHoldAtLeast]).
func (l *Locker) Do(ctx context.Context, k Key, fn func(ctx context.Context) error, opts ...DoOption) error {
	mustContext(ctx, "Locker.Do")
	c, err := newDoConfig(opts)
	if err != nil {
		return err
	}
	lk, err := l.Lock(ctx, k)
	if err != nil {
		return err
	}
	return lk.run(ctx, fn, c.holdAtLeast)
}

// TryDo runs fn while holding the exclusive lock k if it is free, the cron
// pattern: when another session holds k it returns
// (false, nil) at once without running fn. Otherwise it behaves like
// [Locker.Do] and returns ran = true.
func (l *Locker) TryDo(ctx context.Context, k Key, fn func(ctx context.Context) error, opts ...DoOption) (ran bool, err error) {
	mustContext(ctx, "Locker.TryDo")
	c, err := newDoConfig(opts)
	if err != nil {
		return false, err
	}
	lk, err := l.TryLock(ctx, k)
	if err != nil {
		if errors.Is(err, ErrNotAcquired) && ctx.Err() == nil {
			return false, nil
		}
		return false, err
	}
	return true, lk.run(ctx, fn, c.holdAtLeast)
}

// regName returns k's registry name, or "".
func (l *Locker) regName(k Key) string {
	n, _ := l.cfg.registry.name(k)
	return n
}

func (l *Locker) name(k Key) string {
	if n, ok := l.cfg.registry.name(k); ok {
		return fmt.Sprintf("%s %q", k, n)
	}
	return k.String()
}
