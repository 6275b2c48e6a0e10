package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// A session's queue: its statements, one at a time, batched (see carrier).

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
// stopped right after) never meets a lease that still looks busy. The
// queue's statements are bounded like an unlock; a Session's own calls
// pass their ctx (queryRowCtx, queryRowsCtx).
func (c *carrier) queryRow(q string, args []any, dest ...any) error {
	return c.queryRowCtx(c.l.unlockContext(), q, args, dest...)
}

func (c *carrier) queryRows(q string, args []any, row func([]driver.Value) error) error {
	return c.queryRowsCtx(c.l.unlockContext(), q, args, row)
}

func (c *carrier) queryRowCtx(ctx context.Context, q string, args []any, dest ...any) error {
	return c.withConn(func(conn *sql.Conn) error { return queryRow(ctx, c.l.abandoned, conn, q, args, dest...) })
}

func (c *carrier) queryRowsCtx(ctx context.Context, q string, args []any, row func([]driver.Value) error) error {
	return c.withConn(func(conn *sql.Conn) error { return queryRows(ctx, c.l.abandoned, conn, q, args, row) })
}

// withConn runs fn, statements on conn (a query, a Session's wait), under
// connMu and the lease's busy mark; an answer, rows or none, is a sign of
// life.
func (c *carrier) withConn(fn func(conn *sql.Conn) error) error {
	if err := c.holdConn(); err != nil {
		return err
	}
	defer c.releaseConn()
	sent := c.ls.begin()
	err := fn(c.conn)
	c.ls.end(sent, err == nil || errors.Is(err, sql.ErrNoRows))
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
		q, args := st.TrySQL(sqltext.Try, op.key.sqlKey(), c.mark)
		var pid int64
		var standby bool
		var ok sql.NullBool
		err = c.queryRow(q, args, &ok, &pid, &standby)
		op.ok = ok.Bool
		if err == nil && !ok.Valid {
			err = foreignSession() // nothing was tried
		}
		if err == nil {
			err = c.answered(pid, standby, op.ok && !c.tuned)
		}
		if err != nil && op.ok && standby {
			// Granted on a standby that is refused: released here, before
			// the call returns, not left to the discard (the server frees
			// a discarded session's locks a moment after the call).
			var released bool
			q, args := st.UnlockSQL(false, op.key.sqlKey(), pid)
			_ = c.queryRow(q, args, &released)
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
	q, args := c.l.sql().SessionSQL(c.mark)
	err := c.queryRow(q, args, &pid, &standby, skip)
	if err == nil && pid == 0 {
		err = foreignSession() // nothing was applied
	}
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
// failed, and session-level locks outlive a failed statement. No lock of
// the carrier's holds any of them (the keys of a carrier's operations are
// reserved; a Session tries only keys it does not hold).
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
	for err == nil && len(stray) > 0 {
		n := min(len(stray), sqltext.ManyRowsMax)
		var released []bool
		if released, err = many(c.l.mode, c.queryRows, "pg_advisory_unlock", c.pid, stray[:n]); err == nil && slices.Contains(released, false) {
			err = errors.New("sqllock: a key the failed statement took was not held")
		}
		stray = stray[n:]
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
