package wait

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Stopping a wait whose caller left: its backend is taken out of the
// server's queue from another connection of the pool.

// stopAbandoned is stopWait for a wait whose driver did not give the
// statement up in time (stmt.ErrAbandoned): the server may be cut off, or only
// slow. It waits for the cancel no longer than the driver got
// (stmt.AbandonGrace): if nothing reaches the server, the call must still
// return by its deadline.
func (e *Engine) stopAbandoned(ctx context.Context, pid int64, k sqltext.Key) {
	done := make(chan struct{})
	go func() { e.stopWait(ctx, pid, k); close(done) }()
	select {
	case <-done:
	case <-time.After(stmt.AbandonGrace):
	}
}

// cancelWaitTimeout bounds stopWait.
const cancelWaitTimeout = 2 * time.Second

// stopWait takes backend pid, whose wait for k its client abandoned, out
// of k's queue, from another pooled connection, and waits (bounded) until
// it has left. Some drivers (pgx) close the socket of a cancelled statement
// without a cancel request; the backend then stays queued until it is
// granted the lock, and holds it until it notices that its client is gone.
// The wait statement may not even have started when the client gave up
// (it sits in the backend's socket buffer): stopWait then watches the
// backend until it runs the statement (and cancels it), finishes it, or
// ends. It is best effort: when no connection can be had in time, the
// server still releases the lock as the abandoned session ends. It takes
// at most cancelWaitTimeout, and no longer than that past the deadline of
// the wait's ctx, if it had one: the call returns by then.
func (e *Engine) stopWait(waitCtx context.Context, pid int64, k sqltext.Key) {
	if e.DB == nil || pid == 0 {
		return // the engine without a pool (LockTx), or no backend known
	}
	until := time.Now().Add(cancelWaitTimeout)
	if dl, ok := waitCtx.Deadline(); ok && dl.Add(cancelWaitTimeout).Before(until) {
		until = dl.Add(cancelWaitTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	// A connection and statements bounded like the lock's own: a server
	// that stopped answering cannot hold this past its timeout. A pool at
	// its limit, or a budget spent (see stmt's budget.go), may have no connection
	// to give until the caller's own, abandoned one is discarded, after
	// this returns: wait for one no longer than stmt.AbandonGrace then (that
	// discard ends the backend, which takes it out of the queue too, a
	// little later).
	cctx := ctx
	if st := e.DB.Stats(); st.MaxOpenConnections > 0 && st.InUse >= st.MaxOpenConnections || e.Budget.Count() >= stmt.BudgetLimit(st) {
		var stop context.CancelFunc
		cctx, stop = context.WithTimeout(ctx, stmt.AbandonGrace)
		defer stop()
	}
	conn, err := e.TakeConn(cctx)
	if err != nil {
		return
	}
	defer e.Budget.Give() // once conn is closed, or left to its statement
	if e.SimpleFor != nil {
		defer e.SimpleFor(conn)()
	}
	var doneSince time.Time
	for ctx.Err() == nil {
		var where int64
		err := stmt.QueryRow(ctx, e.Abandoned, conn, sqltext.CancelWaitSQL, []any{pid}, &where)
		if errors.Is(err, stmt.ErrAbandoned) {
			return // its connection is closed once the statement returns
		}
		if err != nil || where == 0 {
			break
		}
		// Done with a wait statement: this one, or, should the server not
		// have read this one yet, an earlier one on the same connection.
		// Watch a little longer before believing it.
		if where == 3 {
			if doneSince.IsZero() {
				doneSince = time.Now()
			} else if time.Since(doneSince) > cancelWaitSettle {
				break
			}
		} else {
			doneSince = time.Time{}
		}
		time.Sleep(time.Millisecond)
	}
	// Granted as the cancel came: the lock goes with the backend, before
	// the caller, told it has nothing, returns.
	var ended bool
	if err := stmt.QueryRow(ctx, e.Abandoned, conn, sqltext.TerminateHolderSQL, sqltext.DiscardHolderArgs(pid, k), &ended); err == nil && ended {
		for ctx.Err() == nil {
			var where int64
			if err := stmt.QueryRow(ctx, e.Abandoned, conn, sqltext.CancelWaitSQL, []any{pid}, &where); err != nil || where == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	conn.Close()
}

// cancelWaitSettle is how long stopWait keeps watching a backend that
// seems done with its wait statement.
const cancelWaitSettle = 50 * time.Millisecond

// TakeConn returns a spare connection of the Pool's, or counts one in its
// budget, waiting for room with ctx, and gets it from the pool (see
// stmt.GetConn). It stays counted until its taker gives it back (the core's putBack,
// stmt.Budget.Done), or makes it a session (the core's newSession). When ctx ends during
// its setup, the setup goes on, counted, until the connection is a spare.
func (e *Engine) TakeConn(ctx context.Context) (*sql.Conn, error) {
	if conn := e.Budget.TakeSpare(); conn != nil {
		return conn, nil
	}
	if err := e.Budget.Take(ctx); err != nil {
		return nil, err
	}
	conn, err, left := stmt.GetConn(ctx, e.DB, e.Budget)
	if err != nil && !left {
		e.Budget.Give()
	}
	return conn, err
}
