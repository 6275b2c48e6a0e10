package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/core"
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
	return lockTx(ctx, tx, k, sqltext.Try)
}

// RLockTx takes the transaction-level lock k in shared mode, waiting while
// another session holds it exclusively. It is refused on a hot standby as
// [LockTx] is.
func RLockTx(ctx context.Context, tx Tx, k Key) error {
	mustContext(ctx, "RLockTx")
	_, err := lockTx(ctx, tx, k, sqltext.Shared)
	return err
}

// TryRLockTx takes the transaction-level lock k in shared mode if no other
// session holds it exclusively, and reports whether it did. On a hot
// standby it takes nothing and returns false and [ErrStandby].
func TryRLockTx(ctx context.Context, tx Tx, k Key) (bool, error) {
	mustContext(ctx, "TryRLockTx")
	return lockTx(ctx, tx, k, sqltext.Try|sqltext.Shared)
}

// lockTx takes a transaction-level lock of kind in tx (see core.TxLock).
func lockTx(ctx context.Context, tx Tx, k Key, kind sqltext.Kind) (bool, error) {
	if err := k.valid(); err != nil {
		return false, err
	}
	if isNil(tx) {
		return false, errors.New("sqllock: nil transaction")
	}
	return core.TxLock(ctx, tx, k.sqlKey(), kind)
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
// it. begin is given a context with ctx's values that ends with ctx once
// the lock is held (until then InTxWith rolls back itself, so that a key
// granted as ctx ended is released before it returns). With sqlx:
//
//	err := sqllock.InTxWith(ctx, locker, k,
//		func(ctx context.Context) (*sqlx.Tx, error) { return dbx.BeginTxx(ctx, nil) },
//		func(tx *sqlx.Tx) error { ... })
func InTxWith[T Tx](ctx context.Context, l *Locker, k Key, begin func(context.Context) (T, error), fn func(tx T) error) (err error) {
	mustContext(ctx, "InTxWith")
	if err := k.valid(); err != nil {
		return err
	}
	// The transaction's context ends with ctx only once the lock is held
	// (see core.InTxContext): until then, a key granted as ctx ended is
	// released by the rollback below, which the call waits for, rather
	// than by database/sql's, in the background, after the call returned.
	// Bounded by ctx whatever the driver does (see stmt.Bounded): a
	// transaction begun after the call left is rolled back.
	txCtx, cancelTx := core.InTxContext(ctx)
	defer cancelTx()
	tx, err := stmt.Bounded(ctx, func() (T, error) { return begin(txCtx) }, func(tx T, err error) {
		if err == nil && !isNil(tx) {
			tx.Rollback()
		}
	})
	if err != nil {
		if stmt.CtxEnded(ctx) {
			return stmt.NotAcquired(l.name(k), stmt.CtxErr(ctx))
		}
		if !l.cfg.allowStandby && l.pool.BeginRefusedByStandby(ctx, err) {
			return fmt.Errorf("%w (begin: %w)", stmt.StandbyError("lock "+l.name(k)), err)
		}
		return fmt.Errorf("sqllock: begin: %w", err)
	}
	if isNil(tx) {
		return errors.New("sqllock: InTxWith: begin returned a nil transaction")
	}
	committed := false
	defer func() {
		if !committed && errors.Is(err, stmt.ErrAbandoned) {
			// A statement of the transaction's is still running: the
			// rollback would wait for it. It runs once the statement
			// returns.
			go tx.Rollback()
			return
		}
		if !committed {
			// Bounded: a driver's rollback may take no context.
			_, rerr := stmt.Bounded(ctx, func() (struct{}, error) { return struct{}{}, tx.Rollback() }, nil)
			if rerr != nil && !errors.Is(rerr, sql.ErrTxDone) && !errors.Is(rerr, stmt.ErrAbandoned) && err != nil {
				err = errors.Join(err, fmt.Errorf("sqllock: rollback: %w", rerr))
			}
		}
	}()
	if err := l.pool.LockInTx(ctx, tx, k.sqlKey()); err != nil {
		return err
	}
	// Held: the transaction ends with ctx, as database/sql ends one begun
	// under it.
	defer context.AfterFunc(ctx, cancelTx)()
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqllock: commit: %w", err)
	}
	return nil
}
