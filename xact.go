package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Tx is a database transaction: *sql.Tx and *sqlx.Tx satisfy it. *sql.DB
// does not, on purpose: a transaction-level lock taken outside a
// transaction is released as soon as its statement ends.
type Tx interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	Commit() error
	Rollback() error
}

// LockTx takes the exclusive transaction-level lock k in tx
// (pg_advisory_xact_lock), waiting while another session holds it.
// PostgreSQL releases it when tx ends, by commit, rollback, or an error that
// aborts it; there is no unlock. These are the only advisory locks that work
// behind a transaction-mode pooler.
//
// LockTx first tries the lock without waiting, in one round trip that also
// asks whether the server is a hot standby; only when another session
// holds k does it wait. On a standby it takes nothing and returns
// [ErrStandby]: a standby's locks do not conflict with the primary's, and
// no option allows them here (tx stays usable).
//
// When ctx ends first, LockTx returns an error matching both
// [ErrNotAcquired] and ctx.Err(); the transaction may then be unusable and
// must be rolled back, which releases anything it holds. ctx bounds the
// wait in the server too: a deadline as the wait's own lock_timeout; a
// context that can be cancelled and has no deadline, by waiting in slices
// (savepoint sqllock_wait, released once granted), so that a cancel the
// driver could not deliver costs at most a slice: 2 s, or twice the
// server's deadlock_timeout. Other errors:
// [ErrDeadlock] (tx is aborted), [ErrLockTableFull], [ErrInvalidKey].
func LockTx(ctx context.Context, tx Tx, k Key) error {
	mustContext(ctx, "LockTx")
	_, err := lockTx(ctx, tx, k, 0)
	return err
}

// TryLockTx takes the exclusive transaction-level lock k in tx if no other
// session holds it, and reports whether it did. It does not wait. On a
// hot standby it takes nothing and returns false and [ErrStandby].
func TryLockTx(ctx context.Context, tx Tx, k Key) (bool, error) {
	mustContext(ctx, "TryLockTx")
	return lockTx(ctx, tx, k, kindTry)
}

// RLockTx takes the transaction-level lock k in shared mode, waiting while
// another session holds it exclusively. It is refused on a hot standby as
// [LockTx] is.
func RLockTx(ctx context.Context, tx Tx, k Key) error {
	mustContext(ctx, "RLockTx")
	_, err := lockTx(ctx, tx, k, kindShared)
	return err
}

// TryRLockTx takes the transaction-level lock k in shared mode if no other
// session holds it exclusively, and reports whether it did. On a hot
// standby it takes nothing and returns false and [ErrStandby].
func TryRLockTx(ctx context.Context, tx Tx, k Key) (bool, error) {
	mustContext(ctx, "TryRLockTx")
	return lockTx(ctx, tx, k, kindTry|kindShared)
}

// lockTx takes a transaction-level lock of kind in tx, through the engine
// without a Locker. Every call starts with the same non-waiting statement,
// whatever ctx: one round trip when the key is free, which also says
// whether the server is a standby (refused, and nothing taken there). Only
// a waiting call that finds the key held then waits, as ctx allows: in
// one statement under a context that never ends or has a deadline (the
// server keeps it), in slices under one that can only be cancelled
// (waitTxSliced). With no pool to cancel an abandoned wait from, ctx ends
// it through the driver; the caller's rollback, which the doc requires
// after a ctx that ended, takes the backend out of the queue. The key is
// bound as a parameter, which every driver accepts.
func lockTx(ctx context.Context, tx Tx, k Key, kind lockKind) (bool, error) {
	if err := k.valid(); err != nil {
		return false, err
	}
	if isNil(tx) {
		return false, errors.New("sqllock: nil transaction")
	}
	if err := ctx.Err(); err != nil {
		return false, notAcquired(k.String(), err)
	}
	e := &engine{mode: bindKeys} // no pool to cancel a wait from, no logger
	o := e.tryOn(ctx, txWaiter{tx}, xactLevel, nil, kind, k)
	if !kind.IsTry() && o.err == nil && !o.ok && !o.standby {
		if _, deadline := ctx.Deadline(); !deadline && ctx.Done() != nil {
			o = e.waitTxSliced(ctx, tx, kind, k)
		} else {
			o = e.waitOn(ctx, txWaiter{tx}, xactLevel, nil, kind, k, o.pid, waitOne)
		}
	}
	err := settleTx(ctx, k.String(), o, false)
	if errors.Is(err, ErrStandby) {
		// No option allows a standby here: say only what to do.
		err = fmt.Errorf("%w (lock %s): its advisory locks do not conflict with the primary's; connect to the primary", ErrStandby, k)
	}
	return o.ok, err
}

// waitTxSliced is a transaction's wait under a context that can be
// cancelled and has no deadline. The driver's cancel may never reach the
// server (lib/pq sends it on a connection of its own, and one that arrives
// before the statement starts is lost), and a transaction has no other
// session to cancel its wait from, nor a deadline for the server to keep.
// So the wait goes in slices of twice the server's deadlock_timeout (at
// least txSliceMin), in a savepoint: the deadlock detector still sees
// every slice, a slice that times out is rolled back to the savepoint
// (which also undoes a grant that came as the timeout fired), and while
// ctx goes on the wait goes on. A lost cancel then costs at most a slice.
func (e *engine) waitTxSliced(ctx context.Context, tx Tx, kind lockKind, k Key) outcome {
	var dt string
	if err := (txWaiter{tx}).queryRow(ctx, "SELECT current_setting('deadlock_timeout')", nil, &dt); err != nil {
		return outcome{err: err}
	}
	d, err := time.ParseDuration(dt)
	if err != nil {
		d = 0 // a unit Go does not read ("1min"): the floor below
	}
	slice := strconv.FormatInt(max(2*d, txSliceMin).Milliseconds(), 10) + "ms"
	if err := txExec(ctx, tx, "SAVEPOINT sqllock_wait"); err != nil {
		return outcome{err: err}
	}
	q, args := e.mode.XactDeadlineLockSQL(kind&^kindTry, k.sqlKey(), slice)
	for {
		began := time.Now()
		var o outcome
		o.err = txWaiter{tx}.queryRow(ctx, q, args, &o.ok)
		switch {
		case o.err == nil:
			// The transaction keeps what its subtransaction took.
			o.err = txExec(ctx, tx, "RELEASE SAVEPOINT sqllock_wait")
			return o
		case sqlState(o.err) != "55P03" || !ranInto(began, slice) || ctxEnded(ctx):
			// Not the slice's end (a lock_timeout of the transaction's
			// own, a deadlock, a cancel), or ctx ended: the caller's.
			return o
		}
		if err := txExec(ctx, tx, "ROLLBACK TO SAVEPOINT sqllock_wait"); err != nil {
			return outcome{err: err}
		}
	}
}

// txSliceMin is the shortest slice of waitTxSliced.
const txSliceMin = 2 * time.Second

// txExec runs a statement that returns no row in tx.
func txExec(ctx context.Context, tx Tx, q string) error {
	if err := (txWaiter{tx}).queryRow(ctx, q, nil); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return nil
}

// isNil reports whether v is nil, or an interface holding a nil pointer
// (such as a nil *sql.Tx passed as a Tx), whose methods would panic.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return r.IsNil()
	}
	return false
}

// InTx begins a transaction with opts, takes the exclusive transaction-level
// lock k in it (waiting as [LockTx] does), runs fn, and commits when fn
// returns nil. When fn returns an error or panics, or the lock cannot be
// taken, the transaction is rolled back; either way PostgreSQL releases the
// lock as the transaction ends. InTx returns fn's error, or the error of
// begin, lock or commit. A ctx that ends while InTx waits for the lock
// returns an error matching [ErrNotAcquired] and ctx.Err(), and the wait
// leaves the server's queue before InTx returns.
//
// On a hot standby InTx returns an error matching [ErrStandby], and fn does
// not run: the lock statement takes nothing there, and a BEGIN the standby
// refuses (lib/pq begins every transaction that is not read-only as READ
// WRITE) is reported so too. A Locker made [WithAllowStandby] takes the
// lock there; begin a read-only transaction then (opts.ReadOnly).
func (l *Locker) InTx(ctx context.Context, k Key, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	mustContext(ctx, "Locker.InTx")
	return InTxWith(ctx, l, k, func(ctx context.Context) (*sql.Tx, error) { return l.db.BeginTx(ctx, opts) }, fn)
}

// InTxWith is [Locker.InTx] for a transaction type of the caller's own, such
// as *sqlx.Tx: begin starts the transaction (on l's database: the cancel
// of an abandoned wait runs there), and fn receives it as begin returned
// it. With sqlx:
//
//	err := sqllock.InTxWith(ctx, locker, k,
//		func(ctx context.Context) (*sqlx.Tx, error) { return dbx.BeginTxx(ctx, nil) },
//		func(tx *sqlx.Tx) error { ... })
func InTxWith[T Tx](ctx context.Context, l *Locker, k Key, begin func(context.Context) (T, error), fn func(tx T) error) (err error) {
	mustContext(ctx, "InTxWith")
	if err := k.valid(); err != nil {
		return err
	}
	// Bounded by ctx whatever the driver does (see bounded): a transaction
	// begun after the call left is rolled back.
	tx, err := bounded(ctx, func() (T, error) { return begin(ctx) }, func(tx T, err error) {
		if err == nil && !isNil(tx) {
			tx.Rollback()
		}
	})
	if err != nil {
		if ctxEnded(ctx) {
			return notAcquired(l.name(k), ctxErr(ctx))
		}
		if !l.cfg.allowStandby && l.beginRefusedByStandby(ctx, err) {
			return fmt.Errorf("%w (begin: %w)", standbyError("lock "+l.name(k)), err)
		}
		return fmt.Errorf("sqllock: begin: %w", err)
	}
	if isNil(tx) {
		return errors.New("sqllock: InTxWith: begin returned a nil transaction")
	}
	committed := false
	defer func() {
		if !committed && errors.Is(err, errAbandoned) {
			// A statement of the transaction's is still running: the
			// rollback would wait for it. It runs once the statement
			// returns.
			go tx.Rollback()
			return
		}
		if !committed {
			if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) && err != nil {
				err = errors.Join(err, fmt.Errorf("sqllock: rollback: %w", rerr))
			}
		}
	}()
	if err := l.lockInTx(ctx, tx, k); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqllock: commit: %w", err)
	}
	return nil
}

// beginRefusedByStandby reports whether err, a failed BEGIN, was a
// standby's refusal: lib/pq begins every transaction that is not read-only
// as READ WRITE, which a standby refuses ("cannot set transaction
// read-write mode during recovery", 0A000), as it refuses a serializable
// one (0A000 too) or a write (25006). Only for those codes is the server
// asked whether it is in recovery.
func (l *Locker) beginRefusedByStandby(ctx context.Context, err error) bool {
	if st := sqlState(err); st != "0A000" && st != "25006" {
		return false
	}
	var r bool
	return l.db.QueryRowContext(ctx, sqltext.RecoverySQL).Scan(&r) == nil && r
}

// lockInTx takes the exclusive transaction-level lock k in tx, InTx's own
// transaction. It tries first, with the statement LockTx starts with, so
// that a wait knows its backend's pid: when ctx ends during the wait, that
// backend is taken out of k's queue (see Locker.cancelWait) rather than
// left to be granted the lock and sit idle in its transaction until it
// notices its client left. On a standby the try takes nothing, and the
// call is refused, unless the Locker was made WithAllowStandby: then it
// waits, which takes the lock there.
func (l *Locker) lockInTx(ctx context.Context, tx Tx, k Key) error {
	if err := ctx.Err(); err != nil {
		return notAcquired(l.name(k), err)
	}
	w := txWaiter{tx}
	o := l.tryOn(ctx, w, xactLevel, nil, 0, k)
	if o.err == nil && !o.ok && (!o.standby || l.cfg.allowStandby) {
		o = l.waitOn(ctx, w, xactLevel, nil, 0, k, o.pid, waitOne)
	}
	return settleTx(ctx, l.name(k), o, l.cfg.allowStandby)
}

// settleTx turns the outcome of a transaction-level acquisition into the
// call's error: a ctx that ended is "not acquired" whatever the driver said
// (the caller rolls the transaction back, which releases what it holds); a
// standby is refused unless standbyOK.
func settleTx(ctx context.Context, what string, o outcome, standbyOK bool) error {
	v, err := judge(ctx, o, what, standbyOK, 0)
	if v == refused && o.err == nil && !o.ok && (!o.standby || standbyOK) {
		return nil // a try that found the key held: false, and no error
	}
	return err
}
