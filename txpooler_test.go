package sqllock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestTxPoolerBasics: behind PgBouncer in transaction mode, with
// WithTransactionPooler, each handle works, two Lockers exclude each
// other, and nothing is left on the pooler's server sessions once they
// let go. pgx keeps its default statement cache.
func TestTxPoolerBasics(t *testing.T) {
	dsn, bdsn := behindPgBouncer(t, "transaction", 4)
	observer := pgtest.Open(t, "pgx", dsn)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			startPoolerTraffic(t, bdsn, sqllock.Int64(7499), 2)
			a := sqllock.New(pgtest.Open(t, drv, bdsn), sqllock.WithTransactionPooler())
			b := sqllock.New(pgtest.Open(t, drv, bdsn), sqllock.WithTransactionPooler())
			defer a.Close(bg())
			defer b.Close(bg())
			k := sqllock.Int64(7400 + int64(len(drv)))
			lk, err := a.Lock(bg(), k)
			if err != nil {
				t.Fatalf("Lock() = %v", err)
			}
			if h := holders(t, observer, k); len(h) != 1 || h[0] != lk.PID() {
				t.Fatalf("holders of %v = %v, want [%d]", k, h, lk.PID())
			}
			if _, err := b.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("another Locker's TryLock() of a held key = %v, want ErrNotAcquired", err)
			}
			tok1, err := lk.Token(bg())
			if err != nil {
				t.Fatalf("Token() = %v", err)
			}
			// b waits; a releases; b gets it.
			got := make(chan error, 1)
			var blk *sqllock.Lock
			go func() {
				ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
				defer cancel()
				var err error
				blk, err = b.Lock(ctx, k)
				got <- err
			}()
			time.Sleep(200 * time.Millisecond)
			if err := lk.Unlock(bg()); err != nil {
				t.Fatalf("Unlock() = %v", err)
			}
			if err := <-got; err != nil {
				t.Fatalf("the waiting Lock() = %v", err)
			}
			tok2, err := blk.Token(bg())
			if err != nil || tok2 <= tok1 {
				t.Fatalf("the next holder's Token() = %d, %v; want more than %d", tok2, err, tok1)
			}
			if err := blk.Unlock(bg()); err != nil {
				t.Fatalf("Unlock() = %v", err)
			}
			// RLock, Do, a semaphore, an election.
			r1, err := a.RLock(bg(), k)
			if err != nil {
				t.Fatalf("RLock() = %v", err)
			}
			r2, err := b.RLock(bg(), k)
			if err != nil {
				t.Fatalf("a second RLock() = %v", err)
			}
			r1.Unlock(bg())
			r2.Unlock(bg())
			ran := false
			if err := a.Do(bg(), k, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
				t.Fatalf("Do() = %v, ran %v", err, ran)
			}
			sem := a.Semaphore("txpool-"+drv, 2)
			p1, err1 := sem.Acquire(bg())
			p2, err2 := sem.Acquire(bg())
			if err1 != nil || err2 != nil {
				t.Fatalf("Acquire() = %v, %v", err1, err2)
			}
			if _, err := sem.TryAcquire(bg()); !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("a third TryAcquire() = %v, want ErrNotAcquired", err)
			}
			p1.Unlock(bg())
			p2.Unlock(bg())
			el := a.Election(sqllock.Int64(7410 + int64(len(drv))))
			term, err := el.Campaign(bg(), "leader-a")
			if err != nil {
				t.Fatalf("Campaign() = %v", err)
			}
			if err := el.Proclaim(bg(), "leader-a2"); err != nil {
				t.Fatalf("Proclaim() = %v", err)
			}
			if ld, err := b.Election(sqllock.Int64(7410 + int64(len(drv)))).Leader(bg()); err != nil || ld.Value != "leader-a2" {
				t.Fatalf("Leader() = %+v, %v; want leader-a2", ld, err)
			}
			term.Unlock(bg())
			if _, err := a.Session(bg()); err == nil {
				t.Fatal("Session() with WithTransactionPooler: no error")
			}
			a.Close(bg())
			b.Close(bg())
			time.Sleep(200 * time.Millisecond)
			if n := advisoryCount(t, observer); n != 0 {
				t.Fatalf("%d advisory locks left on the server after both Lockers closed", n)
			}
		})
	}
}
