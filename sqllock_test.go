package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

func TestLockUnlock(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithDedicatedSessions()) // the pinned connection below
		other := sqllock.New(pgtest.Open(t, "pgx", dsn))
		k := sqllock.Int64(1<<40 + 7)
		lk, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatalf("Lock() = %v", err)
		}
		if lk.Key() != k || sqllock.SharedOf(lk) || lk.Err() != nil {
			t.Fatalf("Key() = %v, Shared() = %v, Err() = %v", lk.Key(), sqllock.SharedOf(lk), lk.Err())
		}
		if got := holders(t, db, k); !slices.Equal(got, []int{lk.PID()}) {
			t.Fatalf("holders = %v, want [%d]", got, lk.PID())
		}
		// The pinned connection is the locking session.
		var pid int
		if err := sqllock.ConnOf(lk).QueryRowContext(bg(), "SELECT pg_backend_pid()").Scan(&pid); err != nil || pid != lk.PID() {
			t.Fatalf("pinned connection's backend = %d, %v; want %d", pid, err, lk.PID())
		}
		if _, err := other.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("TryLock() of a held key = %v, want ErrNotAcquired", err)
		}
		if _, err := other.TryRLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("TryRLock() of an exclusively held key = %v, want ErrNotAcquired", err)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatalf("Unlock() = %v", err)
		}
		select {
		case <-lk.Done():
		default:
			t.Fatal("Done() not closed after Unlock")
		}
		if err := lk.Err(); !errors.Is(err, sqllock.ErrReleased) {
			t.Fatalf("Err() after Unlock = %v, want ErrReleased", err)
		}
		if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrReleased) {
			t.Fatalf("second Unlock() = %v, want ErrReleased", err)
		}
		var nilLock *sqllock.Lock
		if err := nilLock.Unlock(bg()); !errors.Is(err, sqllock.ErrReleased) {
			t.Fatalf("nil Unlock() = %v, want ErrReleased", err)
		}
		select {
		case <-nilLock.Done():
		default:
			t.Fatal("nil Lock's Done() is not closed")
		}
		if err := nilLock.Err(); !errors.Is(err, sqllock.ErrReleased) {
			t.Fatalf("nil Err() = %v", err)
		}
		if _, err := sqllock.ConnOf(lk).ExecContext(bg(), "SELECT 1"); !errors.Is(err, sql.ErrConnDone) {
			t.Fatalf("pinned connection after Unlock: %v, want sql.ErrConnDone (back in the pool)", err)
		}
		if n := advisoryCount(t, db); n != 0 {
			t.Fatalf("%d advisory locks left after Unlock", n)
		}
		lk2, err := other.TryLock(bg(), k)
		if err != nil {
			t.Fatalf("TryLock() after Unlock = %v", err)
		}
		if err := lk2.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		st := l.Stats()
		if st.Acquired != 1 || st.Held != 0 || st.Discarded != 0 {
			t.Fatalf("Stats() = %+v", st)
		}
		if st := other.Stats(); st.Contended != 2 || st.Acquired != 1 {
			t.Fatalf("other Stats() = %+v", st)
		}
	})
}

func TestSharedLocks(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		k := sqllock.Pair(-3, 9)
		a, err := l.RLock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		b, err := l.TryRLock(bg(), k)
		if err != nil {
			t.Fatalf("second shared lock: %v", err)
		}
		if !sqllock.SharedOf(a) || !sqllock.SharedOf(b) || a.PID() == b.PID() {
			t.Fatalf("shared locks: %v %v on %d %d", sqllock.SharedOf(a), sqllock.SharedOf(b), a.PID(), b.PID())
		}
		if _, err := l.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("TryLock() while shared = %v", err)
		}
		// An exclusive waiter gets it once both shared holders leave.
		got := make(chan error, 1)
		go func() {
			lk, err := l.Lock(bg(), k)
			if err == nil {
				err = lk.Unlock(bg())
			}
			got <- err
		}()
		testkit.WaitWaiters(t, db, k, 1) // the waiter is queued
		for _, lk := range []*sqllock.Lock{a, b} {
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-got; err != nil {
			t.Fatalf("exclusive Lock after shared: %v", err)
		}
		if n := advisoryCount(t, db); n != 0 {
			t.Fatalf("%d advisory locks left", n)
		}
	})
}

func TestBadInput(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.DSN())
	l := sqllock.New(db)
	if _, err := l.Lock(bg(), sqllock.Key{}); !errors.Is(err, sqllock.ErrInvalidKey) {
		t.Errorf("Lock(zero Key) = %v, want ErrInvalidKey", err)
	}
	if _, err := l.TryDo(bg(), sqllock.Key{}, func(context.Context) error { return nil }); !errors.Is(err, sqllock.ErrInvalidKey) {
		t.Errorf("TryDo(zero Key) = %v, want ErrInvalidKey", err)
	}
	if err := sqllock.LockTx(bg(), nil, sqllock.Int64(1)); err == nil {
		t.Error("LockTx(nil tx) = nil")
	}
	if _, err := sqllock.Inspect(bg(), nil, nil); err == nil {
		t.Error("Inspect(nil) = nil")
	}
	// Typed nils inside the interfaces are errors, not panics.
	var nilTx *sql.Tx
	if err := sqllock.LockTx(bg(), nilTx, sqllock.Int64(1)); err == nil {
		t.Error("LockTx((*sql.Tx)(nil)) = nil")
	}
	if _, err := sqllock.TryLockTx(bg(), nilTx, sqllock.Int64(1)); err == nil {
		t.Error("TryLockTx((*sql.Tx)(nil)) = nil")
	}
	var nilDB *sql.DB
	if _, err := sqllock.Inspect(bg(), nilDB, nil); err == nil {
		t.Error("Inspect((*sql.DB)(nil)) = nil")
	}
	// A nil Lock answers with zero values.
	var nilLock *sqllock.Lock
	if k, p, sh := nilLock.Key(), nilLock.PID(), sqllock.SharedOf(nilLock); k != (sqllock.Key{}) || p != 0 || sh {
		t.Errorf("nil Lock: Key %v, PID %d, Shared %v; want zero values", k, p, sh)
	}
	var nilSession *sqllock.Session
	if err := nilSession.Err(); !errors.Is(err, sqllock.ErrReleased) || nilSession.PID() != 0 || nilSession.Conn() != nil {
		t.Errorf("nil Session: Err %v, PID %d", err, nilSession.PID())
	}
	<-nilSession.Done()
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Error("New(nil) did not panic")
			}
		}()
		sqllock.New(nil)
	}()
	ctx, cancel := context.WithCancel(bg())
	cancel()
	if _, err := l.Lock(ctx, sqllock.Int64(1)); !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
		t.Errorf("Lock(cancelled ctx) = %v, want ErrNotAcquired and context.Canceled", err)
	}
}

func TestLockWaitsAndHonoursContext(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		k := sqllock.Hash("wait")
		held, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(bg(), 150*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = l.Lock(ctx, k)
		if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock() past deadline = %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
			t.Fatalf("Lock() gave up after %v, want about 150ms", d)
		}
		// Unlock with an already cancelled context still releases.
		cctx, ccancel := context.WithCancel(bg())
		ccancel()
		if err := held.Unlock(cctx); err != nil {
			t.Fatalf("Unlock(cancelled ctx) = %v", err)
		}
		waitFree(t, db, k, 5*time.Second)
		// A waiter (of another Locker: one of the same one queues inside
		// it) is granted the lock when the holder releases it.
		held, err = l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		granted := make(chan *sqllock.Lock)
		go func() {
			lk, err := sqllock.New(db).Lock(bg(), k)
			if err != nil {
				t.Error(err)
			}
			granted <- lk
		}()
		testkit.WaitWaiters(t, db, k, 1) // the waiter is queued
		if err := held.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		lk := <-granted
		if lk == nil {
			t.FailNow()
		}
		if got := holders(t, db, k); !slices.Equal(got, []int{lk.PID()}) {
			t.Fatalf("holders = %v, want waiter %d", got, lk.PID())
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestMutualExclusion: many goroutines contend for one key; never two inside.
func TestMutualExclusion(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		k := sqllock.Pair(1, 1)
		var inside, maxInside, runs atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 15; i++ {
					err := l.Do(bg(), k, func(ctx context.Context) error {
						n := inside.Add(1)
						for {
							m := maxInside.Load()
							if n <= m || maxInside.CompareAndSwap(m, n) {
								break
							}
						}
						runs.Add(1)
						time.Sleep(100 * time.Microsecond)
						inside.Add(-1)
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		waitGroup(t, &wg, hangCeiling)
		if maxInside.Load() != 1 || runs.Load() != 16*15 {
			t.Fatalf("max inside = %d, runs = %d; want 1 and %d", maxInside.Load(), runs.Load(), 16*15)
		}
		if n := advisoryCount(t, db); n != 0 {
			t.Fatalf("%d advisory locks left", n)
		}
	})
}

func TestTryDoExactlyOne(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		const callers = 8
		k := sqllock.Hash("cron:reindex_posts")
		for round := 0; round < 5; round++ {
			var ran atomic.Int64
			backedOff := make(chan struct{}, callers)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := 0; i < callers; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l := sqllock.New(db)
					<-start
					ok, err := l.TryDo(bg(), k, func(ctx context.Context) error {
						ran.Add(1)
						// Hold the lock until every other caller has backed off.
						for j := 0; j < callers-1; j++ {
							select {
							case <-backedOff:
							case <-time.After(10 * time.Second):
								return errors.New("the others did not back off")
							}
						}
						return nil
					})
					if err != nil {
						t.Error(err)
					}
					if !ok {
						backedOff <- struct{}{}
					}
				}()
			}
			close(start)
			waitGroup(t, &wg, hangCeiling)
			if ran.Load() != 1 {
				t.Fatalf("round %d: %d callers ran, want exactly 1", round, ran.Load())
			}
		}
		if n := advisoryCount(t, db); n != 0 {
			t.Fatalf("%d advisory locks left", n)
		}
	})
}

func TestSmallPool(t *testing.T) {
	t.Parallel()
	cycles := 1000
	if testkit.Short() {
		cycles = 200
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		for _, size := range []int{1, 2} {
			db.SetMaxOpenConns(size)
			l := sqllock.New(db)
			for i := 0; i < cycles; i++ {
				k := sqllock.Int64(int64(i % 7))
				lk, err := l.TryLock(bg(), k)
				if err != nil {
					t.Fatalf("pool %d, cycle %d: TryLock = %v", size, i, err)
				}
				if err := lk.Unlock(bg()); err != nil {
					t.Fatalf("pool %d, cycle %d: Unlock = %v", size, i, err)
				}
			}
			db.SetMaxOpenConns(size + 1)
			if n := advisoryCount(t, db); n != 0 {
				t.Fatalf("pool %d: %d advisory locks left", size, n)
			}
			if st := l.Stats(); st.Acquired != int64(cycles) || st.Discarded != 0 {
				t.Fatalf("pool %d: Stats() = %+v", size, st)
			}
		}
	})
}

func TestDoReturnsErrorsAndUnlocksOnPanic(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		k := sqllock.Int64(77)
		boom := errors.New("boom")
		if err := l.Do(bg(), k, func(context.Context) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("Do() = %v, want fn's error", err)
		}
		func() {
			defer func() { _ = recover() }()
			_ = l.Do(bg(), k, func(context.Context) error { panic("fn panicked") })
		}()
		if n := advisoryCount(t, db); n != 0 {
			t.Fatalf("%d advisory locks left after fn error and panic", n)
		}
		ran, err := l.TryDo(bg(), k, func(context.Context) error { return nil })
		if !ran || err != nil {
			t.Fatalf("TryDo() = %v, %v", ran, err)
		}
	})
}
