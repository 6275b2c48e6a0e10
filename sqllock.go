package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/core"
)

// Locker takes session-level advisory locks through a *sql.DB, on
// sessions it keeps out of the pool while they hold locks: its exclusive
// locks share a few (at most 16, and at most a quarter of the pool's
// SetMaxOpenConns limit when it has one), and a lock that waited for a
// held key, a shared-mode lock, a semaphore permit and a [Session] each
// keep a session of their own (see [Locker.Lock], [WithDedicatedSessions]).
// Its callers that wait for one key queue inside it, in arrival order (see
// [Locker.Lock]).
//
// A Locker is safe for concurrent use by many goroutines. It holds no
// resources of its own beyond its locks: a keep-alive goroutine runs only
// while locks are held, and stops when the last one is released.
type Locker struct {
	pool *core.Pool // the session core: sessions, queues, keep-alive
	db   *sql.DB
	cfg  config

	// observers are told of every lock call and event: the logger (when
	// WithLogger was given), then those of WithObserver. See events.go.
	observers []Observer

	stats lockerStats // what the core does not count (see Stats)

	// windows are the Locks whose hold window is open (see
	// Lock.UnlockAfter), by their Hold: a loss ends the window.
	windows sync.Map // *core.Hold → *Lock

	closed atomic.Bool // Close was called
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
	l := &Locker{db: db, cfg: cfg}
	if logged {
		l.observers = append(l.observers, logObserver{l})
	}
	l.observers = append(l.observers, cfg.observers...)
	l.pool = core.NewPool(db, core.Config{KeepAlive: cfg.keepAlive, OrphanBound: cfg.orphanBound, UnlockTimeout: cfg.unlockTimeout,
		AppName: cfg.appName, AllowStandby: cfg.allowStandby, Dedicated: cfg.dedicated, TxPooler: cfg.txPooler}, hooks{l})
	return l
}

// Close ends the Locker, so that a program that shuts down leaves nothing
// behind: no new lock is taken (every lock call returns an error matching
// [ErrNotAcquired] and [ErrClosed]), and the calls that wait for a lock
// leave their queues at once, with that error. Then Close waits out the
// hold windows that are open ([WithHoldAtLeast], [Lock.UnlockAfter]) for
// as long as ctx allows, and releases their locks at once when ctx ends
// first: pass a context that is already done to end them now. Then it
// releases every lock the Locker still holds (its Locks, Sessions,
// semaphore permits and election terms, whose Err then matches
// [ErrReleased] and [ErrClosed], and whose Done is closed: a [Locker.Do]
// whose task still runs sees its context end), confirming each unlock as
// [Lock.Unlock] does, and gives its sessions back to the pool. Each
// unlock is bounded by the unlock timeout, whatever ctx.
//
// Close returns the errors of the releases that were not confirmed (each
// matches [ErrLockLost], or says why its session was discarded, which the
// server then releases). Calling Close again does nothing more, and
// returns nil. A program that exits without Close leaves nothing held
// either (its sessions end with it, and the server releases their locks),
// but cuts its hold windows short, and its waiters' places in line are
// given up only as the server notices.
func (l *Locker) Close(ctx context.Context) error {
	mustContext(ctx, "Locker.Close")
	if !l.closed.CompareAndSwap(false, true) {
		return nil
	}
	l.pool.StartClose()
	var open []*Lock
	l.windows.Range(func(_, v any) bool {
		open = append(open, v.(*Lock))
		return true
	})
	for _, lk := range open {
		select {
		case <-lk.Done():
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		for _, lk := range open {
			lk.Unlock(context.WithoutCancel(ctx)) // its window ends now
		}
	}
	return l.pool.Close()
}

// Lock takes the exclusive lock k, waiting as long as another session
// holds it. The wait never fails or blocks the holder's CREATE INDEX
// CONCURRENTLY (and its kin), which waits for old snapshots: it is made of
// statements shorter than the server's deadlock_timeout, one after the
// other, so a session-level lock_timeout does not bound it (use ctx). When
// ctx ends first, it returns an error that matches both [ErrNotAcquired]
// and ctx.Err(), and no lock stays held. Other errors: [ErrLockTableFull],
// [ErrStandby], [ErrUnsupportedServer], [ErrInvalidKey], and connection
// errors.
//
// The Locker's callers that wait for one key queue inside it, in arrival
// order: only the first waits in the server, on a session of its own (the
// shared session it tried on, when that carries no other lock), and the
// others hold no session. When one of them releases the key with a caller
// queued, the key goes to that caller without a round trip, for at most
// 10 ms after the server last granted it to the Locker; then the release
// goes to the server, where a waiter of another process queued meanwhile
// is served first.
//
// The lock is taken on one of the few server sessions (at most 16) that
// the Locker shares among its exclusive locks, when the key is free; when
// it is held elsewhere, Lock waits on a session of its own and keeps it.
// Either way the Lock is a handle of its own, and its fate is its
// session's (a session that ends loses every lock on it).
// [WithDedicatedSessions] gives every lock a session of its own; a
// [Session] holds locks on a session whose connection is the caller's to
// use.
func (l *Locker) Lock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.Lock")
	return l.acquire(ctx, k, false, false, "")
}

// TryLock takes the exclusive lock k if no other session holds it, and
// otherwise returns an error matching [ErrNotAcquired] at once. Its other
// errors are those of [Locker.Lock].
func (l *Locker) TryLock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.TryLock")
	return l.acquire(ctx, k, false, true, "")
}

// RLock takes the lock k in shared mode, waiting while another session holds
// it exclusively. Any number of sessions can share it. Errors are those of
// [Locker.Lock].
func (l *Locker) RLock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.RLock")
	return l.acquire(ctx, k, true, false, "")
}

// TryRLock takes the lock k in shared mode if no session holds it
// exclusively, and otherwise returns an error matching [ErrNotAcquired].
func (l *Locker) TryRLock(ctx context.Context, k Key) (*Lock, error) {
	mustContext(ctx, "Locker.TryRLock")
	return l.acquire(ctx, k, true, true, "")
}

// Do runs fn while holding the exclusive lock k, waiting for it first as
// [Locker.Lock] does. The lock is released when fn returns or panics. fn's
// context is cancelled, with cause an error wrapping [ErrLockLost], if the
// lock is lost while fn runs: fn should then stop and return ctx.Err() (or
// context.Cause(ctx), which is the loss itself). Do returns the error of
// acquiring the lock, or fn's error combined with the unlock's in one error
// that matches both (a lost lock matches [ErrLockLost]). opts are this
// task's own settings: a hold window ([WithHoldAtLeast]) and an upper
// bound ([WithHoldAtMost]).
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
	return lk.run(ctx, fn, c)
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
	return true, lk.run(ctx, fn, c)
}

// acquire implements the four session-level lock calls, and an election
// candidate's (named: its value, the name its session carries; "" for
// others).
func (l *Locker) acquire(ctx context.Context, k Key, shared, try bool, named string) (lk *Lock, err error) {
	if err := k.valid(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, stmt.NotAcquired(l.name(k), err) // nothing sent
	}
	if len(l.observers) > 0 { // nothing is built on the hot path unless someone listens
		if end := l.startAcquire(ctx, Acquisition{Key: k, Name: l.regName(k), Wait: !try, Shared: shared}); end != nil {
			defer func() { end(lk, err) }()
		}
	}
	lk = &Lock{l: l, key: k}
	h, err := l.pool.Acquire(ctx, core.Request{Key: k.sqlKey(), Shared: shared, Try: try, Named: named, Into: &lk.own})
	if err != nil {
		if l.cfg.holders && errors.Is(err, ErrNotAcquired) && !errors.Is(err, stmt.ErrAbandoned) {
			// Also when ctx ended during the call (not before it: then
			// nothing is sent): the holders are asked on a context of
			// their own.
			err = l.withHolders(k, err)
		}
		return nil, err
	}
	lk.h = h // &lk.own
	return lk, nil
}

// withHolders wraps the refusal err of k in a HeldError that says who
// holds k, or the keys given (a semaphore's slots; k is then the zero
// Key): one query, bounded to a second; without them on failure.
func (l *Locker) withHolders(k Key, err error, keys ...Key) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if len(keys) == 0 {
		keys = []Key{k}
	}
	hs, herr := Inspect(ctx, l.db, l.cfg.registry, keys...)
	if herr != nil {
		hs = nil
	}
	sort.SliceStable(hs, func(i, j int) bool { return hs[i].Granted && !hs[j].Granted })
	return &HeldError{Key: k, Holders: hs, err: err}
}

// hooks are what the Locker's core tells it (see core.Hooks).
type hooks struct{ l *Locker }

func (h hooks) Name(k core.Key) string { return h.l.name(keyOf(k)) }

func (h hooks) Log(ctx context.Context, level slog.Level, msg string, k core.Key, keyed bool, attrs ...slog.Attr) {
	kk := Key{}
	if keyed {
		kk = keyOf(k)
	}
	h.l.log(ctx, level, msg, kk, attrs...)
}

// Event tells the observers of e, which the core counted in Stats; a lost
// lock's hold window ends first.
func (h hooks) Event(e core.Event) {
	if e.Kind == core.EventLost && e.Hold != nil {
		if lk, ok := h.l.windows.Load(e.Hold); ok {
			lk.(*Lock).closeLostWindow()
		}
	}
	ev := Event{PID: int(e.PID), Held: e.Held, Duration: e.Duration, Err: e.Err}
	switch e.Kind {
	case core.EventLost:
		ev.Kind = EventLost
	case core.EventDiscarded:
		ev.Kind = EventDiscarded
	case core.EventKeepAlive:
		ev.Kind = EventKeepAlive
	}
	if e.Keyed {
		ev.Key = keyOf(e.Key)
		ev.Name = h.l.regName(ev.Key)
	}
	h.l.tell(context.Background(), ev)
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
