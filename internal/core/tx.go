package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Transaction-level locks: taken in a transaction of the caller's (LockTx
// and kin, with no Pool) or of InTx's (with the Pool, which can cancel an
// abandoned wait). PostgreSQL releases them when the transaction ends.

// TxLock takes a transaction-level lock of kind (Try, Shared) on k in tx,
// through the engine without a Pool. Every call starts with the same
// non-waiting statement, whatever ctx: one round trip when the key is
// free, which also says whether the server is a standby (refused, and
// nothing taken there). Only a waiting call that finds the key held then
// waits, as ctx allows: in one statement under a context that never ends
// or has a deadline (the server keeps it), in slices under one that can
// only be cancelled (wait.Engine.WaitTxSliced). With no pool to cancel an abandoned
// wait from, ctx ends it through the driver; the caller's rollback, which
// is required after a ctx that ended, takes the backend out of the queue.
// The key is bound as a parameter, which every driver accepts.
func TxLock(ctx context.Context, tx wait.TxQuerier, k Key, kind Kind) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, stmt.NotAcquired(keyString(k), err)
	}
	e := &wait.Engine{Mode: sqltext.Bind} // no pool to cancel a wait from, no logger
	o := e.TryOn(ctx, wait.TxWaiter{Tx: tx}, wait.XactLevel, nil, kind, k)
	if !kind.IsTry() && o.Err == nil && !o.OK && !o.Standby && !stmt.CtxEnded(ctx) {
		if _, deadline := ctx.Deadline(); !deadline && ctx.Done() != nil {
			o = e.WaitTxSliced(ctx, tx, kind, k)
		} else {
			o = e.WaitOn(ctx, wait.TxWaiter{Tx: tx}, wait.XactLevel, nil, kind, k, o.PID)
		}
	}
	err := settleTx(ctx, namer{label: keyString(k)}, o, false)
	if errors.Is(err, stmt.ErrStandby) {
		// No option allows a standby here: say only what to do.
		err = fmt.Errorf("%w (lock %s): its advisory locks do not conflict with the primary's; connect to the primary", stmt.ErrStandby, keyString(k))
	}
	return o.OK, err
}

// txLocks is the part of a Pool that takes locks in its caller's
// transactions.
type txLocks struct {
	p *Pool // its Pool
}

// LockInTx takes the exclusive transaction-level lock k in tx, InTx's own
// transaction. It tries first, with the statement TxLock starts with, so
// that a wait knows its backend's pid: when ctx ends during the wait, that
// backend is taken out of k's queue (see wait.Engine.WaitOn) rather than left to
// be granted the lock and sit idle in its transaction until it notices its
// client left. On a standby the try takes nothing, and the call is
// refused, unless the Pool allows standbys: then it waits, which takes the
// lock there. A try answered as ctx ended takes no wait after it, and the
// call is not acquired: the caller's rollback releases what it took (see
// InTxContext).
func (tl *txLocks) LockInTx(ctx context.Context, tx wait.TxQuerier, k Key) error {
	p := tl.p
	if err := ctx.Err(); err != nil {
		return stmt.NotAcquired(p.name(k), err)
	}
	if p.Closed() {
		return closedError(p.name(k))
	}
	w := wait.TxWaiter{Tx: tx}
	o := p.TryOn(ctx, w, wait.XactLevel, nil, 0, k)
	if o.Err == nil && !o.OK && (!o.Standby || p.cfg.AllowStandby) && !stmt.CtxEnded(ctx) {
		o = p.waitOn(ctx, w, wait.XactLevel, nil, 0, k, o.PID)
	}
	return p.closedOr(p.timedOut(settleTx(ctx, namer{p: p, k: k}, o, p.cfg.AllowStandby)))
}

// InTxContext returns the context InTx begins its transaction with: ctx's
// values, ended by the cancel func only. database/sql closes a
// transaction's rows, and rolls it back in the background, when the
// transaction's context ends: under ctx itself, the answer of a try run
// as ctx ended was lost, and a key it was granted released after InTx
// returned. InTx ties the transaction to ctx again once it holds the lock
// (context.AfterFunc), and otherwise rolls it back itself, bounded by ctx
// (see stmt.Bounded), before it returns.
func InTxContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Done() == nil {
		return ctx, func() {}
	}
	return context.WithCancel(context.WithoutCancel(ctx))
}

// BeginRefusedByStandby reports whether err, a failed BEGIN, was a
// standby's refusal: lib/pq begins every transaction that is not read-only
// as READ WRITE, which a standby refuses ("cannot set transaction
// read-write mode during recovery", 0A000), as it refuses a serializable
// one (0A000 too) or a write (25006). Only for those codes is the server
// asked whether it is in recovery.
func (tl *txLocks) BeginRefusedByStandby(ctx context.Context, err error) bool {
	p := tl.p
	if !stmt.StandbyRefusal(err) {
		return false
	}
	var r bool
	return p.DB.QueryRowContext(ctx, sqltext.RecoverySQL).Scan(&r) == nil && r
}

// settleTx turns the outcome of a transaction-level acquisition into the
// call's error: a ctx that ended is "not acquired" whatever the driver said
// (the caller rolls the transaction back, which releases what it holds); a
// standby is refused unless standbyOK.
func settleTx(ctx context.Context, what namer, o wait.Outcome, standbyOK bool) error {
	v, err := judge(ctx, o, what, standbyOK, 0)
	if v == refused && o.Err == nil && !o.OK && (!o.Standby || standbyOK) {
		return nil // a try that found the key held: false, and no error
	}
	return err
}
