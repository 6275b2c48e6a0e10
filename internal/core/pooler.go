package core

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The transaction pooler guard. Behind a transaction-mode pooler
// (PgBouncer with pool_mode=transaction, Supavisor, Neon's and Supabase's
// pooled endpoints) a client connection's statements run on whichever
// server session the pooler picks, and a session-level lock stays on that
// server session, which then serves other clients: it excludes no one
// (advisory locks are re-entrant within a session), and once the client
// connection is closed, no one can unlock it until the pooler recycles
// the server session, an hour later by default.
//
// So a Pool refuses session-level locks behind a pooler, and frees any it
// took before it knew:
//
//   - Evidence (sawPooler): a client connection whose backend changed
//     (its statements answer another pid than its server check did), two
//     client connections on one backend (the same pid and backend start:
//     noteBackend), a statement prepared on a client connection missing
//     on its server session or already there (SQLSTATE 26000, 42P05), or
//     a server session that carries another Locker's owner mark. Each is
//     certain: a direct connection has one backend of its own for its
//     whole life.
//   - The probe (probe): before a Pool's first session-level lock, its
//     checked connection and a second one answer who runs them, twice:
//     a pooler that hands out the server session it released last (as
//     PgBouncer does) puts the second on the first's backend, or the
//     first on the second's.
//   - Once a Pool has seen a pooler, every session-level call is refused
//     before it sends a lock statement (stmt.ErrSessionChanged, naming
//     WithTransactionPooler), every session it has is discarded, and the
//     backend of every discarded session that held or may hold a lock is
//     terminated when it still holds one (discardStranded): discarding a
//     client connection does not end a pooled server session. A call
//     that fails there returns once those terminations are done
//     (freedFirst), so that a program may close its pool next.

// poolerGuard is a Pool's knowledge of a transaction pooler in front of
// its server.
type poolerGuard struct {
	p *Pool // its Pool

	// seen is the first evidence of a pooler (nil: none seen).
	seen atomic.Pointer[error]

	// backends maps each backend (server, pid and start) that answered a
	// server check to the driver connection it answered on.
	backendsMu sync.Mutex
	backends   map[ident]any // guarded by backendsMu

	// probeMu guards probing: closed when the probe that runs ends;
	// probed is set (under probeMu) once one ran to its end.
	probeMu sync.Mutex
	probing chan struct{}
	probed  atomic.Bool
	// noProbe turns the probe off (Probe.SkipPoolerProbe); ignore,
	// evidence too (Probe.IgnorePooler).
	noProbe, ignore atomic.Bool

	// frees are the terminations under way (freeing), each closed when
	// done.
	freesMu sync.Mutex
	frees   map[chan struct{}]struct{} // guarded by freesMu

	// live are the Pool's sessions not ended yet: a pooler seen
	// discards them all.
	liveMu sync.Mutex
	live   map[*session]struct{} // guarded by liveMu
}

// Pooled returns the error of a Pool that has seen a transaction pooler,
// and nil for one that has not.
func (pg *poolerGuard) Pooled() error {
	if e := pg.seen.Load(); e != nil {
		return *e
	}
	return nil
}

// pooledOr returns the Pool's pooler error, or err when it has none (it
// ignores the evidence: Probe.IgnorePooler).
func (pg *poolerGuard) pooledOr(err error) error {
	p := pg.p
	if e := p.Pooled(); e != nil {
		return e
	}
	return err
}

// poolerEvidence reports whether err, a statement's error or the cause a
// session ends with, says that a pooler put the session on another
// server session than its own, or another client on its own.
func poolerEvidence(err error) bool {
	if err == nil {
		return false
	}
	var pe *stmt.PoolerError
	if errors.As(err, &pe) {
		return true
	}
	return stmt.PreparedAstray(err)
}

// sawPooler records evidence of a transaction pooler (the first one
// counts), logs it once, and discards every session of the Pool: each
// may carry a lock that others share, and their backends are freed as
// they go (see session.closeOrDiscard).
func (pg *poolerGuard) sawPooler(evidence error) {
	p := pg.p
	err := evidence
	if pe := (*stmt.PoolerError)(nil); !errors.As(err, &pe) {
		err = stmt.NewPoolerError(evidence.Error())
	}
	if p.cfg.TxPooler || pg.ignore.Load() || !pg.seen.CompareAndSwap(nil, &err) {
		return // a Pool made for a pooler knows; its sessions end as their own evidence says
	}
	p.hooks.Log(context.Background(), slog.LevelWarn, "sqllock: a transaction pooler is in the way: session-level locks are refused, and every session of the Locker is discarded", Key{}, false, slog.String("evidence", evidence.Error()))
	for _, s := range p.liveSessions() {
		s.discard(err)
	}
}

// addLive and removeLive keep the Pool's sessions that have not ended.
func (pg *poolerGuard) addLive(s *session) {
	pg.liveMu.Lock()
	if pg.live == nil {
		pg.live = map[*session]struct{}{}
	}
	pg.live[s] = struct{}{}
	pg.liveMu.Unlock()
}

// liveSessions returns the Pool's sessions that have not ended.
func (pg *poolerGuard) liveSessions() []*session {
	pg.liveMu.Lock()
	defer pg.liveMu.Unlock()
	live := make([]*session, 0, len(pg.live))
	for s := range pg.live {
		live = append(live, s)
	}
	return live
}

func (pg *poolerGuard) removeLive(s *session) {
	pg.liveMu.Lock()
	delete(pg.live, s)
	pg.liveMu.Unlock()
}

// noteBackend records that driver connection dc runs on backend id; it
// returns the pooler's error when another client connection ran on the
// same backend (a backend's start tells two backends that had one pid
// apart, so a connection closed since counts too).
func (pg *poolerGuard) noteBackend(dc any, id ident) error {
	p := pg.p
	if id.backend == 0 || id.pid == 0 || !stmt.ComparableConn(dc) {
		return nil // not known: nothing to compare
	}
	g := pg
	g.backendsMu.Lock()
	if g.backends == nil || len(g.backends) >= stmt.MaxConns {
		g.backends = map[ident]any{}
	}
	other, seen := g.backends[id]
	g.backends[id] = dc
	g.backendsMu.Unlock()
	if seen && other != dc {
		err := stmt.NewPoolerError(fmt.Sprintf("two client connections ran on backend %d", id.pid))
		p.sawPooler(err)
		return p.pooledOr(err)
	}
	return nil
}

// sameBackend returns the pooler's error when pid, the backend that
// answered a statement on s, is not the one that answered s's server
// check: a direct connection keeps its backend for its whole life. With
// granted, the statement took k there, on a server session no one can
// reach: it is freed before this returns (bounded).
func (s *session) sameBackend(pid int64, granted bool, k Key) error {
	if s.id.pid == 0 || pid == s.id.pid {
		return nil
	}
	err := stmt.NewPoolerError(fmt.Sprintf("a client connection checked on backend %d ran a lock statement on backend %d", s.id.pid, pid))
	if granted {
		doneWithin(s.p.discardHolder(pid, k), s.p.cfg.UnlockTimeout)
	}
	s.p.sawPooler(err)
	return s.p.pooledOr(err)
}

// awaitProbe runs the probe on conn, just checked (id), unless it ran
// (or runs) already, and returns the pooler's error when there is one.
// Calls that come while it runs wait for it, as long as their ctx lets
// them; a probe whose ctx ended leaves the probe to the next call.
func (pg *poolerGuard) awaitProbe(ctx context.Context, conn *sql.Conn, id ident) error {
	p := pg.p
	g := pg
	for !g.probed.Load() {
		g.probeMu.Lock()
		if g.probed.Load() {
			g.probeMu.Unlock()
			break
		}
		if ch := g.probing; ch != nil {
			g.probeMu.Unlock()
			select {
			case <-ch:
				continue // it ended, or was left to the next call
			case <-ctx.Done():
				return stmt.NotAcquired("the transaction pooler probe", ctx.Err())
			}
		}
		ch := make(chan struct{})
		g.probing = ch
		g.probeMu.Unlock()
		done := p.probe(ctx, conn, id)
		g.probeMu.Lock()
		g.probing = nil
		g.probed.Store(done)
		g.probeMu.Unlock()
		close(ch)
		if !done {
			if err := p.Pooled(); err != nil {
				return err
			}
			return stmt.NotAcquired("the transaction pooler probe", stmt.CtxErr(ctx))
		}
	}
	return p.Pooled()
}

// probe tells a transaction pooler from a direct connection (or a
// session-mode pooler, where a client keeps one server session), before
// the Pool's first session-level lock: conn (just checked: id) and a
// second connection of the pool are asked who runs them, in turns,
// probeRounds times. A direct connection keeps one backend of its own for
// its whole life; a transaction pooler hands out the server session it
// released last (PgBouncer) or the next one (round robin), so that the
// second connection lands on conn's backend, or either one's backend
// changes. Other clients of the pooler can take a released server
// session in between, so each round can miss; rounds make a miss
// unlikely, and every later statement of the Pool's checks its backend
// too (sameBackend, the owner mark). It reports whether it ran to its end
// (a ctx that ended leaves it to the next call). The second connection
// is one the pool gives at once: a Pool never makes the application wait
// for it; without one, conn alone is asked, again and again.
func (pg *poolerGuard) probe(ctx context.Context, conn *sql.Conn, id ident) bool {
	p := pg.p
	if id.pid == 0 || id.backend == 0 || pg.noProbe.Load() {
		return true // a server (or a stand-in) that does not say who runs it
	}
	// Its answers are read for up to stmt.AbandonGrace past ctx's end, as the
	// server check's: a probe cut short costs its connections, and is
	// left to the next call; calls whose deadlines are shorter than a
	// probe would leave it to the next one for ever.
	ctx, cancel := wait.WithGrace(ctx)
	defer cancel()
	var other *sql.Conn
	if st := p.DB.Stats(); (st.MaxOpenConnections == 0 || st.Idle > 0 || st.OpenConnections < st.MaxOpenConnections) &&
		p.Budget.TryTake() {
		cctx, cancel := context.WithTimeout(ctx, probeConnWait)
		other, _ = p.DB.Conn(cctx)
		cancel()
		if other == nil {
			p.Budget.Give()
		}
	}
	if other != nil {
		defer p.putBack(other, false) // the probe runs once: back to the pool
	}
	ask := func(c *sql.Conn) (ident, error) {
		b := ident{server: id.server}
		err := stmt.QueryRow(ctx, p.Abandoned, c, sqltext.BackendSQL, nil, &b.pid, &b.backend)
		return b, err
	}
	var first ident // other's first answer
	began := time.Now()
	for round := 0; round < probeRounds && (round < probeLeast || time.Since(began) < probeBudget); round++ {
		if other != nil {
			b, err := ask(other)
			if err != nil {
				return p.probeFailed(ctx, err)
			}
			if first == (ident{}) {
				first = b
			}
			switch {
			case b == id:
				p.sawPooler(stmt.NewPoolerError(fmt.Sprintf("two client connections ran on backend %d", id.pid)))
				return true
			case b != first:
				p.sawPooler(stmt.NewPoolerError(fmt.Sprintf("a client connection that ran on backend %d answered from backend %d", first.pid, b.pid)))
				return true
			}
		}
		a, err := ask(conn)
		if err != nil {
			return p.probeFailed(ctx, err)
		}
		if a != id {
			p.sawPooler(stmt.NewPoolerError(fmt.Sprintf("a client connection checked on backend %d answered from backend %d", id.pid, a.pid)))
			return true
		}
	}
	return true
}

// probeRounds is how many turns the probe's two connections take: at
// least probeLeast, and more while they take less than probeBudget (a
// pooler far away costs a round trip a turn). Each turn can miss a pooler
// whose other clients took the server session released in between;
// misses of the turns multiply. On a loaded machine, where each turn is
// slow and the budget lets only the least run, two turns missed a pooler
// with other clients' traffic once in 50 Lockers (lib/pq): a turn then
// missed about one time in seven, and six turns miss about once in
// 100,000 Lockers, for a dozen round trips once per Pool.
const (
	probeRounds = 8
	probeLeast  = 6
	probeBudget = 20 * time.Millisecond
)

// probeFailed handles a probe statement's error: evidence of a pooler, a
// ctx that ended (the probe is left to the next call), or a failure that
// ends the probe with nothing learnt (the lock call meets it itself).
func (pg *poolerGuard) probeFailed(ctx context.Context, err error) bool {
	p := pg.p
	if poolerEvidence(err) {
		p.sawPooler(stmt.NewPoolerError(err.Error()))
		return true
	}
	return !stmt.CtxEnded(ctx)
}

// probeConnWait bounds the probe's wait for its second connection.
const probeConnWait = time.Second

// discardHolder ends backend pid when it holds k (see sqltext.StrandedSQL),
// from another connection of the pool: a lock statement took k on a
// server session that a pooler hands to others. It returns a channel
// closed once done, or given up (within the unlock timeout).
func (pg *poolerGuard) discardHolder(pid int64, k Key) <-chan struct{} {
	p := pg.p
	return p.freeing(pid, sqltext.StrandedSQL(true), sqltext.StrandedArgs(pid, 0, true, k))
}

// discardStranded ends backend id (pid and start) when it holds an advisory
// lock (see sqltext.StrandedSQL): the server session of a discarded
// session, which a pooler keeps, with whatever the session held.
func (pg *poolerGuard) discardStranded(id ident) <-chan struct{} {
	p := pg.p
	return p.freeing(id.pid, sqltext.StrandedSQL(false), sqltext.StrandedArgs(id.pid, id.backend, false, Key{}))
}

// freeing runs q, a StrandedSQL, on connections of the pool, in the
// background, until it ended backend pid or found nothing to end,
// bounded by the unlock timeout, and logs what it did.
func (pg *poolerGuard) freeing(pid int64, q string, args []any) <-chan struct{} {
	p := pg.p
	done := make(chan struct{})
	g := pg
	g.freesMu.Lock()
	if g.frees == nil {
		g.frees = map[chan struct{}]struct{}{}
	}
	g.frees[done] = struct{}{}
	g.freesMu.Unlock()
	go func() {
		defer func() {
			g.freesMu.Lock()
			delete(g.frees, done)
			g.freesMu.Unlock()
			close(done)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.UnlockTimeout)
		defer cancel()
		var err error
		for ctx.Err() == nil {
			var answer int64
			if answer, err = p.strandedOnce(ctx, q, args); err == nil && answer == 2 {
				time.Sleep(5 * time.Millisecond) // busy in a transaction: asked again once idle
				continue
			}
			if stmt.AdminShutdown(err) {
				answer, err = 1, nil // it ended the session it ran on: the one to end
			}
			if err == nil {
				if answer == 1 {
					p.hooks.Log(ctx, slog.LevelWarn, "sqllock: terminated a pooled server session that kept a lock no one could release", Key{}, false, slog.Int64("pid", pid))
				}
				return
			}
			if !stmt.ConnectionBroken(err) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err == nil {
			err = ctx.Err()
		}
		p.hooks.Log(ctx, slog.LevelError, "sqllock: a pooled server session may keep a lock no one can release: it could not be terminated", Key{}, false, slog.Int64("pid", pid), slog.Any("error", err))
	}()
	return done
}

// AwaitFreed waits until the terminations under way (see discardStranded)
// are done, for at most d, and reports whether they are: a call that
// returns an error for a session a pooler keeps returns once what the
// session took is freed, so that a program that closes its pool next
// does not leave it there.
func (pg *poolerGuard) AwaitFreed(d time.Duration) bool {
	g := pg
	g.freesMu.Lock()
	frees := make([]chan struct{}, 0, len(g.frees))
	for ch := range g.frees {
		frees = append(frees, ch)
	}
	g.freesMu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	for _, ch := range frees {
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
	return true
}

// freedFirst returns err, a call's error, once the terminations under
// way are done (bounded by the unlock timeout) when the Pool has seen a
// pooler: a call refused there returns after what its sessions took is
// freed, so that a program that closes its pool next (which ends the
// terminations' connections) does not leave it there.
func (pg *poolerGuard) freedFirst(err error) error {
	if err != nil && pg.Pooled() != nil {
		pg.AwaitFreed(pg.p.cfg.UnlockTimeout)
	}
	return err
}

// strandedOnce runs q once, in a transaction of its own on a connection
// of the pool: a transaction keeps one server session behind a pooler
// from the statement's parse to its answer, whatever the driver's
// protocol (see inTransaction).
func (pg *poolerGuard) strandedOnce(ctx context.Context, q string, args []any) (int64, error) {
	p := pg.p
	var answer int64
	err := p.inTransaction(ctx, func(conn *sql.Conn) error {
		return stmt.QueryRow(ctx, p.Abandoned, conn, q, args, &answer)
	})
	return answer, err
}

// DetectPooler tells whether a transaction pooler is in front of db's
// server, as a Pool does before its first session-level lock (the probe,
// and the evidence of its statements): it returns the pooler's error
// (matching stmt.ErrSessionChanged) when it saw one, nil when it did not, or
// the error that kept it from asking. It takes nothing, and leaves db's
// connections as they were. For the doctor command.
func DetectPooler(ctx context.Context, db *sql.DB) (pooled, err error) {
	p := NewPool(db, Config{UnlockTimeout: 5 * time.Second}, quietHooks{})
	conn, err := p.TakeConn(ctx)
	if err != nil {
		return nil, err
	}
	defer p.putBack(conn, false) // back to the pool at once, as it was
	if _, err := p.checkServer(ctx, conn); err != nil && p.Pooled() == nil {
		return nil, err
	}
	return p.Pooled(), nil
}

// quietHooks are the Hooks of a Pool no one listens to.
type quietHooks struct{}

func (quietHooks) Name(k Key) string { return keyString(k) }
func (quietHooks) Event(Event)       {}
func (quietHooks) Log(context.Context, slog.Level, string, Key, bool, ...slog.Attr) {
}
