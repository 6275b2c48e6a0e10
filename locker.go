package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
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

	serverMu sync.Mutex
	serverOK bool // guarded by serverMu: the server was checked and is supported

	epochMu    sync.Mutex
	epochCtx   context.Context // guarded by epochMu: see unlockContext
	epochUntil time.Time       // guarded by epochMu

	stats lockerStats
}

type config struct {
	keepAlive     time.Duration
	unlockTimeout time.Duration
	logger        *slog.Logger
	registry      *Registry
	allowStandby  bool
	mode          *stmtMode
}

// Option configures a Locker.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// Default settings of a Locker.
const (
	DefaultKeepAlive     = 5 * time.Second
	DefaultUnlockTimeout = 5 * time.Second
)

// WithKeepAlive sets how often the Locker checks that its held locks still
// exist (default [DefaultKeepAlive]); 0 turns the check off. The check runs
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
// locks and waiters: SetMaxOpenConns(locks + waiters + 1). One goroutine
// runs the checks while locks are held and ends within one interval of the
// last release.
func WithKeepAlive(d time.Duration) Option {
	return optionFunc(func(c *config) { c.keepAlive = d })
}

// WithUnlockTimeout bounds the unlock statement (default
// [DefaultUnlockTimeout]): it is cancelled after between d and 1.25 d. Unlock
// does not use its caller's cancellation: a cancelled context still
// releases the lock.
func WithUnlockTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.unlockTimeout = d
		}
	})
}

// WithLogger sends the Locker's events to l: waiting, acquired (with the
// wait), released (with the hold time) at Debug level; lost locks and
// discarded connections at Warn level. The default logs nothing.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// WithRegistry names keys in log events and errors with r.
func WithRegistry(r *Registry) Option {
	return optionFunc(func(c *config) { c.registry = r })
}

// WithAllowStandby lets the Locker take locks on a hot standby. This is
// dangerous: a standby's advisory locks do not conflict with the primary's,
// so a client of the primary and a client of the standby can both "hold" the
// same key. Without it, locks on a standby fail with [ErrStandby].
func WithAllowStandby() Option {
	return optionFunc(func(c *config) { c.allowStandby = true })
}

// WithInlineKeys chooses how keys reach the server: rendered by this package
// into the SQL text (true), or as bind parameters (false). By default the
// Locker renders them for lib/pq, where a parameterized query costs two round
// trips, and binds them for every other driver.
func WithInlineKeys(inline bool) Option {
	return optionFunc(func(c *config) {
		m := bindKeys
		if inline {
			m = inlineKeys
		}
		c.mode = &m
	})
}

// New returns a Locker that takes its locks through db.
//
// Defaults: keep-alive every 5 s, unlock bounded to 5 s, no logging, no
// registry, standbys refused, keys bound as parameters (rendered into the
// SQL text for lib/pq). New panics if db is nil.
func New(db *sql.DB, opts ...Option) *Locker {
	if db == nil {
		panic("sqllock: New called with a nil *sql.DB (was the error of sql.Open ignored? It fails when no driver of that name is registered: import one, such as _ \"github.com/jackc/pgx/v5/stdlib\")")
	}
	cfg := config{keepAlive: DefaultKeepAlive, unlockTimeout: DefaultUnlockTimeout}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	l := &Locker{db: db, cfg: cfg, mode: detectMode(db.Driver())}
	if cfg.mode != nil {
		l.mode = *cfg.mode
	}
	l.mon = newMonitor(l)
	return l
}

// Lock takes the exclusive lock k, waiting (in the server) as long as
// another session holds it. When ctx ends first, it returns an error that
// matches both [ErrNotAcquired] and ctx.Err(), and no lock stays held. Other
// errors: [ErrDeadlock], [ErrLockTableFull], [ErrStandby],
// [ErrUnsupportedServer], [ErrInvalidKey], and connection errors.
func (l *Locker) Lock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, false, false)
}

// TryLock takes the exclusive lock k if no other session holds it, and
// otherwise returns an error matching [ErrNotAcquired] at once. Its other
// errors are those of [Locker.Lock].
func (l *Locker) TryLock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, true, false)
}

// RLock takes the lock k in shared mode, waiting while another session holds
// it exclusively. Any number of sessions can share it. Errors are those of
// [Locker.Lock].
func (l *Locker) RLock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, false, true)
}

// TryRLock takes the lock k in shared mode if no session holds it
// exclusively, and otherwise returns an error matching [ErrNotAcquired].
func (l *Locker) TryRLock(ctx context.Context, k Key) (*Lock, error) {
	return l.acquire(ctx, k, true, true)
}

// Do runs fn while holding the exclusive lock k, waiting for it first as
// [Locker.Lock] does. The lock is released when fn returns or panics. fn's
// context is cancelled, with cause an error wrapping [ErrLockLost], if the
// lock is lost while fn runs. Do returns fn's error joined with any error
// from acquiring or releasing the lock.
func (l *Locker) Do(ctx context.Context, k Key, fn func(ctx context.Context) error) error {
	lk, err := l.Lock(ctx, k)
	if err != nil {
		return err
	}
	return lk.run(ctx, fn)
}

// TryDo runs fn while holding the exclusive lock k if it is free, the
// lesson's cron pattern: when another session holds k it returns
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
func (l *Locker) acquire(ctx context.Context, k Key, try, shared bool) (*Lock, error) {
	if err := k.valid(); err != nil {
		return nil, err
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, notAcquired(k, err)
		}
		lk, err := l.acquireOnce(ctx, k, try, shared, start)
		if err == nil || attempt == acquireAttempts || !connectionBroken(err) || ctxEnded(ctx) {
			return lk, err
		}
	}
}

func (l *Locker) acquireOnce(ctx context.Context, k Key, try, shared bool, start time.Time) (*Lock, error) {
	conn, err := l.db.Conn(ctx)
	if err != nil {
		if ctxEnded(ctx) {
			return nil, notAcquired(k, ctxErr(ctx))
		}
		return nil, fmt.Errorf("sqllock: lock %s: get connection: %w", k, err)
	}
	if err := l.checkServer(ctx, conn); err != nil {
		conn.Close() // no lock statement ran on it
		if ctxEnded(ctx) {
			return nil, notAcquired(k, ctxErr(ctx))
		}
		return nil, err
	}
	// Every call starts with the non-waiting function: an uncontended lock
	// costs one round trip either way, and a wait then knows its backend's
	// pid, which settles a cancelled wait (see cancelWait).
	q, args := l.mode.sessionLockSQL(lockFn(true, shared, false), k)
	var ok, standby bool
	var pid int64
	err = queryRow(ctx, conn, q, args, &ok, &pid, &standby)
	if err == nil && !ok && !try && !(standby && !l.cfg.allowStandby) {
		if l.cfg.logger.Enabled(ctx, slog.LevelDebug) {
			l.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "sqllock: waiting", slog.String("key", l.name(k)),
				slog.Bool("shared", shared), slog.Int64("pid", pid))
		}
		q, args = l.mode.sessionLockSQL(lockFn(false, shared, false), k)
		waitPID := pid
		err = queryRow(ctx, conn, q, args, &ok, &pid, &standby)
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
		return nil, notAcquired(k, ctxErr(ctx))
	}
	if err != nil {
		l.discard(conn, k, "lock statement failed")
		return nil, lockError(k, err)
	}
	if standby && !l.cfg.allowStandby {
		if !ok {
			conn.Close() // confirmed: this session holds nothing
			return nil, fmt.Errorf("%w (lock %s)", ErrStandby, l.name(k))
		}
		if err := l.release(conn, k, shared, pid); err != nil {
			return nil, errors.Join(fmt.Errorf("%w (lock %s)", ErrStandby, l.name(k)), err)
		}
		return nil, fmt.Errorf("%w (lock %s)", ErrStandby, l.name(k))
	}
	if !ok {
		l.stats.contended.Add(1)
		conn.Close() // confirmed: this session holds nothing
		return nil, fmt.Errorf("%w: %s is held by another session", ErrNotAcquired, l.name(k))
	}
	lk := newLock(l, k, shared, conn, pid)
	l.stats.acquired.Add(1)
	l.stats.held.Add(1)
	l.mon.add(lk)
	if l.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		l.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "sqllock: acquired", slog.String("key", l.name(k)),
			slog.Bool("shared", shared), slog.Int64("pid", pid), slog.Duration("wait", time.Since(start)))
	}
	return lk, nil
}

// connectionBroken reports whether err means the connection or its session
// is gone (a bad connection, a network error, SQLSTATE class 08, or 57P
// operator intervention such as a terminated backend or a shutdown), as
// opposed to an answer from a live session.
func connectionBroken(err error) bool {
	for _, answer := range []error{ErrNotAcquired, ErrStandby, ErrDeadlock, ErrLockTableFull, ErrUnsupportedServer, ErrInvalidKey} {
		if errors.Is(err, answer) {
			return false
		}
	}
	var ne net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) {
		return true
	}
	if st := sqlState(err); strings.HasPrefix(st, "08") || strings.HasPrefix(st, "57P") {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"conn closed", "bad connection", "broken pipe", "connection reset", "connection refused"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// release runs the unlock statement on conn, on the backend pid, and gives
// conn back to the pool only when PostgreSQL confirmed the unlock there. In
// every other case it discards conn, so that the server ends the session and
// releases whatever it held.
func (l *Locker) release(conn *sql.Conn, k Key, shared bool, pid int64) error {
	q, args := l.mode.unlockSQL(shared, k, pid)
	var released sql.NullBool
	var gotPID int64
	err := queryRow(l.unlockContext(), conn, q, args, &released, &gotPID)
	switch {
	case errors.Is(err, sql.ErrConnDone):
		// Lock.Conn() was closed by the caller: the session went back to the
		// pool holding the lock.
		return l.reclaim(k, pid)
	case err != nil && connectionBroken(err):
		// The session ended (terminated, restarted, or cut off) before the
		// unlock: the lock went with it, at a moment no one can tell, so
		// the critical section may not have been exclusive.
		l.discard(conn, k, "session gone at unlock")
		return fmt.Errorf("%w: %s: the session ended before the unlock: %w", ErrLockLost, l.name(k), err)
	case err != nil:
		l.discard(conn, k, "unlock statement failed")
		return fmt.Errorf("sqllock: unlock %s: %w (connection discarded; the server releases the lock as the session ends)", l.name(k), err)
	case gotPID != pid:
		l.discard(conn, k, "backend changed")
		return fmt.Errorf("%w: %w: lock %s was granted to backend %d but unlock ran on backend %d", ErrLockLost, ErrSessionChanged, l.name(k), pid, gotPID)
	case !released.Bool:
		l.discard(conn, k, "unlock found no lock")
		return fmt.Errorf("%w: unlock of %s on backend %d found no such lock", ErrLockLost, l.name(k), pid)
	}
	return conn.Close()
}

// reclaim releases k after the caller closed Lock.Conn(), which put the
// locked session (backend pid) back in the pool. Only that session can
// unlock; reclaim's statement runs on some pooled connection: if it is that
// session, it releases its advisory locks there (no one else's), otherwise
// it ends that session (a role may end its own sessions), as discarding it
// would have.
func (l *Locker) reclaim(k Key, pid int64) error {
	var ok bool
	err := l.db.QueryRowContext(l.unlockContext(), `SELECT CASE WHEN pg_backend_pid() = $1::int4
 THEN (SELECT true FROM pg_advisory_unlock_all()) ELSE pg_terminate_backend($1::int4) END`, pid).Scan(&ok)
	if err == nil && !ok {
		err = errors.New("backend not found")
	}
	if err != nil {
		return fmt.Errorf("sqllock: unlock %s: Lock.Conn() was closed, returning the locked session (backend %d) to the pool, and releasing it failed: %w", k, pid, err)
	}
	return fmt.Errorf("sqllock: unlock %s: Lock.Conn() was closed, returning the locked session (backend %d) to the pool; its locks were released (do not close Lock.Conn(): Unlock does)", k, pid)
}

// unlockContext returns the context that bounds an unlock statement
// starting now: detached from every caller, and cancelled between one and
// 1.25 unlock timeouts from now. Unlocks that start within the same quarter
// of a timeout share one context and one timer: a timer per unlock would
// cost about 4% of a lock and unlock cycle.
func (l *Locker) unlockContext() context.Context {
	now := time.Now()
	l.epochMu.Lock()
	defer l.epochMu.Unlock()
	if l.epochCtx == nil || !now.Before(l.epochUntil) {
		epoch := l.cfg.unlockTimeout / 4
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(l.cfg.unlockTimeout+epoch, cancel)
		l.epochCtx, l.epochUntil = ctx, now.Add(epoch)
	}
	return l.epochCtx
}

// cancelWaitSQL cancels backend $1's statement if it still waits for the
// advisory lock whose tag is ($2, $3, $4), and answers how many backends it
// signalled (0 or 1). Matching the pid and the awaited key together keeps
// it from cancelling anyone else's statement.
const cancelWaitSQL = `SELECT count(pg_cancel_backend(l.pid)) FROM pg_catalog.pg_locks l
 WHERE l.locktype = 'advisory' AND NOT l.granted AND l.pid = $1::int4
  AND l.classid::int8 = $2::int8 AND l.objid::int8 = $3::int8 AND l.objsubid = $4::int4`

// waitingSQL reports whether backend $1 still waits for an advisory lock.
const waitingSQL = `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l
 WHERE l.locktype = 'advisory' AND NOT l.granted AND l.pid = $1::int4)`

// cancelWaitTimeout bounds cancelWait.
const cancelWaitTimeout = 2 * time.Second

// cancelWait takes backend pid, whose wait for k its client abandoned, out
// of k's queue, from another pooled connection, and waits (bounded) until
// it has left. Some drivers (pgx) close the socket of a cancelled statement
// without a cancel request; the backend then stays queued until it is
// granted the lock, and holds it until it notices that its client is gone.
// It is best effort: when no connection can be had in time, the server
// still releases the lock as the abandoned session ends.
func (l *Locker) cancelWait(pid int64, k Key) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelWaitTimeout)
	defer cancel()
	c, o, sub := k.lockTag()
	var n int64
	if err := l.db.QueryRowContext(ctx, cancelWaitSQL, pid, int64(c), int64(o), sub).Scan(&n); err != nil || n == 0 {
		return
	}
	for ctx.Err() == nil {
		var waiting bool
		if err := l.db.QueryRowContext(ctx, waitingSQL, pid).Scan(&waiting); err != nil || !waiting {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// discard closes conn's session instead of returning it to the pool.
func (l *Locker) discard(conn *sql.Conn, k Key, why string) {
	l.stats.discarded.Add(1)
	if l.cfg.logger.Enabled(context.Background(), slog.LevelWarn) {
		attrs := []slog.Attr{slog.String("reason", why)}
		if k.valid() == nil {
			attrs = append(attrs, slog.String("key", l.name(k)))
		}
		l.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn, "sqllock: connection discarded", attrs...)
	}
	discardConn(conn)
}

func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// checkServer refuses servers that do not implement PostgreSQL advisory
// locks. The answer is cached for the Locker's life; a failed check is
// retried on the next call.
func (l *Locker) checkServer(ctx context.Context, conn *sql.Conn) error {
	l.serverMu.Lock()
	defer l.serverMu.Unlock()
	if l.serverOK {
		return nil
	}
	var v string
	if err := conn.QueryRowContext(ctx, "SELECT version()").Scan(&v); err != nil {
		return fmt.Errorf("sqllock: check server version: %w", err)
	}
	if err := supported(v); err != nil {
		return err
	}
	l.serverOK = true
	return nil
}

// supported returns ErrUnsupportedServer for a version() string of a server
// whose advisory lock functions are not PostgreSQL's.
func supported(version string) error {
	for _, bad := range []string{"CockroachDB", "Redshift", "Materialize", "Spanner"} {
		if strings.Contains(version, bad) {
			return fmt.Errorf("%w: %s", ErrUnsupportedServer, version)
		}
	}
	if !strings.HasPrefix(version, "PostgreSQL") {
		return fmt.Errorf("%w: version() is %q", ErrUnsupportedServer, version)
	}
	return nil
}

// ctxEnded reports whether ctx is done or past its deadline. A driver can
// see the deadline pass (a dial or read times out) a moment before ctx.Err()
// turns non-nil.
func ctxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// ctxErr returns ctx.Err(), or context.DeadlineExceeded when the deadline
// has passed but ctx does not say so yet.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

func notAcquired(k Key, ctxErr error) error {
	return fmt.Errorf("%w: %s: %w", ErrNotAcquired, k, ctxErr)
}

// lockError classifies a failed lock statement.
func lockError(k Key, err error) error {
	switch sqlState(err) {
	case "40P01":
		return fmt.Errorf("%w: lock %s: %w", ErrDeadlock, k, err)
	case "53200":
		return fmt.Errorf("%w: lock %s: %w", ErrLockTableFull, k, err)
	case "55P03", "57014": // lock_timeout, statement_timeout
		return fmt.Errorf("%w: lock %s: %w", ErrNotAcquired, k, err)
	}
	return fmt.Errorf("sqllock: lock %s: %w", k, err)
}

// sqlState returns the SQLSTATE of a server error from any driver that
// exposes one (lib/pq and pgx both do), and otherwise recognises the two
// messages this package cares about.
func sqlState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "deadlock detected"):
		return "40P01"
	case strings.Contains(msg, "out of shared memory"):
		return "53200"
	}
	return ""
}

// Stats are counters of a Locker since New.
type Stats struct {
	Held      int64 // locks held now
	Acquired  int64 // locks granted
	Contended int64 // non-waiting attempts that found the lock taken
	Lost      int64 // locks lost while held
	Discarded int64 // connections closed instead of returned to the pool
	// KeepAliveChecks counts keep-alive queries: one per interval for all
	// of the Locker's locks and Sessions, whatever their number.
	KeepAliveChecks int64
	// KeepAliveSkipped counts intervals in which the keep-alive could not
	// check because the pool was at its SetMaxOpenConns limit. Such an
	// interval is not evidence that a lock was lost; no lock is watched
	// during it.
	KeepAliveSkipped int64
}

type lockerStats struct {
	held, acquired, contended, lost, discarded, keepAlive, keepAliveSkipped atomic.Int64
}

// Stats returns the Locker's counters.
func (l *Locker) Stats() Stats {
	return Stats{Held: l.stats.held.Load(), Acquired: l.stats.acquired.Load(), Contended: l.stats.contended.Load(),
		Lost: l.stats.lost.Load(), Discarded: l.stats.discarded.Load(), KeepAliveChecks: l.stats.keepAlive.Load(),
		KeepAliveSkipped: l.stats.keepAliveSkipped.Load()}
}
