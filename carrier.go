package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// carrier is a session shared by many Locks of one Locker (the rules of
// sharing are in share.go): it carries their locks, sends their statements
// a batch at a time (submit), goes back to the pool a while after its last
// lock (closeIfEmpty), and, after an uncertain outcome, is discarded with
// every lock on it (fail).
type carrier struct {
	l    *Locker
	conn *sql.Conn
	id   ident  // who granted its locks (see checkServer)
	ls   *lease // its idle clock (see lease.go)
	// dedicated: a session of one lock (a lock that waited, a shared-mode
	// lock, a permit, a candidate, any lock of WithDedicatedSessions),
	// which no other call picks, whose statements are st (the lock's
	// settings, a candidate's name), and which ends with its lock: its
	// unlock sets the settings back, and it goes back to the pool then.
	dedicated bool
	st        *statements

	mu sync.Mutex
	// pid is its backend, learnt from its first answer (0 until then);
	// tuned, whether the lock session's settings are applied (by its first
	// granted try). Both are set by the runner, under mu, before the
	// answer is told: whoever holds an outcome of it reads them without mu.
	pid     int64
	tuned   bool
	held    map[*Lock]struct{} // guarded by mu: the Locks it carries
	users   int                // guarded by mu: calls that picked it and have not finished
	queue   []*shareOp         // guarded by mu: operations waiting for the runner
	running bool               // guarded by mu: a runner is sending the queue
	retired bool               // guarded by mu: takes no new lock; closed once empty
	dead    error              // guarded by mu: the session is lost or discarded
	closed  bool               // guarded by mu: gone back to the pool
	linger  *time.Timer        // guarded by mu: closes it (lingered) once armed; made once
	armed   bool               // guarded by mu: linger is counting down
	idleAt  int64              // guarded by mu: monoNow when it last became idle (holding nothing, no call)
	spare   []*shareOp         // guarded by mu: the last batch's slice, for the next queue

	gone chan struct{} // closed once a dead carrier's connection is discarded

	// connMu is held across each statement on conn, and by whoever ends
	// conn (closes, resets or discards it): database/sql's Conn is not safe
	// to close while a call on it is starting (that call can find its
	// driver connection gone, and panic). connDone, guarded by connMu: conn
	// was ended; later statements fail with sql.ErrConnDone.
	connMu   sync.Mutex
	connDone bool
}

// endConn ends conn with end (close it, reset it, discard it) once no
// statement of the queue's is on it, and only once.
func (c *carrier) endConn(end func()) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if !c.connDone {
		c.connDone = true
		end()
	}
}

type shareOpKind uint8

const (
	opTry    shareOpKind = iota // pg_try_advisory_lock
	opUnlock                    // pg_advisory_unlock
	opTag                       // a statement about one lock's tag (Token, HeldSQL)
)

// shareOp is one operation on a carrier.
type shareOp struct {
	kind   shareOpKind
	key    Key
	shared bool   // opUnlock: of a shared-mode lock
	q      string // opTag
	args   []any  // opTag
	state  atomic.Uint32
	done   chan struct{} // closed when the outcome is known

	ok  bool  // opTry: granted; opUnlock: released; opTag: a row came
	v   int64 // opTag's answer
	err error // the statement failed (the carrier is then discarded)

	after func() // run by the runner once the outcome is known (nil: none)
}

// A try's state: pending until the runner decides it, or abandoned by a
// caller whose ctx ended first (a grant is then undone by the runner).
const (
	opPending uint32 = iota
	opAbandoned
	opDecided
)

func newOp(kind shareOpKind, k Key) *shareOp {
	return &shareOp{kind: kind, key: k, done: make(chan struct{})}
}

// newDedicated makes conn, backend pid, whose lock statement st just
// granted it a lock (and applied its settings), the dedicated session of
// that lock.
func newDedicated(l *Locker, conn *sql.Conn, id ident, st *statements, pid int64, ls *lease) *carrier {
	return &carrier{l: l, conn: conn, id: id, ls: ls, dedicated: true, st: st, pid: pid, tuned: true, held: map[*Lock]struct{}{}, gone: make(chan struct{})}
}

// err returns why the carrier is dead.
func (c *carrier) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

// errLocked is err, for a caller that holds c.mu.
func (c *carrier) errLocked() error {
	if c.dead != nil {
		return c.dead
	}
	return errors.New("shared session closed")
}

// idleLocked reports whether c holds nothing and nothing is under way on
// it: it may go back to the pool. The caller holds c.mu.
func (c *carrier) idleLocked() bool {
	return c.dead == nil && !c.closed && c.users == 0 && len(c.held) == 0 && !c.running && len(c.queue) == 0
}

// attach records lk as carried; false when the carrier died meanwhile.
func (c *carrier) attach(lk *Lock) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead != nil {
		return false
	}
	c.held[lk] = struct{}{}
	return true
}

// detach forgets lk and frees its key, which the server no longer holds
// for this carrier (a dedicated session's key was never reserved).
func (c *carrier) detach(lk *Lock) {
	if !c.dedicated {
		c.l.share.free(lk.key)
	}
	c.mu.Lock()
	_, ok := c.held[lk]
	delete(c.held, lk)
	c.mu.Unlock()
	if ok {
		c.maybeLinger()
	}
}

// leave ends a call's use of the carrier.
func (c *carrier) leave() {
	c.mu.Lock()
	c.users--
	c.mu.Unlock()
	c.maybeLinger()
}

// maybeLinger notes that a carrier holds nothing now, and starts the
// countdown that closes it, unless one runs. The countdown is not stopped
// when a call picks the carrier: when it ends, the carrier closes only if
// it has stayed idle for carrierLinger since it last became idle (most
// carriers are picked again at once; a timer reset per lock would cost
// more than the lock's own bookkeeping).
func (c *carrier) maybeLinger() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dedicated || !c.idleLocked() {
		return // a dedicated session ends with its lock (release)
	}
	c.idleAt = monoNow()
	if c.armed {
		return
	}
	c.armed = true
	if c.linger == nil {
		c.linger = time.AfterFunc(carrierLinger, c.lingered)
	} else {
		c.linger.Reset(carrierLinger)
	}
}

// lingered is the countdown's end: a carrier idle for carrierLinger is
// closed; one idle for less counts down the rest; one in use is left to
// its next maybeLinger.
func (c *carrier) lingered() {
	c.mu.Lock()
	c.armed = false
	idle := c.idleLocked()
	if rest := carrierLinger - time.Duration(monoNow()-c.idleAt); idle && rest > 0 {
		c.armed = true
		c.linger.Reset(rest)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if idle {
		c.closeIfEmpty()
	}
}

// unarmLocked stops the countdown to closing (the carrier is dead); c.mu
// is held.
func (c *carrier) unarmLocked() {
	if c.armed {
		c.linger.Stop()
		c.armed = false
	}
}

// closeIfEmpty resets a carrier that still holds nothing and gives it
// back to the pool.
func (c *carrier) closeIfEmpty() {
	s := &c.l.share
	s.mu.Lock()
	c.mu.Lock()
	if !c.idleLocked() {
		c.mu.Unlock()
		s.mu.Unlock()
		return
	}
	c.closed = true // no call picks it now
	tuned := c.tuned
	c.mu.Unlock()
	s.mu.Unlock()
	c.endConn(func() {
		if tuned {
			c.l.closeSession(c.conn, c.pid)
		} else {
			c.conn.Close() // it never held a lock: nothing to set back
		}
	})
	s.mu.Lock()
	s.remove(c) // counted until its reset is done
	s.mu.Unlock()
}

// unlock sends the unlock of k (in mode shared) through c's queue, and
// returns the answer as unlockAnswer reads it. An uncertain one has
// failed c already.
func (c *carrier) unlock(k Key, shared bool) (uncertain bool, err error) {
	op := newOp(opUnlock, k)
	op.shared = shared
	c.submit(op)
	<-op.done
	return unlockAnswer(c.l.name(k), c.pid, op.err, op.ok)
}

// releaseKey releases k, the one key of a dedicated session that no Lock
// holds (a standby's unwanted grant), and ends the session.
func (c *carrier) releaseKey(k Key, shared bool) error {
	uncertain, err := c.unlock(k, shared)
	c.ended(err, uncertain)
	return err
}

// ended ends a dedicated session after the unlock of its one key: back to
// the pool when the server confirmed it (the unlock set the settings
// back), discarded otherwise, even after a certain "not held" (an
// uncertain answer failed it already).
func (c *carrier) ended(err error, uncertain bool) {
	switch {
	case err == nil:
		c.closeDedicated()
	case !uncertain:
		c.fail(err)
	}
}

// closeDedicated gives a dedicated session back to the pool once the
// server confirmed the unlock of its lock (which set its settings back).
func (c *carrier) closeDedicated() {
	c.mu.Lock()
	closing := c.dead == nil && !c.closed
	c.closed = true
	c.mu.Unlock()
	if closing {
		c.endConn(func() { c.conn.Close() })
	}
}

// handOver gives a carrier that holds nothing, and has nothing under way,
// to a call that found its key held, to wait on: the carrier closes (no
// call picks it from now on) and its connection becomes the waiter's, its
// pid known, its settings applied when tuned is true (to be set back
// should the wait not be granted). ok is false when the carrier is in use.
func (c *carrier) handOver() (conn *sql.Conn, pid int64, tuned, ok bool) {
	s := &c.l.share
	s.mu.Lock()
	defer s.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.idleLocked() || c.pid == 0 {
		return nil, 0, false, false
	}
	c.closed = true
	c.unarmLocked()
	s.remove(c)
	return c.conn, c.pid, c.tuned, true
}

// submit queues op; the first caller to find the carrier idle becomes its
// runner and sends the queue, batch after batch, until it is empty.
func (c *carrier) submit(op *shareOp) {
	if c.enqueue(op) {
		c.drain()
	}
}

// enqueue queues op and reports whether the caller must run the queue
// (drain): no runner was running. On a dead carrier, op fails at once.
func (c *carrier) enqueue(op *shareOp) bool {
	c.mu.Lock()
	if c.dead != nil || c.closed {
		op.err = c.errLocked()
		c.mu.Unlock()
		c.finish(op)
		return false
	}
	if c.queue == nil {
		c.queue, c.spare = c.spare, nil
	}
	c.queue = append(c.queue, op)
	if c.running {
		c.mu.Unlock()
		return false
	}
	c.running = true
	c.mu.Unlock()
	return true
}

// drain sends the queue, batch after batch, until it is empty; the caller
// is the runner (enqueue returned true).
func (c *carrier) drain() {
	c.mu.Lock()
	for len(c.queue) > 0 && c.dead == nil && !c.closed {
		batch := c.queue
		c.queue = nil
		c.mu.Unlock()
		c.run(batch)
		clear(batch)
		c.mu.Lock()
		if c.spare == nil {
			c.spare = batch[:0]
		}
	}
	rest := c.queue
	c.queue = nil
	c.running = false
	var why error
	if len(rest) > 0 {
		why = c.errLocked() // dead, or closed: a dedicated session ended with its lock
	}
	c.mu.Unlock()
	for _, o := range rest {
		o.err = why
		c.finish(o)
	}
	c.maybeLinger()
}

// queryRow and queryRows run one statement on the carrier's session, the
// lease's busy mark around it: its outcome is recorded as a sign of life
// before any caller hears it, so a caller that is told (and the process
// stopped right after) never meets a lease that still looks busy.
func (c *carrier) queryRow(q string, args []any, dest ...any) error {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.connDone {
		return sql.ErrConnDone
	}
	sent := c.ls.begin()
	err := queryRow(c.l.unlockContext(), c.l.abandoned, c.conn, q, args, dest...)
	c.ls.end(sent, err == nil || errors.Is(err, sql.ErrNoRows))
	return err
}

func (c *carrier) queryRows(q string, args []any, row func([]driver.Value) error) error {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.connDone {
		return sql.ErrConnDone
	}
	sent := c.ls.begin()
	err := queryRows(c.l.unlockContext(), c.l.abandoned, c.conn, q, args, row)
	c.ls.end(sent, err == nil)
	return err
}

// finish reports op's outcome.
func (c *carrier) finish(op *shareOp) {
	if op.kind == opTry {
		if op.state.CompareAndSwap(opPending, opDecided) {
			// The caller takes the outcome.
		} else if op.ok {
			// Its caller left: undo the grant.
			op.ok = false
			c.unlockAsync(op.key)
		} else {
			c.l.share.free(op.key)
		}
	}
	if op.after != nil {
		op.after()
	}
	close(op.done)
}

// unlockAsync releases k, which this carrier holds for no Lock, without
// waiting; k is freed once the server confirmed it (or the carrier is gone).
// The unlock is queued before unlockAsync returns, so the carrier never
// looks empty (and goes back to the pool) while it holds k.
func (c *carrier) unlockAsync(k Key) {
	op := newOp(opUnlock, k)
	op.after = func() { c.l.share.free(k) }
	if c.enqueue(op) {
		go c.drain()
	}
}

// run sends one batch: the tag statements one by one, then the unlocks,
// then the tries, each kind in as few statements as possible.
func (c *carrier) run(batch []*shareOp) {
	if len(batch) == 1 && batch[0].kind != opTag && batch[0].state.Load() != opAbandoned {
		c.runMany(batch, batch[0].kind == opUnlock) // one key, the common case
		return
	}
	var tries, unlocks []*shareOp
	for _, op := range batch {
		switch {
		case op.kind == opTag:
			c.runTag(op)
		case op.kind == opUnlock:
			unlocks = append(unlocks, op)
		case op.state.Load() == opAbandoned:
			c.finish(op) // never sent
		default:
			tries = append(tries, op)
		}
	}
	c.runMany(unlocks, true)
	c.runMany(tries, false)
}

// runMany sends ops (all unlocks, or all tries) in statements of up to
// ManyRowsMax keys.
func (c *carrier) runMany(ops []*shareOp, unlock bool) {
	for len(ops) > 0 {
		n := min(len(ops), sqltext.ManyRowsMax)
		if c.isDead() {
			for _, op := range ops {
				op.err = c.err()
				c.finish(op)
			}
			return
		}
		switch {
		case n == 1:
			c.runOne(ops[0], unlock)
		case !c.tuned && c.tune() != nil:
			continue // failed, and so dead: the loop's next turn tells ops
		default:
			c.runBatch(ops[:n], unlock)
		}
		ops = ops[n:]
	}
}

func (c *carrier) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead != nil
}

// runOne sends one try or unlock: the single-key statements, the cheapest.
func (c *carrier) runOne(op *shareOp, unlock bool) {
	var err error
	if unlock {
		st := c.l.plain
		if c.dedicated {
			st = c.st // it sets the lock's settings back too
		}
		q, args := st.UnlockSQL(op.shared, op.key.sqlKey(), c.pid)
		err = c.queryRow(q, args, &op.ok)
		if errors.Is(err, sql.ErrNoRows) {
			err = sessionChanged(c.pid, 0)
		}
	} else {
		// Until a try is granted on it, the session's settings are not
		// applied: its tries are a dedicated lock's, which apply them
		// when granted.
		st := c.l.plain
		if !c.tuned {
			st = c.l.sql()
		}
		q, args := st.TrySQL(sqltext.Try, op.key.sqlKey())
		var pid int64
		var standby bool
		err = c.queryRow(q, args, &op.ok, &pid, &standby)
		if err == nil {
			err = c.answered(pid, standby, op.ok && !c.tuned)
		}
	}
	if err != nil {
		op.ok = false
		op.err = err
		// A try the server failed may have taken its key before it failed
		// (a statement that applies the settings fails after the grant;
		// session-level locks outlive a failed statement): released, as in
		// a batch, or the carrier goes.
		if unlock || !serverRefused(err) || c.releaseStray([]sqltext.Key{op.key.sqlKey()}) != nil {
			c.fail(err)
		}
	}
	c.finish(op)
}

// answered records what a statement's answer says of the session: its
// backend pid (learnt from the first answer, the same in every later one),
// whether it is a standby (refused unless WithAllowStandby), and, when
// tuned, that its settings are now applied.
func (c *carrier) answered(pid int64, standby, tuned bool) error {
	if c.pid != 0 && pid != c.pid {
		return sessionChanged(c.pid, pid)
	}
	if c.pid == 0 || tuned {
		c.mu.Lock()
		c.pid = pid
		c.tuned = c.tuned || tuned
		c.mu.Unlock()
	}
	if standby && !c.l.cfg.allowStandby {
		// Discarded: what it took there goes with the session.
		return standbyError("lock")
	}
	return nil
}

// tune applies the lock session's settings before a batch of tries (a
// single try applies them itself when granted); on failure the carrier is
// dead.
func (c *carrier) tune() error {
	var pid int64
	var standby bool
	err := c.queryRow(c.l.sql().SessionSQL(), nil, &pid, &standby, skip)
	if err == nil {
		err = c.answered(pid, standby, true)
	}
	if err != nil {
		c.fail(err)
	}
	return err
}

// serverRefused reports whether err is the server's own answer to a try
// statement (a full lock table, say): the statement failed as a whole;
// once what it may have taken is released (releaseStray), a certain answer
// touches that one call, and the carrier and its other locks are not
// concerned.
func serverRefused(err error) bool {
	return sqlState(err) != "" && !connectionBroken(err)
}

// releaseStray unlocks those of keys (the keys of a try statement that the
// server failed) that the session holds: the statement took them before it
// failed, and session-level locks outlive a failed statement. No other
// Lock of the carrier holds any of them (the keys of a carrier's
// operations are reserved).
func (c *carrier) releaseStray(keys []sqltext.Key) error {
	want := map[sqltext.Key]bool{}
	for _, k := range keys {
		want[k] = true
	}
	var stray []sqltext.Key
	err := c.queryRows(sqltext.OwnSQL, nil, func(v []driver.Value) error {
		r := pglocks.Scan(v)
		if !r.Granted || r.Shared {
			return nil
		}
		if k, ok := keyFromLockTag(r.Tag); ok && want[k.sqlKey()] {
			stray = append(stray, k.sqlKey())
		}
		return nil
	})
	for _, k := range stray {
		if err != nil {
			break
		}
		var released bool
		q, args := c.l.plain.UnlockSQL(false, k, c.pid)
		err = c.queryRow(q, args, &released)
		if err == nil && !released {
			err = errors.New("sqllock: a key the failed statement took was not held")
		}
	}
	return err
}

// runBatch sends many tries or unlocks in one statement.
func (c *carrier) runBatch(ops []*shareOp, unlock bool) {
	keys := make([]sqltext.Key, len(ops))
	for i, op := range ops {
		keys[i] = op.key.sqlKey()
	}
	fn := "pg_try_advisory_lock"
	if unlock {
		fn = "pg_advisory_unlock"
	}
	got, err := many(c.l.mode, c.queryRows, fn, c.pid, keys)
	for i, op := range ops {
		op.ok = got[i]
	}
	if err != nil {
		for _, op := range ops {
			op.ok, op.err = false, err
		}
		// The server failed the tries (a full lock table): what the
		// statement took before it failed is released, and the calls are
		// told, certainly, that they took nothing; anything less certain
		// costs the carrier.
		if unlock || !serverRefused(err) || c.releaseStray(keys) != nil {
			c.fail(err)
		}
	}
	for _, op := range ops {
		c.finish(op)
	}
}

// runTag runs a statement about one lock's tag.
func (c *carrier) runTag(op *shareOp) {
	err := c.queryRow(op.q, op.args, &op.v)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		op.err = err
		if connectionBroken(err) || errors.Is(err, errAbandoned) {
			c.fail(err)
		}
	default:
		op.ok = true
	}
	c.finish(op)
}

// fail marks the carrier dead after an uncertain outcome (or a lost lock),
// tells every Lock on it that it is lost, then discards its connection (the
// server releases everything it held as the session ends): the holders are
// told first.
func (c *carrier) fail(cause error) {
	s := &c.l.share
	s.mu.Lock()
	c.mu.Lock()
	if c.dead != nil {
		c.mu.Unlock()
		s.mu.Unlock()
		return
	}
	what := "shared session"
	if c.dedicated {
		what = "session"
	}
	c.dead = fmt.Errorf("%s (backend %d) discarded: %w", what, c.pid, cause)
	locks := make([]*Lock, 0, len(c.held))
	for lk := range c.held {
		locks = append(locks, lk)
	}
	c.unarmLocked()
	dead := c.dead
	c.mu.Unlock()
	s.remove(c)
	s.mu.Unlock()
	for _, lk := range locks {
		lk.lose(dead)
	}
	c.endConn(func() { c.l.discard(c.conn, Key{}, what+": "+cause.Error()) })
	close(c.gone)
}

// retire stops c from taking new locks: one of its locks was lost, or an
// unlock found a lock the server says it did not hold. It goes back to
// the pool (reset) once its other locks are released, unless it was
// discarded meanwhile.
func (c *carrier) retire() {
	c.mu.Lock()
	c.retired = true
	c.mu.Unlock()
}

// release unlocks lk's key on its carrier: nil when the server confirmed
// it, an error wrapping ErrLockLost when the server says the carrier did
// not hold it (that Lock only), or the error that discarded the carrier.
func (c *carrier) release(lk *Lock) error {
	uncertain, err := c.unlock(lk.key, lk.shared)
	c.detach(lk)
	if c.dedicated {
		c.ended(err, uncertain)
		return err
	}
	if err != nil && !uncertain {
		// Certain: that lock only. The carrier takes no new lock, and goes
		// back once its others are released. (An uncertain answer failed
		// the carrier already.)
		c.retire()
	}
	return err
}

// onTag runs q, a statement about lk's tag, on lk's carrier: ok reports
// whether it answered a row.
func (c *carrier) onTag(ctx context.Context, q string, args []any) (v int64, ok bool, err error) {
	op := newOp(opTag, Key{})
	op.q, op.args = q, args
	// The statement may wait long (a token's commit waits for synchronous
	// standbys): ctx bounds the caller's wait for it, so the queue runs on
	// a goroutine of its own.
	if c.enqueue(op) {
		go c.drain()
	}
	select {
	case <-op.done:
	case <-ctx.Done():
		return 0, false, ctx.Err()
	}
	return op.v, op.ok, op.err
}
