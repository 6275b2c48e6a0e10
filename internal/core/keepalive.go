package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/seams"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// monitor is a Pool's keep-alive: while the Pool holds locks, one
// goroutine asks pg_locks, over a pooled connection (when one is slow to
// set up, through the queue of a lock session that user code cannot
// reach: see ask), whether each lock is still granted to the backend it
// was granted to. All the Pool's locks are checked by one query per
// interval.
type monitor struct {
	p *Pool

	// parts are what it watches, in parts by key, each under a lock of
	// its own: every lock is added and removed, many at once.
	parts [watchParts]watchPart
	// running: the loop runs. It is set by whoever adds to an empty
	// monitor, and cleared by the loop as it finds nothing left, which
	// then looks once more (see loop).
	running atomic.Bool

	mu       sync.Mutex
	failures int // guarded by mu: consecutive failed checks

	// starved is set while checks find the pool at its limit. Only the
	// loop goroutine uses it.
	starved bool
	// asking counts the keep-alive's queries under way, those of earlier
	// ticks that never returned included (see ask).
	asking atomic.Int64

	// dialing is closed when a connection setup that outlived its query
	// has ended, its connection in the pool; nil when there is none.
	dialMu  sync.Mutex
	dialing chan struct{} // guarded by dialMu
}

// watched is something the keep-alive checks: a Hold, or an Owned with
// many keys on one backend.
type watched interface {
	heldKeys(buf []heldKey) []heldKey
	// lose reports every lock lost (the server could not be reached).
	lose(cause error)
	// loseKey reports that the server no longer shows k, one of the keys
	// heldKeys returned; it must ignore a key that was being released or
	// was released since.
	loseKey(k Key, cause error)
	// leaseOf returns the lease of its session (nil: none), and touch
	// runs one statement there, to keep it from going idle (lease.go).
	leaseOf() *lease
	touch(ctx context.Context) error
}

// heldKey is one lock as the server should show it.
type heldKey struct {
	pid    int64
	id     ident // who granted it
	key    Key
	shared bool
}

// FailedChecksBeforeLost is how many keep-alive checks in a row must fail
// (the server cannot be reached, or answers with an error) before the locks
// are reported lost: one failure may be a blip; two intervals without any
// confirmation mean the holder can no longer claim the lock.
const FailedChecksBeforeLost = 2

// watchParts is how many parts a monitor's watched are kept in.
const watchParts = 16

type watchPart struct {
	mu sync.Mutex
	m  map[watched]struct{} // guarded by mu
}

// part returns w's part: a Hold's by its key, an Owned's the first.
func (m *monitor) part(w watched) *watchPart {
	h, ok := w.(*Hold)
	if !ok {
		return &m.parts[0]
	}
	f, v := slot(h.key)
	return &m.parts[(uint64(v)*0x9e3779b97f4a7c15+uint64(f))>>60]
}

func newMonitor(p *Pool) *monitor {
	return &monitor{p: p}
}

func (m *monitor) add(w watched) {
	if m.p.cfg.KeepAlive <= 0 {
		return
	}
	wp := m.part(w)
	wp.mu.Lock()
	m.addLocked(wp, w)
	wp.mu.Unlock()
	m.start()
}

// addHeld watches h, unless it was released or found lost before: its
// Release, or its loss, removed it from the watched before it was added
// (a key handed on to a caller whose ctx ended at that moment), and
// adding it now would keep it watched for ever. Its state is read under
// its part's mu (wp.mu), which its later removal waits for.
func (m *monitor) addHeld(h *Hold) {
	if m.p.cfg.KeepAlive <= 0 {
		return
	}
	wp := m.part(h)
	wp.mu.Lock()
	held := h.held()
	if held {
		m.addLocked(wp, h)
	}
	wp.mu.Unlock()
	if held {
		m.start()
	}
}

// addLocked watches w, in its part wp, whose mu the caller holds.
func (m *monitor) addLocked(wp *watchPart, w watched) {
	if wp.m == nil {
		wp.m = map[watched]struct{}{}
	}
	wp.m[w] = struct{}{}
}

// start starts the loop, once something was added, unless it runs.
func (m *monitor) start() {
	if m.running.Load() || !m.running.CompareAndSwap(false, true) {
		return
	}
	m.mu.Lock()
	m.failures = 0
	m.mu.Unlock()
	go m.loop()
}

func (m *monitor) remove(w watched) {
	wp := m.part(w)
	wp.mu.Lock()
	delete(wp.m, w)
	wp.mu.Unlock()
}

// watchedNow returns everything watched.
func (m *monitor) watchedNow() []watched {
	var ws []watched
	for i := range m.parts {
		wp := &m.parts[i]
		wp.mu.Lock()
		for w := range wp.m {
			ws = append(ws, w)
		}
		wp.mu.Unlock()
	}
	return ws
}

// loop checks once per interval, and ends at the first tick that finds
// nothing to check: the goroutine outlives the last lock by at most one
// interval, so that a program that locks and unlocks in a loop does not
// start a goroutine per lock.
func (m *monitor) loop() {
	t := time.NewTicker(m.p.cfg.KeepAlive)
	defer t.Stop()
	for range t.C {
		ws := m.watchedNow()
		if len(ws) == 0 {
			if h := seams.Get(); h != nil && h.MonitorFoundNone != nil {
				h.MonitorFoundNone()
			}
			// Nothing left: it stops, unless something was added as it
			// found none (whoever adds after this finds it stopped, and
			// starts another).
			m.running.Store(false)
			if len(m.watchedNow()) == 0 || !m.running.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		m.check(ws)
	}
}

// check runs one keep-alive query for ws and reports the lost ones.
func (m *monitor) check(ws []watched) {
	m.leaseCheck(ws)
	var keys []heldKey
	owner := make([]watched, 0, len(ws))
	for _, w := range ws {
		n := len(keys)
		keys = w.heldKeys(keys)
		for range keys[n:] {
			owner = append(owner, w)
		}
	}
	if len(keys) == 0 {
		return
	}
	began := time.Now()
	r := m.ask(keys, m.p.checkTimeout())
	if !r.skipped {
		m.p.emit(Event{Kind: EventKeepAlive, Duration: time.Since(began), Err: r.err})
	}
	switch {
	case r.skipped:
		m.p.stats.keepAliveSkipped.Add(1)
		if !m.starved {
			m.starved = true
			st := m.p.DB.Stats()
			m.p.hooks.Log(context.Background(), slog.LevelWarn,
				"sqllock: keep-alive skipped: the pool is at its SetMaxOpenConns limit, so held locks are not being watched; leave one connection free", Key{}, false,
				slog.Int("max_open", st.MaxOpenConnections), slog.Int("in_use", st.InUse), slog.Int("locks", len(keys)))
		}
		return
	case r.err != nil:
		m.failed(ws, r.err)
		return
	}
	m.starved = false
	m.mu.Lock()
	m.failures = 0
	m.mu.Unlock()
	for _, lost := range r.lost {
		owner[lost.i].loseKey(keys[lost.i].key, lost.cause(keys[lost.i]))
	}
}

// checkGrace is how long past its timeout the loop waits for a check
// before it counts it failed and lets it finish alone.
const checkGrace = 100 * time.Millisecond

// maxAsking bounds the keep-alive's queries under way: some drivers
// (lib/pq) do not give up a read when its context ends, and a connection
// whose server stopped answering (a partition, a stopped backend) can
// hold one for minutes.
const maxAsking = 4

// ask runs the keep-alive query for keys and returns the first answer
// within timeout (plus checkGrace). One connection that does not answer
// says nothing of the server, only of that connection (an idle pooled
// connection whose backend hung, a half-open one): when the query, sent,
// has not answered by half the timeout, or failed, it is asked once more,
// on another connection (the first one is still busy with it), and either
// answer will do. A query still waiting for a connection to be set up by
// then is asked on one of the Pool's lock sessions instead (another setup
// would not be quicker): two checks whose connections were slow to set up
// would otherwise report every lock lost while the server answers. A
// query that never returns is left to finish alone, and counted in asking
// until it does.
func (m *monitor) ask(keys []heldKey, timeout time.Duration) checkResult {
	if n := m.asking.Load(); n >= maxAsking {
		return checkResult{err: fmt.Errorf("%d earlier checks have not returned", n)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res := make(chan checkResult, 2)
	var sent atomic.Bool // the first query has its connection
	start := func() {
		m.asking.Add(1)
		go func() {
			defer m.asking.Add(-1)
			res <- m.query(ctx, keys, &sent)
		}()
	}
	// onSession asks on one of the Pool's lock sessions instead, when it
	// has one that user code cannot reach (see querySession).
	onSession := func() bool {
		s := m.checkSession()
		if s == nil {
			return false
		}
		m.asking.Add(1)
		go func() {
			defer m.asking.Add(-1)
			var asked atomic.Bool
			res <- m.querySession(ctx, s, keys, &asked)
		}()
		return true
	}
	start()
	started, running := 1, 1
	again := time.NewTimer(timeout / 2)
	defer again.Stop()
	end := time.NewTimer(timeout + checkGrace)
	defer end.Stop()
	last := checkResult{err: fmt.Errorf("no answer within %v", timeout)}
	for {
		select {
		case r := <-res:
			running--
			if r.err == nil && !r.skipped {
				return r
			}
			last = r
			if running > 0 {
				continue // the other may answer yet
			}
			if started == 1 && !r.skipped && ctx.Err() == nil && m.asking.Load() < maxAsking {
				start() // failed at once: ask again now
				started, running = 2, 1
				continue
			}
			return last
		case <-again.C:
			switch {
			case started != 1 || m.asking.Load() >= maxAsking:
			case sent.Load():
				start()
				started, running = 2, running+1
			case onSession():
				// Still no connection: its setup is slow (a loaded
				// machine, a loaded server). Another setup would not be
				// quicker, and a check that never got a connection says
				// nothing of the server; a lock session answers for
				// every lock, without a connection of its own.
				started, running = 2, running+1
			}
		case <-end.C:
			if last.skipped {
				return last
			}
			return checkResult{err: fmt.Errorf("no answer within %v", timeout)}
		}
	}
}

// checkResult is what one keep-alive query found.
type checkResult struct {
	lost    []lostKey // the keys the server no longer shows
	err     error     // no answer from the server
	skipped bool      // no connection: the pool is at its limit
}

// query runs one keep-alive query for keys, bounded by ctx (as far as
// the driver honours it); sent is set once it has its connection.
func (m *monitor) query(ctx context.Context, keys []heldKey, sent *atomic.Bool) checkResult {
	// No connection is not evidence about the server: the Locker's own
	// locks and waiters may hold all of them. Such a check is skipped, not
	// failed; it does not queue for a connection either, so that it never
	// takes one from the caller's next Lock.
	if m.p.cfg.TxPooler {
		if r, ok := m.queryPinned(ctx, keys, sent); ok {
			return r
		}
	}
	for attempt := 1; ; attempt++ {
		var conn *sql.Conn
		err := errPoolFull
		if !poolFull(m.p.DB) {
			conn, err = m.conn(ctx)
		}
		if err != nil && poolFull(m.p.DB) {
			return checkResult{skipped: true}
		}
		if err != nil {
			return checkResult{err: err}
		}
		m.p.stats.keepAlive.Add(1)
		sent.Store(true)
		lost, err := queryLost(ctx, m.p, conn, keys)
		conn.Close()
		// A pooled connection the driver had closed (a wrapper that hides
		// its validity from database/sql) says nothing about the server:
		// database/sql drops it, and the check runs once more on another.
		if errors.Is(err, driver.ErrBadConn) && attempt == 1 && ctx.Err() == nil {
			continue
		}
		return checkResult{lost: lost, err: err}
	}
}

var errPoolFull = errors.New("sqllock: pool at its limit")

// conn is stmt.GetConn for a check: a connection being set up when ctx ends
// goes on in the background, to the pool, and the next check waits for it
// rather than set up another. A check that aborted its own setup at its
// timeout would never get a connection while setups take longer than that
// (a loaded machine), and two such checks report every lock lost.
func (m *monitor) conn(ctx context.Context) (*sql.Conn, error) {
	m.dialMu.Lock()
	prev := m.dialing
	m.dialMu.Unlock()
	if prev != nil {
		select {
		case <-prev:
			m.dialMu.Lock()
			if m.dialing == prev {
				m.dialing = nil
			}
			m.dialMu.Unlock()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if m.p.DB.Stats().Idle > 0 {
		return m.p.DB.Conn(ctx)
	}
	dialing := make(chan struct{})
	conn, err := stmt.LeaveAtEnd(ctx, 0,
		func(func() bool) (*sql.Conn, error) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stmt.ConnectTimeout)
			defer cancel()
			return m.p.DB.Conn(cctx)
		},
		func() {
			m.dialMu.Lock()
			m.dialing = dialing
			m.dialMu.Unlock()
		},
		func(conn *sql.Conn, err error) {
			if err == nil {
				conn.Close() // to the pool, for the next check
			}
			close(dialing)
		})
	if errors.Is(err, stmt.ErrAbandoned) {
		return nil, ctx.Err()
	}
	return conn, err
}

// failed counts a check that got no answer from the server; after
// FailedChecksBeforeLost in a row, every lock in ws is reported lost.
func (m *monitor) failed(ws []watched, err error) {
	m.mu.Lock()
	m.failures++
	n := m.failures
	m.mu.Unlock()
	if n < FailedChecksBeforeLost {
		return
	}
	cause := fmt.Errorf("keep-alive could not reach the server %d times in a row: %w", n, err)
	for _, w := range ws {
		w.lose(cause)
	}
}

// poolFull reports whether db's pool is at its SetMaxOpenConns limit.
func poolFull(db *sql.DB) bool {
	st := db.Stats()
	return st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections
}

// checkTimeout is how long one keep-alive check may take: the interval, but
// at least a second, so that a short interval on a loaded machine does not
// make slow answers look like failures.
func (p *Pool) checkTimeout() time.Duration {
	return max(p.cfg.KeepAlive, time.Second)
}

// lostKey is a key the server does not show as granted: its 0-based index
// in the keys checked, and why (see sqltext.KeepAliveSQL).
type lostKey struct{ i, why int }

// cause says why the keep-alive found key h lost.
func (lk lostKey) cause(h heldKey) error {
	switch lk.why {
	case 2:
		return errors.New("keep-alive: another server answers than the one that granted it (the server restarted, or a failover moved the primary): its session cannot be there")
	case 3:
		return fmt.Errorf("keep-alive: backend %d is another session now (its session ended and the pid was reused)", h.pid)
	case 4:
		return fmt.Errorf("keep-alive: its session (backend %d) ended (terminated, or its connection closed)", h.pid)
	}
	// A backend that was told to end (pg_terminate_backend) releases its
	// locks as it exits, a moment before it leaves pg_stat_activity: a
	// check in that moment finds it alive without the lock.
	return fmt.Errorf("keep-alive: backend %d no longer holds it (its session ending, the lock released behind the Locker's back, or its session swapped by a pooler)", h.pid)
}

// queryLost returns the keys that the server does not show as granted to
// the backend, on the server, that was granted them.
func queryLost(ctx context.Context, p *Pool, conn *sql.Conn, keys []heldKey) ([]lostKey, error) {
	var pids, classids, objids, subids, shared, servers, backends strings.Builder
	for i, h := range keys {
		sep := ","
		if i == 0 {
			sep = "{"
		}
		c, o, s := stmt.Tag(h.key)
		pids.WriteString(sep + strconv.FormatInt(h.pid, 10))
		classids.WriteString(sep + strconv.FormatUint(uint64(c), 10))
		objids.WriteString(sep + strconv.FormatUint(uint64(o), 10))
		subids.WriteString(sep + strconv.Itoa(s))
		shared.WriteString(sep + strconv.FormatBool(h.shared))
		servers.WriteString(sep + strconv.FormatInt(h.id.server, 10))
		backends.WriteString(sep + strconv.FormatInt(h.id.backend, 10))
	}
	q, args := p.Mode.Arrays(sqltext.KeepAliveSQL, pids.String()+"}", classids.String()+"}",
		objids.String()+"}", subids.String()+"}", shared.String()+"}", servers.String()+"}", backends.String()+"}")
	// Through database/sql, behind a transaction pooler in pgx's simple
	// protocol (SimpleArgs): a statement its cache prepared would meet
	// another server session than the one it was prepared on.
	rows, err := conn.QueryContext(ctx, q, p.SimpleArgs(conn, args)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var lost []lostKey
	for rows.Next() {
		var i, why int
		if err := rows.Scan(&i, &why); err != nil {
			return nil, err
		}
		if i < 1 || i > len(keys) {
			return nil, errors.New("keep-alive: answer out of range")
		}
		lost = append(lost, lostKey{i - 1, why})
	}
	return lost, rows.Err()
}
