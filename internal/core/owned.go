package core

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Owned is the core of a user's Session: many exclusive locks on one
// session, whose connection the caller may also use (Conn). Every lock of
// it lives and dies with that one server session: when it is lost, all
// its locks are gone at once. Its calls run one at a time (calls); Err,
// Held and Done never wait for one. It is safe for concurrent use.
type Owned struct {
	p   *Pool
	s   *session
	pid int64
	id  ident
	ls  *lease

	// calls serialises the Owned's calls, and is held across their round
	// trips.
	calls callSlot

	// mu guards the fields below. It is never held across a round trip,
	// so that the keep-alive, Err and Held never wait for a call in
	// progress (a blocking Lock can wait for a long time).
	// Its state is holdHeld (usable), holdLost or holdReleased.
	lifecycle
	held      keySet // guarded by mu: keys held now
	releasing keySet // guarded by mu: keys whose unlock is under way
}

// callSlot serialises an Owned's calls: one at a time; a call that waits
// for its turn gives up when its ctx ends.
type callSlot chan struct{}

func (c callSlot) lock()   { c <- struct{}{} }
func (c callSlot) unlock() { <-c }

func (c callSlot) tryLock() bool {
	select {
	case c <- struct{}{}:
		return true
	default:
		return false
	}
}

// Open pins a session for an Owned. It checks that the server is not a
// standby (unless AllowStandby) in the same round trip that learns the
// backend pid and applies the lock session's settings. ctx bounds only
// this call.
func (p *Pool) Open(ctx context.Context) (*Owned, error) {
	o, err := p.open(ctx)
	return o, p.freedFirst(err)
}

// open is Open, without waiting for what a pooler's evidence frees.
func (p *Pool) open(ctx context.Context) (*Owned, error) {
	const what = "session"
	if p.Closed() {
		return nil, closedError(what)
	}
	if p.cfg.TxPooler {
		return nil, ErrPinnedSession
	}
	sent := stmt.MonoNow()
	conn, err := p.TakeConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqllock: %s: get connection: %w", what, err)
	}
	id, err := p.checkServer(ctx, conn)
	if err != nil || stmt.CtxEnded(ctx) { // (a check's answer is read past ctx's end)
		p.putBack(conn, err == nil)
		if err == nil {
			err = fmt.Errorf("sqllock: %s: %w", what, stmt.CtxErr(ctx))
		}
		return nil, err
	}
	s := p.newSession(conn, id, kindOwned, sent)
	var pid int64
	var standby bool
	q, args := p.sql().SessionSQL(s.mark)
	err = stmt.QueryRow(ctx, p.Abandoned, conn, q, args, &pid, &standby, stmt.Skip)
	if err == nil && pid != 0 {
		err = s.sameBackend(pid, false, Key{})
	}
	if err != nil || pid == 0 {
		if err == nil {
			err = stmt.ForeignSession() // nothing was applied
		}
		// Its settings may be applied: not given back. (A statement the
		// Pool abandoned closes its connection as it returns: the discard
		// does not wait for it.)
		s.discard(err)
		return nil, fmt.Errorf("sqllock: %s: %w", what, err)
	}
	s.pid, s.tuned = pid, true
	if standby && !p.cfg.AllowStandby {
		s.close() // its settings set back, back to the pool
		return nil, stmt.StandbyError(what)
	}
	o := &Owned{p: p, s: s, pid: pid, id: id, ls: s.ls, calls: make(callSlot, 1)}
	s.mu.Lock()
	s.owner = o
	s.mu.Unlock()
	p.mon.add(o)
	if p.Closed() {
		o.Close() // opened as the Pool started closing (see Acquire)
		return nil, closedError(what)
	}
	return o, nil
}

// PID returns the backend of the session.
func (o *Owned) PID() int64 { return o.pid }

// begin starts a call: it takes calls, or returns an error matching
// stmt.ErrNotAcquired and ctx's error when ctx ends first (a call of the
// Owned's waits, as long as its caller lets it), and checks that the
// Owned is usable. end must follow when begin returns nil.
func (o *Owned) begin(ctx context.Context) error {
	select {
	case o.calls <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w: another call of the Session's is under way: %w", stmt.ErrNotAcquired, ctx.Err())
	}
	if o.ls.expired() {
		o.lose(o.ls.expiredError())
	}
	if err := o.Err(); err != nil {
		o.calls.unlock()
		return err
	}
	o.ls.begin() // the session is busy, not idle, until end
	return nil
}

// callDone finishes a call. (An Owned that the keep-alive found lost while the
// call ran had its connection discarded as the call's statement returned.)
func (o *Owned) callDone() {
	o.ls.done(0, false)
	if o.Err() == nil && o.ls.due() {
		// A long call (a wait): show life now, rather than at the
		// keep-alive's next tick, which could find the lease expired.
		if err := o.touchLocked(o.p.UnlockContext()); err != nil {
			o.lose(fmt.Errorf("the statement that keeps its session from going idle failed: %w", err))
		}
	}
	o.calls.unlock()
}

// Lock takes k, waiting while another session holds it; a key the Owned
// already holds is not taken twice. A ctx with a deadline bounds the wait
// in the server, which ends it just before the deadline: Lock then
// returns an error matching stmt.ErrNotAcquired and context.DeadlineExceeded,
// and the Owned keeps its locks. A ctx cancelled during the wait (or a
// deadline too close to call) ends the whole Owned, with the same error.
func (o *Owned) Lock(ctx context.Context, k Key) (err error) {
	if err := o.begin(ctx); err != nil {
		return err
	}
	defer o.callDone()
	if o.holds(k) {
		return nil
	}
	what := namer{p: o.p, k: k}
	if err := ctx.Err(); err != nil { // nothing sent: the Owned is intact
		return stmt.NotAcquired(what.String(), err)
	}
	defer func() { err = o.p.freedFirst(o.p.timedOut(err)) }()
	// The engine's wait for an Owned: one statement, visible to
	// PostgreSQL's deadlock detector (the Owned holds other locks).
	var oc wait.Outcome
	if err := o.s.withConn(func(conn *sql.Conn) error {
		oc = o.p.waitOn(ctx, wait.ConnWaiter{Conn: conn, Blind: o.p.Abandoned, Mark: o.s.mark}, wait.SessionLevel, o.p.sql(), 0, k, o.pid)
		return oc.Err
	}); oc.Err == nil && err != nil {
		oc.Err = err // the session was ended before the wait began
	}
	// The Owned's server was checked when it opened: a standby's answer
	// is not asked about again.
	switch v, err := judge(ctx, oc, what, true, o.pid); {
	case v == uncertain && errors.Is(oc.Err, sql.ErrConnDone) && o.Err() != nil:
		return o.Err() // lost (by the keep-alive) before the wait began
	case v == stray:
		// A wait statement the server failed (a full lock table, a
		// deadlock) may have been granted its key first (its settings
		// come after the grant; a session-level lock outlives the
		// statement): released, or the Owned goes, as for a TryLock.
		if rerr := o.s.releaseStray([]Key{k}); rerr != nil {
			o.lose(fmt.Errorf("after a refused wait: %w", rerr))
			return errors.Join(err, o.Err())
		}
		return err
	case v == refused:
		return err
	case v == uncertain:
		o.lose(err)
		if errors.Is(err, stmt.ErrSessionChanged) {
			return o.Err()
		}
		return err
	}
	if err := o.Err(); err != nil {
		// Granted to a session found lost during the wait: it goes, and
		// what it holds with it.
		return err
	}
	o.add([]Key{k})
	return nil
}

// TryLock tries to take every key in keys that no other session holds, in
// one round trip, and returns those the Owned holds once it returns, in
// the order given: a key it already held is not taken twice, and is
// returned; a repeated key is returned once. When the server's lock table
// is full it returns stmt.ErrLockTableFull and releases whatever this call
// took. A ctx already done returns an error matching stmt.ErrNotAcquired and
// leaves the Owned as it was; a ctx that ends during the statement ends
// the Owned, since what it took is then unknown.
func (o *Owned) TryLock(ctx context.Context, keys []Key) (_ []Key, err error) {
	if err := o.begin(ctx); err != nil {
		return nil, err
	}
	defer o.callDone()
	defer func() { err = o.p.freedFirst(err) }()
	if err := ctx.Err(); err != nil && len(keys) > 0 { // nothing sent: the Owned is intact
		return nil, stmt.NotAcquired(o.p.name(keys[0]), err)
	}
	want := o.notHeld(keys)
	if len(want) == 0 {
		return o.heldOf(keys), nil
	}
	query := func(q string, args []any, dest ...any) error {
		return o.s.queryRowCtx(ctx, q, args, dest...)
	}
	took, err := stmt.Many(o.p.Mode, query, sqltext.BatchTry, o.pid, want, nil)
	if stmt.CtxEnded(ctx) || err != nil {
		return nil, o.tryLockFailed(ctx, want, err)
	}
	got := make([]Key, 0, len(want))
	for i, k := range want {
		if took[i] {
			got = append(got, k)
		}
	}
	o.add(got)
	o.p.stats.contended.Add(int64(len(want) - len(got)))
	return o.heldOf(keys), nil
}

// tryLockFailed settles a TryLock statement that failed (err) or whose ctx
// ended, and returns the error to report.
func (o *Owned) tryLockFailed(ctx context.Context, want []Key, err error) error {
	what := namer{p: o.p, k: want[0]}
	switch {
	case errors.Is(err, sql.ErrConnDone) && o.Err() != nil:
		return o.Err() // lost (by the keep-alive) before the statement
	case stmt.CtxEnded(ctx):
		o.lose(fmt.Errorf("TryLock was cancelled: %w", stmt.CtxErr(ctx)))
		return stmt.NotAcquired(what.String(), stmt.CtxErr(ctx))
	case errors.Is(err, stmt.ErrSessionChanged):
		o.lose(err)
		return o.Err()
	case stmt.LockTableFull(err):
		// Session locks taken by the failed statement stay held: find and
		// release them, keeping the Owned's earlier locks.
		if rerr := o.s.releaseStray(want); rerr != nil {
			o.lose(fmt.Errorf("after a full lock table: %w", rerr))
		}
		return fmt.Errorf("%w: TryLock of %d keys: %w", stmt.ErrLockTableFull, len(want), err)
	}
	o.lose(fmt.Errorf("TryLock failed: %w", err))
	return stmt.LockError(what.String(), err)
}

// Unlock releases keys in one round trip; a key given twice is released
// once. Each must be held by the Owned: unlocking a key it does not hold
// is an error, and nothing happens on the server. When PostgreSQL does not
// confirm every unlock on the Owned's backend, the Owned is lost (and its
// connection discarded) and the error wraps stmt.ErrLockLost. It is bounded by
// the unlock timeout.
func (o *Owned) Unlock(keys []Key) error {
	if err := o.begin(context.Background()); err != nil {
		return err
	}
	defer o.callDone()
	uniq, missing := o.heldOnce(keys)
	if missing != nil {
		return fmt.Errorf("sqllock: unlock %s: not held by this session", o.p.name(*missing))
	}
	return o.unlockKeys(uniq)
}

// unlockKeys releases keys, which the Owned holds, in one statement, and
// forgets them; when an unlock is not confirmed on the Owned's backend it
// loses the Owned. The caller holds calls.
func (o *Owned) unlockKeys(keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	o.markReleasing(keys)
	released := false
	defer func() { o.releaseDone(keys, released) }()
	answers, err := o.s.sendUnlocks(o.p.UnlockContext(), nil, keys, len(keys), false)
	what, all := namer{p: o.p, k: keys[0]}, err == nil
	for i, ok := range answers {
		if !ok && all {
			what, all = namer{p: o.p, k: keys[i]}, false
		}
	}
	if len(keys) > 1 {
		what = namer{label: fmt.Sprintf("%s (of %d keys)", what, len(keys))}
	}
	// An unlock not confirmed on the Owned's backend, certainly or not,
	// loses the whole Owned: its locks live and die together.
	if _, uerr := unlockVerdict(what, o.pid, err, all); uerr != nil {
		o.lose(uerr)
		if o.p.Pooled() != nil {
			o.p.AwaitFreed(o.p.cfg.UnlockTimeout) // see discardStranded
		}
		if errors.Is(uerr, stmt.ErrLockLost) {
			return o.Err()
		}
		return uerr
	}
	released = true
	return nil
}

// Close releases every lock the Owned holds, confirming each unlock, and
// gives its session back to the pool as it came (see session.closeConn);
// when an unlock is not confirmed, the session is discarded and the error
// wraps stmt.ErrLockLost. Close on a closed Owned returns stmt.ErrReleased; on a
// lost one, its Err.
func (o *Owned) Close() error {
	o.calls.lock()
	defer o.calls.unlock()
	o.mu.Lock()
	state, err := o.state, o.err
	keys := make([]Key, 0, o.held.len())
	o.held.each(func(k Key) { keys = append(keys, k) })
	o.mu.Unlock()
	switch state {
	case holdReleased:
		return stmt.ErrReleased
	case holdLost:
		o.settle(holdReleased, err)
		return err
	}
	if err := o.unlockKeys(keys); err != nil {
		o.settle(holdReleased, o.Err())
		return err
	}
	o.p.mon.remove(o)
	final := stmt.ErrReleased
	if o.p.Closed() {
		final = errReleasedByClose
	}
	o.settle(holdReleased, final)
	o.s.close()
	return nil
}

// Conn returns the pinned connection: the session that holds the locks.
// Once it was called, the session is closed, not given back to the pool,
// when the Owned closes; and it is not leased any more (statements of the
// caller's own must not meet the core's).
func (o *Owned) Conn() *sql.Conn {
	if o.ls != nil && !o.ls.off.Load() {
		o.calls.lock()
		err := o.p.stopLease(o.ls, func(ctx context.Context, q string) error {
			var v int64
			return o.s.queryRowCtx(ctx, q, nil, &v)
		})
		if err != nil {
			o.lose(fmt.Errorf("its session could not be handed out: %w", err))
		}
		o.calls.unlock()
	}
	o.s.handedOut.Store(true)
	return o.s.conn
}

// Err returns nil while the Owned is usable, stmt.ErrReleased after Close, and
// an error wrapping stmt.ErrLockLost once it is lost.
func (o *Owned) Err() error {
	if o.ls.expired() {
		o.lose(o.ls.expiredError())
	}
	return o.error()
}

// Held returns the keys the Owned holds, in no order.
func (o *Owned) Held() []Key {
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := make([]Key, 0, o.held.len())
	o.held.each(func(k Key) { keys = append(keys, k) })
	return keys
}

// lose marks the Owned lost and discards its session: the server releases
// its locks as the session ends. It never waits for a call in progress
// (that call's statement discards the connection as it returns), so the
// keep-alive and the Owned's own calls use it alike.
func (o *Owned) lose(cause error) { o.s.discard(cause) }

// markLost marks a usable Owned lost, forgets its locks and counts them
// (its session was discarded: see session.discard); it returns the loss to tell, and
// false when the Owned was not usable.
func (o *Owned) markLost(cause error) (lossNote, bool) {
	o.mu.Lock()
	if o.state != holdHeld {
		o.mu.Unlock()
		return lossNote{}, false
	}
	n := int64(o.held.len())
	o.state = holdLost
	o.err = fmt.Errorf("%w: session on backend %d (%d locks): %w", stmt.ErrLockLost, o.pid, n, cause)
	o.held = keySet{}
	err := o.err
	o.mu.Unlock()
	o.p.mon.remove(o)
	e := Event{Kind: EventLost, Owned: true, PID: o.pid, Err: err, N: n}
	o.p.stats.lostHeld(n)
	return lossNote{o.p, e, o.closeDone}, true
}

// holds reports whether the Owned holds k.
func (o *Owned) holds(k Key) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held.has(k)
}

// heldOnce returns keys without repeats, or the first key the Owned does
// not hold.
func (o *Owned) heldOnce(keys []Key) ([]Key, *Key) {
	o.mu.Lock()
	defer o.mu.Unlock()
	uniq := make([]Key, 0, len(keys))
	var seen keySet
	for i, k := range keys {
		if seen.has(k) {
			continue
		}
		if !o.held.has(k) {
			return nil, &keys[i]
		}
		seen.add(k)
		uniq = append(uniq, k)
	}
	return uniq, nil
}

// heldOf returns the keys of keys the Owned holds, without repeats, in the
// order given.
func (o *Owned) heldOf(keys []Key) []Key {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Key
	var seen keySet
	for _, k := range keys {
		if o.held.has(k) && !seen.has(k) {
			seen.add(k)
			out = append(out, k)
		}
	}
	return out
}

// notHeld returns keys without repeats and without those the Owned holds.
func (o *Owned) notHeld(keys []Key) []Key {
	o.mu.Lock()
	defer o.mu.Unlock()
	want := make([]Key, 0, len(keys))
	var seen keySet
	for _, k := range keys {
		if !o.held.has(k) && !seen.has(k) {
			seen.add(k)
			want = append(want, k)
		}
	}
	return want
}

// add records keys as held.
func (o *Owned) add(keys []Key) {
	if len(keys) == 0 {
		return
	}
	o.mu.Lock()
	for _, k := range keys {
		o.held.add(k)
	}
	o.mu.Unlock()
	o.p.stats.took(int64(len(keys)))
}

// markReleasing marks keys as being released, until releaseDone.
func (o *Owned) markReleasing(keys []Key) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, k := range keys {
		o.releasing.add(k)
	}
}

// releaseDone ends the release of keys; when the server confirmed it, the
// keys the Owned held are forgotten in the same step, so that the
// keep-alive never sees them held and not being released in between.
func (o *Owned) releaseDone(keys []Key, released bool) {
	o.mu.Lock()
	n := int64(0)
	for _, k := range keys {
		o.releasing.remove(k)
		if released && o.held.has(k) {
			o.held.remove(k)
			n++
		}
	}
	o.mu.Unlock()
	o.p.stats.released(n)
}

// The keep-alive's view of an Owned (see watched).

// heldKeys returns the keys held and not being released. It takes only
// mu, so a call waiting in the server never delays the keep-alive.
func (o *Owned) heldKeys(buf []heldKey) []heldKey {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.held.each(func(k Key) {
		if !o.releasing.has(k) {
			buf = append(buf, heldKey{pid: o.pid, id: o.id, key: k})
		}
	})
	return buf
}

// loseKey loses the Owned when the keep-alive found k gone, unless k is no
// longer held or is being released: the keep-alive's query may have run
// after an unlock that its snapshot of the keys did not know of.
func (o *Owned) loseKey(k Key, cause error) {
	o.mu.Lock()
	gone := o.held.has(k) && !o.releasing.has(k)
	o.mu.Unlock()
	if gone {
		o.lose(fmt.Errorf("%s: %w", o.p.name(k), cause))
	}
}

func (o *Owned) leaseOf() *lease { return o.ls }

// touch runs the lease's statement on the Owned's connection, unless a
// call is in progress (its session is not idle).
func (o *Owned) touch(ctx context.Context) error {
	if !o.calls.tryLock() {
		return nil
	}
	defer o.calls.unlock()
	if o.Err() != nil {
		return nil
	}
	return o.touchLocked(ctx)
}

// touchLocked is touch; the caller holds calls.
func (o *Owned) touchLocked(ctx context.Context) error {
	var v int64
	return o.s.queryRowCtx(ctx, touchSQL, nil, &v) // a sign of life when it answers
}
