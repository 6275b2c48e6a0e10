package sqllock

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sqllock/sqllock/internal/core"
)

type config struct {
	keepAlive     time.Duration
	keepAliveSet  bool // given with WithKeepAlive
	orphanSet     bool // given with WithOrphanBound
	errs          []error
	unlockTimeout time.Duration
	logger        *slog.Logger
	registry      *Registry
	allowStandby  bool
	orphanBound   time.Duration
	appName       string
	holders       bool
	dedicated     bool
	txPooler      bool
	observers     []Observer
}

// Option configures a Locker (see [New] for the defaults).
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// defaultKeepAlive is the keep-alive's interval when [WithKeepAlive] is
// not given.
const defaultKeepAlive = 5 * time.Second

// defaultOrphanBound is how long the server keeps the lock of a holder that
// died or was cut off (see [WithOrphanBound]).
const defaultOrphanBound = 30 * time.Second

// defaultUnlockTimeout bounds an unlock when [WithUnlockTimeout] is not
// given.
const defaultUnlockTimeout = 5 * time.Second

// Limits of a Locker's settings.
const (
	// minKeepAlive and maxKeepAlive bound the keep-alive interval (see
	// core.MinKeepAlive).
	minKeepAlive = core.MinKeepAlive
	maxKeepAlive = core.MaxKeepAlive
	// maxUnlockTimeout is the longest unlock timeout: an unlock that a
	// server has not answered within an hour will not be answered, and
	// the unlock's context must stay representable (see the core's Pool.UnlockContext).
	maxUnlockTimeout = time.Hour
	// minOrphanBound and maxOrphanBound bound the orphan bound (see
	// core.MinOrphanBound).
	minOrphanBound = core.MinOrphanBound
	maxOrphanBound = core.MaxOrphanBound
	// maxHoldWindow is the longest hold window (WithHoldAtLeast,
	// Lock.UnlockAfter): a window need only outlast the skew of the
	// machines' clocks and schedulers, and a week covers every period.
	maxHoldWindow = 7 * 24 * time.Hour
)

// newConfig applies opts over the defaults and validates the result in
// one place: it returns the configuration, with the keep-alive and the
// orphan bound adapted to each other when only one was given, and the
// errors of values no Locker can use.
func newConfig(opts []Option) (config, error) {
	c := config{keepAlive: defaultKeepAlive, unlockTimeout: defaultUnlockTimeout, orphanBound: defaultOrphanBound}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	errs := c.errs
	switch {
	case c.keepAlive < 0:
		errs = append(errs, fmt.Errorf("sqllock: WithKeepAlive(%v): negative interval (0 turns the keep-alive off)", c.keepAlive))
	case c.keepAlive > maxKeepAlive:
		errs = append(errs, fmt.Errorf("sqllock: WithKeepAlive(%v): the interval must be at most %v (0 turns the keep-alive off)", c.keepAlive, maxKeepAlive))
	}
	if c.unlockTimeout <= 0 || c.unlockTimeout > maxUnlockTimeout {
		errs = append(errs, fmt.Errorf("sqllock: WithUnlockTimeout(%v): the unlock must be bounded, by a positive timeout of at most %v", c.unlockTimeout, maxUnlockTimeout))
	}
	switch {
	case c.orphanBound < 0:
		errs = append(errs, fmt.Errorf("sqllock: WithOrphanBound(%v): negative bound (0 turns it off)", c.orphanBound))
	case c.orphanBound > 0 && (c.orphanBound < minOrphanBound || c.orphanBound > maxOrphanBound):
		errs = append(errs, fmt.Errorf("sqllock: WithOrphanBound(%v): the bound must be from %v to %v (TCP keep-alive settings count in seconds, and Linux takes at most 32767 s for the first probe)",
			c.orphanBound, minOrphanBound, maxOrphanBound))
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}
	if c.keepAlive > 0 && c.keepAlive < minKeepAlive {
		c.keepAlive = minKeepAlive
	}
	if core.BoundsError(c.keepAlive, c.orphanBound) != nil {
		switch {
		case c.keepAliveSet && !c.orphanSet:
			c.orphanBound = core.BoundFor(c.keepAlive)
			if c.orphanBound > maxOrphanBound {
				return c, fmt.Errorf("sqllock: WithKeepAlive(%v): no orphan bound up to %v lets the keep-alive tell a cut-off holder first; lower it", c.keepAlive, maxOrphanBound)
			}
		case c.orphanSet && !c.keepAliveSet:
			c.keepAlive = core.KeepAliveFor(c.orphanBound)
		}
	}
	return c, core.BoundsError(c.keepAlive, c.orphanBound)
}

// CheckOptions returns the error of opts that [New] would panic with, or
// nil: a duration out of its range (negative, or above the maximum each
// option's doc states), an invalid application name, or a keep-alive and
// an orphan bound, both given, that let the server free a cut-off holder's
// lock before the holder is told.
// Programs that read settings from their configuration call it first (the
// sqllock command does).
func CheckOptions(opts ...Option) error {
	_, err := newConfig(opts)
	return err
}

// WithKeepAlive sets how often the Locker checks that its held locks still
// exist (default 5 s); 0 turns the check off. The check runs
// on a connection of the pool (never on a lock's pinned connection), and covers all of the
// Locker's locks and Sessions in one query. Each check, connection
// included, waits at most the interval or one second, whichever is longer.
//
// A lock whose backend no longer holds it is reported lost at once. When
// the check gets no answer from the server twice in a row, every lock is
// reported lost, since none can be confirmed. A check that cannot get a
// connection because the pool is at its SetMaxOpenConns limit is skipped,
// not failed (a busy pool says nothing about the server): it is counted in
// [Stats].KeepAliveSkipped and logged once at Warn level, and while it
// lasts the locks are not watched. So leave one connection beyond the
// sessions that hold the Locker's locks and run its waits: its shared
// sessions (at most a quarter of SetMaxOpenConns), and a session per lock
// that waited, per waiter and per lock that pins one (see [Locker.Lock]).
// One goroutine runs the checks while locks are held and ends within one
// interval of the last release.
//
// d is from 0 (off) to 1 h; an interval below 100 ms is raised to it, and
// a negative d or one above 1 h is an error (see [CheckOptions]). When
// WithOrphanBound is not given, the orphan bound is raised, if need be, to
// fit the interval (see [WithOrphanBound]).
func WithKeepAlive(d time.Duration) Option {
	return optionFunc(func(c *config) { c.keepAlive, c.keepAliveSet = d, true })
}

// WithUnlockTimeout bounds the unlock statement (default 5 s): it is
// cancelled after between d and 1.25 d. Unlock does not use its caller's
// cancellation: a cancelled context still releases the lock. An unlock
// must be bounded: d must be positive and at most 1 h; anything else is
// an error (see [CheckOptions]).
func WithUnlockTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) { c.unlockTimeout = d })
}

// WithOrphanBound sets how long the server keeps the lock of a holder that
// died or was cut off (a power loss, a kernel panic, a paused VM, a network
// partition): default 30 s; 0 leaves the server's settings
// alone (with Linux's defaults, such a lock lives over two hours).
//
// The statement that takes each session-level lock (and the one that
// starts a Session) also sets, on its own session, tcp_keepalives_idle
// (d/3), tcp_keepalives_interval (d/6), tcp_keepalives_count,
// tcp_user_timeout (d) and, on PostgreSQL 14 and later,
// client_connection_check_interval: settings any role may change, at no
// extra round trip. The unlock statement sets them back, so a connection
// goes back to the pool as it came. They do not apply over Unix sockets or
// behind PgBouncer, whose own connection to the server is what they would
// watch.
//
// The holder must learn of the loss before the server frees the lock: the
// keep-alive must tell a cut-off holder within three quarters of the bound
// (keep-alive + 2 × max(keep-alive, 1 s), the time for two failed checks).
// With the defaults: 15 s against 30 s. When only one of WithKeepAlive and
// WithOrphanBound is given, the other adapts to it: the keep-alive is
// lowered to fit the bound (to a fifth of it, or less below 5 s), or the
// bound is raised to fit the keep-alive. When both are given and break the
// rule, that is an error. d is 0 (off) or from 3 s to 27 h (Linux takes
// at most 32,767 s for tcp_keepalives_idle, a third of the bound);
// anything else is an error (see [CheckOptions]).
func WithOrphanBound(d time.Duration) Option {
	return optionFunc(func(c *config) { c.orphanBound, c.orphanSet = d, true })
}

// WithApplicationName gives the session of every lock the Locker takes the
// application_name name, so that pg_stat_activity, [Inspect] and
// `sqllock inspect` show who holds what, unless the session has one
// already (set on the DSN, for instance), which it never overwrites. It
// costs nothing per lock: the setting rides on the statement of a
// connection's first lock. name is printable ASCII without quotes or
// backslashes, at most 63 bytes; anything else is an error (see
// [CheckOptions]).
func WithApplicationName(name string) Option {
	return optionFunc(func(c *config) {
		if !validAppName(name) {
			c.errs = append(c.errs, fmt.Errorf("sqllock: WithApplicationName(%q): want 1 to 63 bytes of printable ASCII without quotes or backslashes", name))
		}
		c.appName = name
	})
}

// WithHolders attaches who holds a key to the error of a lock that could
// not be taken (held elsewhere, or a wait whose context ended): the error
// is then a [*HeldError], which still matches [ErrNotAcquired] (and the
// context's error) with errors.Is. It costs one more query, bounded to one
// second, on that failure path only.
func WithHolders() Option {
	return optionFunc(func(c *config) { c.holders = true })
}

// WithLogger sends the Locker's events to l: waiting, acquired (with the
// wait), released (with the hold time) at Debug level; lost locks and
// discarded connections at Warn level. The default logs nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithDedicatedSessions makes every lock of the Locker pin a session of its
// own, as [Locker.Session] does for many keys, instead of sharing a few
// sessions among its exclusive locks (the default; see [Locker.Lock]).
// A server session per lock: a Locker holding N locks uses N connections
// (statements that must run in the locking session run on a [Session]'s
// connection).
func WithDedicatedSessions() Option {
	return optionFunc(func(c *config) { c.dedicated = true })
}

// WithTransactionPooler makes every lock of the Locker work behind a
// transaction-mode pooler (PgBouncer with pool_mode=transaction,
// Supavisor, Neon's and Supabase's pooled endpoints), where a plain
// session-level lock would be taken on whichever server session ran its
// statement and stay there for other clients. Each of the Locker's
// sessions is a transaction it keeps open on a client connection of its
// own, which the pooler pins to one server session until it ends: the
// locks are taken and released in it one by one (several keys share a
// transaction, and a few transactions serve all the Locker's locks), its
// waits run in savepoints, its settings are local to it, and it ends with
// COMMIT once it holds nothing. When the Locker cannot be sure of a
// session, it closes the client connection while the transaction is still
// open: a transaction-mode pooler cannot hand that server session to
// anyone (PgBouncer closes it), and the server releases its locks as it
// ends; the Locker then checks that no idle server session is left
// holding them, and ends one that is. The transaction writes nothing and
// keeps no snapshot between statements: vacuum and CREATE INDEX
// CONCURRENTLY do not wait for it. A holder that stops showing life loses
// its locks within the orphan bound (the transaction's
// idle_in_transaction_session_timeout). Every handle works as on a direct
// connection ([Lock], [Locker.Do], semaphores, elections, [Inspect]),
// but [Locker.Session], whose connection would run the caller's
// statements inside the transaction that holds its locks: it returns an
// error. It also works on a direct connection. Without it, a Locker that
// finds a transaction pooler in its way refuses every lock with an error
// matching [ErrSessionChanged] that names this option.
func WithTransactionPooler() Option {
	return optionFunc(func(c *config) { c.txPooler = true })
}

// WithAllowStandby lets the Locker take locks on a hot standby. This is
// dangerous: a standby's advisory locks do not conflict with the primary's,
// so a client of the primary and a client of the standby can both "hold" the
// same key. Without it, locks on a standby fail with [ErrStandby]. It
// covers the Locker's calls, [Locker.InTx] among them (begin a read-only
// transaction there: a standby refuses read-write ones), not [LockTx] and
// its kin, which always refuse a standby.
func WithAllowStandby() Option {
	return optionFunc(func(c *config) { c.allowStandby = true })
}

// validAppName reports whether name may be rendered into SQL: printable
// ASCII without quotes or backslashes, at most 63 bytes.
func validAppName(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c < 0x20 || c > 0x7e || c == '\'' || c == '\\' {
			return false
		}
	}
	return true
}

// DoOption configures one call of [Locker.Do] or [Locker.TryDo]: a task's
// own settings, such as its hold window.
type DoOption interface{ applyDo(*doConfig) }

type doConfig struct {
	holdAtLeast time.Duration
	holdAtMost  time.Duration // 0: no bound
	atMostSet   bool          // WithHoldAtMost was given
}

type doOptionFunc func(*doConfig)

func (f doOptionFunc) applyDo(c *doConfig) { f(c) }

// WithHoldAtLeast makes this call of [Locker.Do] or [Locker.TryDo] hold
// its lock until at least d after it was acquired, even when fn returns
// sooner: the release happens in the background (see [Lock.UnlockAfter]),
// and Do returns as soon as the server has confirmed, in one round trip on
// the lock's session, that the lock was still held when fn returned (if it
// was not, Do returns an error matching [ErrLockLost], as an unlock would
// have found it). For a job that several machines fire on the same
// schedule, choose d between the largest skew of their clocks and
// schedulers and the schedule's period (period minus a margin smaller than
// period − skew): then exactly one machine runs each tick. The window
// belongs to the task, so tasks of different schedules share one Locker.
// The window lives in this process: a process that exits during it ends
// its session, and the server releases the lock then, so that another
// machine can run the same tick again. A program that shuts down calls
// [Locker.Close], which waits out the open windows first.
// 0 (the default) releases as fn returns. d is from 0 to 7 days (168 h):
// a negative d, or a longer one, makes Do return an error before taking
// the lock.
func WithHoldAtLeast(d time.Duration) DoOption {
	return doOptionFunc(func(c *doConfig) { c.holdAtLeast = d })
}

// WithHoldAtMost bounds this call of [Locker.Do] or [Locker.TryDo]: d
// after the lock was acquired, fn's context ends and the lock is
// released, whether fn has returned or not (ShedLock's lockAtMostFor). A
// job that hangs then no longer keeps the other processes from running
// it. The server has freed the lock by d plus the Locker's unlock timeout
// ([WithUnlockTimeout]), or sooner, as soon as it answers the unlock.
//
// At d, fn's context ends with context.DeadlineExceeded, and
// context.Cause(ctx) is an error matching [ErrLockLost] and
// context.DeadlineExceeded. fn must stop then: from d on it no longer
// holds the lock, and another process may be running the same job.
// Do still waits for fn to return (it cannot stop a goroutine, and
// whatever fn uses stays fn's until it returns), and then returns an
// error matching [ErrLockLost] and context.DeadlineExceeded (carrying
// fn's own error, if any). A fn that ignores its context keeps running
// without the lock: its writes after d are not protected by it. Writes
// that must be refused then carry a fencing token ([Lock.Token], with
// [Locker.Lock] and a context bounded by d), which the next holder's
// token exceeds. The Locker's logger is told (Warn) when a job reaches
// its bound, and again when it is still running at d plus the unlock
// timeout.
//
// It combines with [WithHoldAtLeast]: a job that returns sooner than the
// hold window keeps the lock until the window ends; one that runs past d
// loses it at d. d must be positive and no shorter than the hold window;
// otherwise Do returns an error before taking the lock.
func WithHoldAtMost(d time.Duration) DoOption {
	return doOptionFunc(func(c *doConfig) { c.holdAtMost, c.atMostSet = d, true })
}

// newDoConfig applies opts, or says which value it refuses.
func newDoConfig(opts []DoOption) (doConfig, error) {
	var c doConfig
	for _, o := range opts {
		if o != nil {
			o.applyDo(&c)
		}
	}
	if c.holdAtLeast < 0 {
		return c, fmt.Errorf("sqllock: WithHoldAtLeast(%v): negative window", c.holdAtLeast)
	}
	if err := windowError("WithHoldAtLeast", c.holdAtLeast); err != nil {
		return c, err
	}
	switch {
	case !c.atMostSet:
	case c.holdAtMost <= 0:
		return c, fmt.Errorf("sqllock: WithHoldAtMost(%v): the bound must be positive (leave the option out for no bound)", c.holdAtMost)
	case c.holdAtMost < c.holdAtLeast:
		return c, fmt.Errorf("sqllock: WithHoldAtMost(%v) is shorter than WithHoldAtLeast(%v): the lock cannot be released before the hold window ends", c.holdAtMost, c.holdAtLeast)
	}
	return c, nil
}

// windowError returns the error of a hold window d that call (an option or
// method) refuses as too long, or nil.
func windowError(call string, d time.Duration) error {
	if d > maxHoldWindow {
		return fmt.Errorf("sqllock: %s(%v): the window must be at most %v (it need only outlast the skew of the machines' clocks)", call, d, maxHoldWindow)
	}
	return nil
}
