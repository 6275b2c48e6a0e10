package sqllock_test

import (
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestSharedTryFailureTouchesOneLock: a TryLock on a shared session that
// the server refuses (a full lock table, 53200) fails that call only: the
// other locks on the same session stay held, and nothing the failed
// statement took stays behind; alone, in batches of concurrent calls, and
// in batches that carry unlocks too (which stand).
func TestSharedTryFailureTouchesOneLock(t *testing.T) {
	long(t)
	t.Parallel()
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			srv := pgtest.Private(t) // its lock table is filled below
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, drv, dsn)
			observer := pgtest.Open(t, "pgx", dsn)
			l := sqllock.New(db, sqllock.WithKeepAlive(0))
			var held []*sqllock.Lock
			for i := range 24 {
				lk, err := l.TryLock(bg(), sqllock.Int64(int64(10000+i)))
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, lk)
			}
			// Another session fills the lock table.
			filler, err := observer.Conn(bg())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := filler.ExecContext(bg(), "SELECT count(pg_try_advisory_lock(3, g)) FROM generate_series(1, 1000000) g"); err == nil {
				t.Fatal("the lock table did not fill up")
			}
			if _, err := l.TryLock(bg(), sqllock.Int64(20000)); !errors.Is(err, sqllock.ErrLockTableFull) {
				t.Fatalf("TryLock() on a full lock table = %v, want ErrLockTableFull", err)
			}
			// A Locker with no session yet: its first statement on a new
			// connection meets the full table.
			fresh := sqllock.New(pgtest.Open(t, drv, dsn))
			if _, err := fresh.TryLock(bg(), sqllock.Int64(20000)); !errors.Is(err, sqllock.ErrLockTableFull) {
				t.Fatalf("TryLock() of a new Locker on a full lock table = %v, want ErrLockTableFull", err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 30)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lk, err := l.TryLock(bg(), sqllock.Int64(int64(20001+i)))
					if err == nil {
						lk.Unlock(bg())
					}
					errs[i] = err
				}()
			}
			waitGroup(t, &wg, hangCeiling)
			for i, err := range errs {
				if err != nil && !errors.Is(err, sqllock.ErrLockTableFull) {
					t.Errorf("concurrent TryLock %d on a full lock table = %v, want ErrLockTableFull", i, err)
				}
			}
			// Unlocks and tries at once: they meet in the session's
			// batches, unlocks and tries in one statement, which the server
			// fails; the unlocks stand, and the other locks stay held.
			// More tries than unlocks: the entries the unlocks free in the
			// lock table are not enough for the tries. Eight rounds; every
			// lock on one session (fewer than the locks that open another).
			mixed := sqllock.MixedBatches(l)
			for round := range 8 {
				start := make(chan struct{})
				unlockErrs, tryErrs := make([]error, 2), make([]error, 16)
				for i := range unlockErrs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						unlockErrs[i] = held[i].Unlock(bg())
					}()
				}
				for i := range tryErrs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						lk, err := l.TryLock(bg(), sqllock.Int64(int64(30000+100*round+i)))
						if err == nil {
							err = lk.Unlock(bg())
						}
						tryErrs[i] = err
					}()
				}
				close(start)
				waitGroup(t, &wg, hangCeiling)
				for i, err := range unlockErrs {
					if err != nil {
						t.Errorf("round %d: Unlock %d beside tries on a full lock table = %v", round, i, err)
					}
				}
				for i, err := range tryErrs {
					if err != nil && !errors.Is(err, sqllock.ErrLockTableFull) {
						t.Errorf("round %d: TryLock %d beside unlocks on a full lock table = %v, want ErrLockTableFull", round, i, err)
					}
				}
				held = held[len(unlockErrs):]
				for i, lk := range held {
					if err := lk.Err(); err != nil {
						t.Fatalf("round %d: lock %d on the shared session after the refused tries: Err() = %v", round, i, err)
					}
				}
			}
			if n := sqllock.MixedBatches(l) - mixed; n == 0 {
				t.Fatal("in 8 rounds, no statement carried unlocks and tries together: the refused mixed batch was not tried")
			} else {
				t.Logf("%d statements of unlocks and tries in 8 rounds", n)
			}
			if _, err := filler.ExecContext(bg(), "SELECT pg_advisory_unlock_all()"); err != nil {
				t.Fatal(err)
			}
			filler.Close()
			for i, lk := range held {
				if err := lk.Err(); err != nil {
					t.Fatalf("lock %d on the shared session after the refused tries: Err() = %v", i, err)
				}
			}
			waitLocks(t, observer, len(held))
			for _, lk := range held {
				if err := lk.Unlock(bg()); err != nil {
					t.Fatalf("Unlock() = %v", err)
				}
			}
			waitNoLocks(t, observer, 5*time.Second)
		})
	}
}

// waitLocks fails t unless exactly n advisory locks are held in q's
// database, the locks of terminated sessions gone.
func waitLocks(t *testing.T, q *sql.DB, n int) {
	t.Helper()
	for range 500 {
		if advisoryCount(t, q) == n {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%d advisory locks held, want %d", advisoryCount(t, q), n)
}
