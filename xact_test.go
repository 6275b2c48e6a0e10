package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sqllock/sqllock"
)

func TestLockTxReleasedAtCommitAndRollback(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Int64(-42)
		for _, end := range []string{"commit", "rollback"} {
			tx, err := db.BeginTx(bg(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := sqllock.LockTx(bg(), tx, k); err != nil {
				t.Fatalf("LockTx() = %v", err)
			}
			if ok, err := sqllock.TryLockTx(bg(), tx, k); !ok || err != nil {
				t.Fatalf("TryLockTx() in the same tx = %v, %v; want re-entrant true", ok, err)
			}
			if len(holders(t, db, k)) != 1 {
				t.Fatalf("%s: lock not held inside the transaction", end)
			}
			other, err := db.BeginTx(bg(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := sqllock.TryLockTx(bg(), other, k); ok || err != nil {
				t.Fatalf("TryLockTx() from another tx = %v, %v; want false, nil", ok, err)
			}
			if ok, err := sqllock.TryRLockTx(bg(), other, k); ok || err != nil {
				t.Fatalf("TryRLockTx() from another tx = %v, %v; want false, nil", ok, err)
			}
			if end == "commit" {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := sqllock.TryLockTx(bg(), other, k); !ok || err != nil {
				t.Fatalf("after %s: TryLockTx() = %v, %v; want true", end, ok, err)
			}
			other.Rollback()
			if n := advisoryCount(t, db); n != 0 {
				t.Fatalf("after %s: %d advisory locks left", end, n)
			}
		}
	})
}

func TestSharedLockTx(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Pair(5, 5)
		a, _ := db.BeginTx(bg(), nil)
		defer a.Rollback()
		b, _ := db.BeginTx(bg(), nil)
		defer b.Rollback()
		if err := sqllock.RLockTx(bg(), a, k); err != nil {
			t.Fatal(err)
		}
		if ok, err := sqllock.TryRLockTx(bg(), b, k); !ok || err != nil {
			t.Fatalf("second shared TryRLockTx = %v, %v", ok, err)
		}
		ctx, cancel := context.WithTimeout(bg(), 100*time.Millisecond)
		defer cancel()
		c, _ := db.BeginTx(bg(), nil)
		defer c.Rollback()
		if err := sqllock.LockTx(ctx, c, k); !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("LockTx() against shared holders past deadline = %v", err)
		}
	})
}

func TestLockTxSqlx(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		xdb := sqlx.NewDb(db, "postgres")
		tx, err := xdb.BeginTxx(bg(), nil)
		if err != nil {
			t.Fatal(err)
		}
		k := sqllock.Hash("report:daily")
		if err := sqllock.LockTx(bg(), tx, k); err != nil {
			t.Fatalf("LockTx(*sqlx.Tx) = %v", err)
		}
		locks, err := sqllock.Inspect(bg(), xdb, nil)
		if err != nil || len(locks) != 1 || locks[0].Key != k {
			t.Fatalf("Inspect(*sqlx.DB) = %v, %v", locks, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := advisoryCount(t, xdb); n != 0 {
			t.Fatalf("%d advisory locks left after commit", n)
		}
	})
}

func TestInTx(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		k := sqllock.Int64(9)
		if _, err := db.Exec("CREATE TABLE runs (n int)"); err != nil {
			t.Fatal(err)
		}
		err := l.InTx(bg(), k, nil, func(tx *sql.Tx) error {
			if len(holders(t, db, k)) != 1 {
				t.Error("lock not held inside InTx")
			}
			_, err := tx.Exec("INSERT INTO runs VALUES (1)")
			return err
		})
		if err != nil {
			t.Fatalf("InTx() = %v", err)
		}
		boom := errors.New("boom")
		err = l.InTx(bg(), k, nil, func(tx *sql.Tx) error {
			if _, err := tx.Exec("INSERT INTO runs VALUES (2)"); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("InTx() = %v, want fn's error", err)
		}
		var n int
		if err := db.QueryRow("SELECT count(*) FROM runs").Scan(&n); err != nil || n != 1 {
			t.Fatalf("rows = %d, %v; want 1 (the failed InTx rolled back)", n, err)
		}
		if c := advisoryCount(t, db); c != 0 {
			t.Fatalf("%d advisory locks left", c)
		}
	})
}

// TestDeadlock crosses two transactions' waits: PostgreSQL aborts one of
// them (SQLSTATE 40P01) and the other gets both locks.
func TestDeadlock(t *testing.T) {
	long(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		a, b := sqllock.Int64(1), sqllock.Int64(2)
		tx1, _ := db.BeginTx(bg(), nil)
		defer tx1.Rollback()
		tx2, _ := db.BeginTx(bg(), nil)
		defer tx2.Rollback()
		if err := sqllock.LockTx(bg(), tx1, a); err != nil {
			t.Fatal(err)
		}
		if err := sqllock.LockTx(bg(), tx2, b); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() {
			err := sqllock.LockTx(bg(), tx1, b)
			if err != nil {
				tx1.Rollback()
			}
			errs <- err
		}()
		go func() {
			err := sqllock.LockTx(bg(), tx2, a)
			if err != nil {
				tx2.Rollback()
			}
			errs <- err
		}()
		e1, e2 := <-errs, <-errs
		deadlocks := 0
		for _, err := range []error{e1, e2} {
			if errors.Is(err, sqllock.ErrDeadlock) {
				deadlocks++
			} else if err != nil {
				t.Fatalf("unexpected error %v", err)
			}
		}
		if deadlocks != 1 {
			t.Fatalf("errors %v, %v; want exactly one ErrDeadlock", e1, e2)
		}
	})
}

// TestLockTableFull fills the server's shared lock table from one
// transaction, then LockTx must report ErrLockTableFull.
func TestLockTableFull(t *testing.T) {
	long(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		tx, err := db.BeginTx(bg(), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.Exec("SELECT count(pg_advisory_xact_lock(1, g)) FROM generate_series(1, 8000) g"); err != nil {
			t.Fatalf("filling the lock table: %v", err)
		}
		var lerr error
		for i := int32(0); i < 100000 && lerr == nil; i++ {
			lerr = sqllock.LockTx(bg(), tx, sqllock.Pair(2, i))
		}
		if !errors.Is(lerr, sqllock.ErrLockTableFull) {
			t.Fatalf("LockTx() on a full lock table = %v, want ErrLockTableFull", lerr)
		}
		tx.Rollback()
		// The table is usable again once the transaction ends.
		l := sqllock.New(db)
		lk, err := l.TryLock(bg(), sqllock.Int64(1))
		if err != nil {
			t.Fatalf("TryLock() after the full table was freed: %v", err)
		}
		lk.Unlock(bg())
	})
}
