package core

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Config is what a Pool is made with: the Locker's settings, validated.
type Config struct {
	KeepAlive     time.Duration // 0: no keep-alive
	OrphanBound   time.Duration // 0: the server's TCP settings
	UnlockTimeout time.Duration
	AppName       string // "": none
	AllowStandby  bool
	Dedicated     bool // every lock on a session of its own
	// TxPooler: a transaction pooler is in the way; every session is a
	// transaction kept open on a client connection (see pinned.go).
	TxPooler bool
}

// Hooks are what the core tells the Pool's owner: the names of keys (for
// errors and events, built only when one is), events (counted in the
// Pool's Stats before they are told), and log records. They run
// synchronously, on the lock path; they must not call back into the Pool.
type Hooks interface {
	// Name returns what errors and events call k.
	Name(k Key) string
	// Event tells of something that happened to the Pool's locks or
	// connections.
	Event(e Event)
	// Log records a message at level, about k when keyed.
	Log(ctx context.Context, level slog.Level, msg string, k Key, keyed bool, attrs ...slog.Attr)
}

// EventKind says what an Event reports.
type EventKind uint8

// The kinds of Event.
const (
	EventLost      EventKind = iota + 1 // a held lock (or an Owned session's locks) found lost
	EventDiscarded                      // a connection closed instead of going back to the pool
	EventKeepAlive                      // one keep-alive check ran
)

// Event is something that happened to a Pool's locks or connections.
type Event struct {
	Kind     EventKind
	Key      Key   // when Keyed: EventLost of a Hold
	Keyed    bool  // Key is the event's
	Hold     *Hold // EventLost of a Hold: the Hold
	Owned    bool  // EventLost of an Owned session's locks
	N        int64 // EventLost: how many locks
	PID      int64
	Held     time.Duration
	Duration time.Duration
	Err      error
}

// Pool is one Locker's core: its sessions (shared ones, sessions of their
// own, Owned ones), its per-key queues, its keep-alive. It is safe for
// concurrent use.
type Pool struct {
	wait.Engine // db, the driver's statement mode, round trips (see wait's wait.go)
	cfg         Config
	hooks       Hooks

	statementSet // its statements, and its connections' backends
	serverState  // what its server check found (server.go)
	pinning      // its sessions behind a transaction pooler (pinned.go)
	leasing      // its sessions' leases (lease.go)
	connections  // its connections, taken into sessions and ended (conn.go)
	txLocks      // locks in its caller's transactions (tx.go)
	naming       // its sessions' owner marks, its keys' names, its events

	poolerGuard           // what it knows of a transaction pooler (pooler.go)
	closing               // its end (close.go)
	share       sharing   // the shared sessions (share.go)
	queue       keyQueues // the per-key queues (keyqueue.go)
	mon         *monitor  // the keep-alive (keepalive.go)
	stats       poolStats // counters (see Stats)
}

// statementSet is a Pool's session-level statements, with the settings a
// lock session needs (see sessionSettings), plain those of a session set
// up already, and bindPlain plain's with keys bound, for a blind driver's
// prepared statements (see stmt's prepared.go); and pids, each connection's
// backend pid as last seen, and idents, each connection's identity (see
// checkServer).
type statementSet struct {
	stmts     atomic.Pointer[statements] // set by the server check
	plain     *statements
	bindPlain *statements
	pids      stmt.ConnSet[int64]
	idents    stmt.ConnSet[ident]
}

// serverState is what a Pool's server check found.
type serverState struct {
	p        *Pool // its Pool
	serverMu sync.Mutex
	serverOK atomic.Bool  // set under serverMu: the server was checked and is supported
	major    atomic.Int32 // set with serverOK: the server's major version
	leased   atomic.Bool  // set with serverOK: lock sessions are leased (see lease.go)
}

// link points the parts of p that keep a pointer to their Pool at p,
// gives them the settings of p.cfg they need, and returns p.
func (p *Pool) link() *Pool {
	p.connections.unlockTimeout = p.cfg.UnlockTimeout
	p.poolerGuard.p = p
	p.closing.p = p
	p.serverState.p = p
	p.pinning.p = p
	p.leasing.p = p
	p.connections.p = p
	p.txLocks.p = p
	p.naming.p = p
	return p
}

// NewPool returns the core of a Locker on db.
func NewPool(db *sql.DB, cfg Config, hooks Hooks) *Pool {
	p := &Pool{Engine: wait.Engine{DB: db, Budget: &stmt.Budget{DB: db}, Mode: sqltext.DetectMode(db.Driver())}, cfg: cfg, hooks: hooks}
	p.closing.init()
	p.link()
	if cfg.TxPooler {
		p.Engine.SimpleFor = p.pinning.simpleFor
	}
	if p.Mode == sqltext.Inline { // lib/pq (see sqltext.DetectMode)
		p.Abandoned = &stmt.AbandonSet{Budget: p.Budget}
	}
	p.plain = sqltext.Plain(p.Mode)
	p.bindPlain = sqltext.Plain(sqltext.Bind)
	p.markBase = strconv.FormatUint(rand.Uint64(), 36)
	p.mon = newMonitor(p)
	p.Trace = func(ctx context.Context, msg string, k Key, attrs ...slog.Attr) {
		hooks.Log(ctx, slog.LevelDebug, msg, k, true, attrs...)
	}
	p.Warn = func(ctx context.Context, msg string, k Key, attrs ...slog.Attr) {
		hooks.Log(ctx, slog.LevelWarn, msg, k, true, attrs...)
	}
	return p
}

// newMark returns an owner mark for a new lock session (see
// sqltext.Statements): unique to it, among every process's.
func (n *naming) newMark() string {
	return n.markBase + "." + strconv.FormatUint(n.marks.Add(1), 36)
}

// naming is the part of a Pool that makes its sessions' owner marks
// (newMark), names keys and tells its hooks.
type naming struct {
	p        *Pool // its Pool
	markBase string
	marks    atomic.Uint64
}

// name returns what errors call k.
func (nm *naming) name(k Key) string {
	p := nm.p
	return p.hooks.Name(k)
}

// emit counts e in the Pool's Stats and tells the hooks.
func (nm *naming) emit(e Event) {
	p := nm.p
	switch e.Kind {
	case EventLost:
		p.stats.lostHeld(e.N)
	case EventDiscarded:
		p.stats.discarded.Add(1)
	}
	p.hooks.Event(e)
}

// UnlockContext returns the context that bounds an unlock statement
// starting now: detached from every caller, and cancelled between one and
// 1.25 unlock timeouts from now. Unlocks that start within the same quarter
// of a timeout share one context and one timer, so that the hot path does
// not pay for a timer per unlock.
func (e *connections) UnlockContext() context.Context {
	now := time.Now()
	e.epochMu.Lock()
	defer e.epochMu.Unlock()
	if e.epochCtx == nil || !now.Before(e.epochUntil) {
		length := e.unlockTimeout / 4
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(e.unlockTimeout+length, cancel)
		e.epochCtx, e.epochUntil = ctx, now.Add(length)
	}
	return e.epochCtx
}

// discard closes conn's session instead of returning it to the pool.
func (cs *connections) discard(conn *sql.Conn, why string) {
	p := cs.p
	p.emit(Event{Kind: EventDiscarded, Err: errorString(why)})
	if p.Abandoned.Has(conn) {
		return // its abandoned statement closes it as it returns
	}
	stmt.DiscardConn(conn)
}

// putBack gives conn, taken by wait.Engine.TakeConn and holding no lock, back as it
// is: a spare when spare is set (no statement on it failed), else to the
// pool (see stmt.Budget.Done); a connection whose statement was abandoned
// closes as that statement returns (closing it now would wait for it),
// counted until then as abandoned.
func (cs *connections) putBack(conn *sql.Conn, spare bool) {
	p := cs.p
	if p.Abandoned.Has(conn) {
		p.Budget.Give()
		return
	}
	p.Budget.Done(conn, spare && !p.Closed())
}

// errorString is an error that is its text.
type errorString string

func (e errorString) Error() string { return string(e) }

// Stats are a Pool's counters.
type Stats struct {
	Held, Acquired, Contended, TimedOut, Lost, Discarded int64
	KeepAliveChecks, KeepAliveSkipped                    int64
	SnapshotWaits                                        int64
	SharedSessions                                       int
}

type poolStats struct {
	held, acquired, contended, timedOut, lost, discarded, keepAlive, keepAliveSkipped atomic.Int64
}

// timedOut counts err, the outcome of a call that waited, in
// Stats.TimedOut when the call was not granted because its context's
// deadline passed; it returns err.
func (nm *naming) timedOut(err error) error {
	p := nm.p
	if err != nil && errors.Is(err, stmt.ErrNotAcquired) && errors.Is(err, context.DeadlineExceeded) {
		p.stats.timedOut.Add(1)
	}
	return err
}

// took counts n locks granted and now held.
func (s *poolStats) took(n int64) {
	s.acquired.Add(n)
	s.held.Add(n)
}

// released counts n held locks released.
func (s *poolStats) released(n int64) { s.held.Add(-n) }

// lostHeld counts n held locks found lost.
func (s *poolStats) lostHeld(n int64) {
	s.held.Add(-n)
	s.lost.Add(n)
}

// Stats returns the Pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{Held: p.stats.held.Load(), Acquired: p.stats.acquired.Load(), Contended: p.stats.contended.Load(),
		TimedOut: p.stats.timedOut.Load(), Lost: p.stats.lost.Load(), Discarded: p.stats.discarded.Load(), KeepAliveChecks: p.stats.keepAlive.Load(),
		KeepAliveSkipped: p.stats.keepAliveSkipped.Load(), SnapshotWaits: p.SnapshotWaits.Load(),
		SharedSessions: p.share.sessions()}
}
