package wait

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strconv"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// A transaction's waits: the caller's (LockTx and kin) and InTx's.

// TxQuerier is what the engine needs of a transaction: *sql.Tx and
// *sqlx.Tx have it.
type TxQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// TxWaiter is a transaction.
type TxWaiter struct{ Tx TxQuerier }

func (TxWaiter) mark() string { return "" }

// QueryRow runs q in the transaction, bounded by ctx (see stmt.Bounded): the
// row is read into values of its own, so that a statement left to finish
// alone writes nothing of the caller's.
func (w TxWaiter) QueryRow(ctx context.Context, q string, args []any, dest ...any) error {
	vals, err := stmt.Bounded(ctx, func() ([]driver.Value, error) {
		raw := make([]any, len(dest))
		ptrs := make([]any, len(dest))
		for i := range raw {
			ptrs[i] = &raw[i]
		}
		if err := w.Tx.QueryRowContext(ctx, q, args...).Scan(ptrs...); err != nil {
			return nil, err
		}
		vals := make([]driver.Value, len(raw))
		for i, v := range raw {
			vals[i] = v
		}
		return vals, nil
	}, nil)
	if err != nil {
		return err
	}
	return stmt.Assign(dest, vals)
}

// TxExecOn runs q, a statement that answers no row, on conn.
func TxExecOn(ctx context.Context, blind *stmt.AbandonSet, conn *sql.Conn, q string) error {
	if err := stmt.QueryRow(ctx, blind, conn, q, nil); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return nil
}

// txSliceMin is the shortest slice of WaitTxSliced.
const txSliceMin = 2 * time.Second

// WaitTxSliced is a transaction's wait under a context that can be
// cancelled and has no deadline. The driver's cancel may never reach the
// server (lib/pq sends it on a connection of its own, and one that arrives
// before the statement starts is lost), and a transaction has no other
// session to cancel its wait from, nor a deadline for the server to keep.
// So the wait goes in slices of twice the server's deadlock_timeout (at
// least txSliceMin), in a savepoint: the deadlock detector still sees
// every slice, a slice that times out is rolled back to the savepoint
// (which also undoes a grant that came as the timeout fired), and while
// ctx goes on the wait goes on. A lost cancel then costs at most a slice.
func (e *Engine) WaitTxSliced(ctx context.Context, tx TxQuerier, kind sqltext.Kind, k sqltext.Key) Outcome {
	var dt string
	if err := (TxWaiter{tx}).QueryRow(ctx, sqltext.DeadlockTimeoutSQL, nil, &dt); err != nil {
		return Outcome{Err: err}
	}
	d, err := time.ParseDuration(dt)
	if err != nil {
		d = 0 // a unit Go does not read ("1min"): the floor below
	}
	slice := strconv.FormatInt(max(2*d, txSliceMin).Milliseconds(), 10) + "ms"
	if err := txExec(ctx, tx, sqltext.SavepointSQL); err != nil {
		return Outcome{Err: err}
	}
	q, args := e.Mode.XactDeadlineLockSQL(kind&^sqltext.Try, k, slice)
	for {
		began := time.Now()
		var o Outcome
		o.Err = TxWaiter{tx}.QueryRow(ctx, q, args, &o.OK)
		switch {
		case o.Err == nil:
			// The transaction keeps what its subtransaction took.
			o.Err = txExec(ctx, tx, sqltext.ReleaseSavepointSQL)
			return o
		case !stmt.LockTimedOut(o.Err) || !ranInto(began, slice) || stmt.CtxEnded(ctx):
			// Not the slice's end (a lock_timeout of the transaction's
			// own, a deadlock, a cancel), or ctx ended: the caller's.
			return o
		}
		if err := txExec(ctx, tx, sqltext.RollbackToSavepointSQL); err != nil {
			return Outcome{Err: err}
		}
	}
}

// txExec runs a statement that returns no row in tx.
func txExec(ctx context.Context, tx TxQuerier, q string) error {
	if err := (TxWaiter{tx}).QueryRow(ctx, q, nil); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return nil
}
