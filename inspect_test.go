package sqllock_test

import (
	"context"
	"database/sql"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// withAppName returns dsn (a URL) with its sessions named name.
func withAppName(t *testing.T, dsn, name string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

func TestInspect(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		reg := sqllock.NewRegistry()
		big, neg, pair := sqllock.Int64(1<<40+5), sqllock.Int64(-7), sqllock.Pair(-1, 5)
		reg.MustRegister("job:big", big)
		holderDB := pgtest.Open(t, "pgx", withAppName(t, dsn, "holder-app"))
		waiterDB := pgtest.Open(t, "pgx", withAppName(t, dsn, "waiter-app"))
		holder, waiter := sqllock.New(holderDB), sqllock.New(waiterDB)
		var held []*sqllock.Lock
		for _, k := range []sqllock.Key{big, neg} {
			lk, err := holder.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, lk)
		}
		shared, err := holder.RLock(bg(), pair)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if lk, err := waiter.Lock(ctx, neg); err == nil {
				lk.Unlock(bg())
			}
		}()
		testkit.WaitWaiters(t, db, neg, 1)
		// Its wait statement running (between two, it is idle).
		for lockWaiterPID(t, db, neg) == 0 {
			time.Sleep(time.Millisecond)
		}

		locks, err := sqllock.Inspect(bg(), db, reg)
		if err != nil {
			t.Fatal(err)
		}
		if len(locks) != 4 {
			t.Fatalf("Inspect() = %d locks, want 4: %+v", len(locks), locks)
		}
		// Sorted by key (bigint keys by value, then pairs), granted first.
		wantKeys := []sqllock.Key{neg, neg, big, pair}
		for i, l := range locks {
			if l.Key != wantKeys[i] {
				t.Fatalf("locks[%d].Key = %v, want %v (order %v)", i, l.Key, wantKeys[i], wantKeys)
			}
		}
		h, w := locks[0], locks[1]
		if !h.Granted || h.PID != held[1].PID() || h.ApplicationName != "holder-app" || h.Shared || !h.WaitStart.IsZero() {
			t.Errorf("holder row = %+v", h)
		}
		if w.Granted || w.ApplicationName != "waiter-app" || !slices.Equal(w.BlockedBy, []int{held[1].PID()}) {
			t.Errorf("waiter row = %+v, want blocked by %d", w, held[1].PID())
		}
		// A Locker's waiter waits in the key's line: its wait began when it
		// arrived there, whatever the server's version (pg_locks.waitstart,
		// from 14 on, is its current statement's).
		if w.WaitStart.IsZero() || time.Since(w.WaitStart) > time.Minute || time.Until(w.WaitStart) > time.Second {
			t.Errorf("waiter WaitStart = %v", w.WaitStart)
		}
		if locks[2].Name != "job:big" || locks[3].Name != "" || !locks[3].Shared {
			t.Errorf("names/modes: %+v %+v", locks[2], locks[3])
		}
		if w.Query == "" || w.State != "active" {
			t.Errorf("waiter query %q state %q", w.Query, w.State)
		}
		// The common "objid AS key" is wrong for keys of 2^32 and above and
		// for negative keys: it reads only the low 32 bits, unsigned.
		rows, err := db.Query(`SELECT objid::int8 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		var objids []int64
		for rows.Next() {
			var v int64
			rows.Scan(&v)
			objids = append(objids, v)
		}
		rows.Close()
		if !slices.Equal(objids, []int64{5, 1<<32 - 7}) {
			t.Errorf("objid column = %v; reading objid alone would report keys 5 and 4294967289 for %v and %v", objids, big, neg)
		}
		cancel()
		<-done
		for _, lk := range append(held, shared) {
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
		}
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestInspectHiddenSessions: an ordinary role sees other roles' locks but
// not their queries, and Inspect says so (a role that may read all
// statistics, as the superuser of a SQLLOCK_TEST_DSN may, sees them).
func TestInspectHiddenSessions(t *testing.T) {
	t.Parallel()
	user, privileged := heldByAnotherRole(t, 123, "")
	locks, err := sqllock.Inspect(bg(), user, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(locks) != 1 || locks[0].Key != sqllock.Int64(123) || locks[0].Hidden == privileged {
		t.Fatalf("Inspect() as a role that may read all statistics: %v = %+v, want key 123 with Hidden %v", privileged, locks, !privileged)
	}
}

// TestInspectLine: Lockers' waiters in a key's line (a holder and 5
// waiters, each of a Locker of its own) are reported as waiters for the
// key, in the order they arrived, each blocked by the holder, whether it
// waits on the key in the server, for the waiter ahead of it, or is
// between two statements; the line's own locks (tickets, doorbells) are
// not reported. Inspect's doc says so.
func TestInspectLine(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("inspect line")
		holder := sqllock.New(db)
		lk, err := holder.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg())
		var pids, arrived []int
		var wg sync.WaitGroup
		const waiters = 5
		for i := range waiters {
			l := sqllock.New(pgtest.Open(t, driverOf(db), dsn))
			wg.Add(1)
			go func() {
				defer wg.Done()
				if lk, err := l.Lock(ctx, k); err == nil {
					lk.Unlock(bg())
				}
			}()
			testkit.WaitWaiters(t, db, k, i+1)
			ls, err := sqllock.Inspect(bg(), db, nil, k)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range ls {
				if !w.Granted && !slices.Contains(arrived, w.PID) {
					arrived = append(arrived, w.PID)
				}
			}
			time.Sleep(5 * time.Millisecond) // distinct tickets
		}
		defer func() { cancel(); wg.Wait(); lk.Unlock(bg()) }()
		all, err := sqllock.Inspect(bg(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		locks, err := sqllock.Inspect(bg(), db, nil, k)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != waiters+1 || len(locks) != waiters+1 {
			t.Fatalf("Inspect() = %v, Inspect(k) = %v: want the holder and %d waiters, nothing else", all, locks, waiters)
		}
		if !locks[0].Granted || locks[0].PID != lk.PID() || locks[0].Waiters != waiters {
			t.Fatalf("holder row = %+v", locks[0])
		}
		for i, w := range locks[1:] {
			pids = append(pids, w.PID)
			if w.Granted || w.Key != k || !slices.Equal(w.BlockedBy, []int{lk.PID()}) || w.WaitStart.IsZero() {
				t.Errorf("waiter %d = %+v: blocked by %v, holder %d", i, w, w.BlockedBy, lk.PID())
			}
			if i > 0 && !locks[i].WaitStart.Before(w.WaitStart) {
				t.Errorf("waiter %d began waiting at %v, not after the one before (%v)", i, w.WaitStart, locks[i].WaitStart)
			}
		}
		if !slices.Equal(pids, arrived) {
			t.Errorf("waiters reported %v, arrived %v", pids, arrived)
		}
	})
}

// TestInspectSemaphoreLine: waiters in a semaphore's line are reported as
// waiters for the semaphore (its slot 0, named by the Registry), blocked
// by the slots' holders; the line's own locks are not reported.
func TestInspectSemaphoreLine(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		const name = "inspect semaphore line"
		reg := sqllock.NewRegistry()
		if err := reg.RegisterSemaphore(name, 1); err != nil {
			t.Fatal(err)
		}
		held, err := sqllock.New(db).Semaphore(name, 1).Acquire(bg())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg())
		var wg sync.WaitGroup
		for range 2 {
			sem := sqllock.New(pgtest.Open(t, driverOf(db), dsn)).Semaphore(name, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if lk, err := sem.Acquire(ctx); err == nil {
					lk.Unlock(bg())
				}
			}()
		}
		defer func() { cancel(); wg.Wait(); held.Unlock(bg()) }()
		var locks []sqllock.HeldLock
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if locks, err = sqllock.Inspect(bg(), db, reg); err != nil {
				t.Fatal(err)
			}
			if len(locks) >= 3 || time.Now().After(deadline) {
				break
			}
		}
		if len(locks) != 3 {
			t.Fatalf("Inspect() = %v: want the permit and 2 waiters, nothing else", locks)
		}
		for i, l := range locks {
			if l.Semaphore != name {
				t.Errorf("locks[%d] = %+v: want semaphore %q", i, l, name)
			}
			if i > 0 && (l.Granted || !slices.Equal(l.BlockedBy, []int{held.PID()}) || l.WaitStart.IsZero()) {
				t.Errorf("waiter %d = %+v: want blocked by %d, with its wait's start", i, l, held.PID())
			}
		}
	})
}
