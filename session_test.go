package sqllock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

func openCounting(t *testing.T, dsn string) (*sql.DB, *testkit.CountingConnector) {
	return openCountingDriver(t, "pgx", dsn)
}

func openCountingDriver(t *testing.T, drv, dsn string) (*sql.DB, *testkit.CountingConnector) {
	probe := pgtest.Open(t, drv, dsn)
	var inner driver.Connector
	var err error
	if d, ok := probe.Driver().(driver.DriverContext); ok {
		inner, err = d.OpenConnector(dsn)
	} else {
		inner, err = pq.NewConnector(dsn) // lib/pq's Driver has no OpenConnector
	}
	if err != nil {
		t.Fatal(err)
	}
	cc := &testkit.CountingConnector{Connector: inner}
	db := sql.OpenDB(cc)
	t.Cleanup(func() { db.Close() })
	return db, cc
}

func manyKeys(n int, class int32) []sqllock.Key {
	keys := make([]sqllock.Key, n)
	for i := range keys {
		if i%2 == 0 {
			keys[i] = sqllock.Pair(class, int32(i))
		} else {
			keys[i] = sqllock.Int64(int64(class)<<40 | int64(i))
		}
	}
	return keys
}

func TestSessionManyLocks(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	db, counter := openCounting(t, dsn)
	observer := pgtest.Open(t, "pgx", dsn)
	// A check of 5,000 locks takes about 100 ms alone, and more than a
	// second on a loaded quick run: an interval of 2 s (a check may take
	// as long) leaves it room (two checks in a row past their bound
	// report the locks lost).
	const interval = 2 * time.Second
	l := sqllock.New(db, sqllock.WithKeepAlive(interval))
	s, err := l.Session(bg())
	if err != nil {
		t.Fatal(err)
	}
	// TryLock of 1,000 keys: one round trip.
	keys := manyKeys(1000, 1)
	before := counter.Count()
	got, err := s.TryLock(bg(), keys...)
	if err != nil {
		t.Fatal(err)
	}
	if trips := counter.Count() - before; trips > 3 {
		t.Fatalf("TryLock of 1,000 keys took %d round trips, want at most 3", trips)
	}
	if len(got) != 1000 || got[0] != keys[0] || got[999] != keys[999] {
		t.Fatalf("TryLock took %d keys", len(got))
	}
	// 5,000 locks on one connection.
	more, err := s.TryLock(bg(), manyKeys(4000, 2)...)
	if err != nil || len(more) != 4000 {
		t.Fatalf("TryLock(4000) = %d, %v", len(more), err)
	}
	if n := len(s.Held()); n != 5000 {
		t.Fatalf("Held() = %d keys, want 5000", n)
	}
	if n := advisoryCount(t, observer); n != 5000 {
		t.Fatalf("pg_locks shows %d locks, want 5000", n)
	}
	// Keys already held are not taken twice (and are reported held);
	// others' keys are contended.
	again, err := s.TryLock(bg(), keys[:10]...)
	if err != nil || len(again) != 10 || again[9] != keys[9] {
		t.Fatalf("TryLock of held keys = %v, %v", again, err)
	}
	other, err := sqllock.New(observer).Session(bg())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := other.TryLock(bg(), keys[5]); len(got) != 0 || err != nil {
		t.Fatalf("another Session's TryLock of a held key = %v, %v", got, err)
	}
	mixed, err := other.TryLock(bg(), keys[0], sqllock.Int64(424242), keys[1])
	if err != nil || len(mixed) != 1 || mixed[0] != sqllock.Int64(424242) {
		t.Fatalf("TryLock with contended keys = %v, %v", mixed, err)
	}
	// One keep-alive query per interval for all 5,000 locks.
	// (Fewer on a loaded machine, where a check of 5,000 locks takes
	// longer than an interval; never more than one per interval. The
	// window lasts until two checks are done, 15 s at most.)
	st0 := l.Stats()
	began := time.Now()
	var checks int64
	for checks < 2 && time.Since(began) < 15*time.Second {
		time.Sleep(50 * time.Millisecond)
		checks = l.Stats().KeepAliveChecks - st0.KeepAliveChecks
	}
	window := time.Since(began)
	if most := int64(window/interval) + 2; checks < 2 || checks > most { // + one in flight as the window began
		t.Fatalf("%d keep-alive queries in %v at a %v interval for 5,000 locks; want one per interval (at most %d); the Session: %v", checks, window, interval, most, s.Err())
	}
	if err := s.Err(); err != nil {
		t.Fatalf("Err() = %v", err)
	}
	t.Logf("keep-alive: %d queries in %v for 5,000 locks", checks, window.Round(time.Millisecond))
	// Unlock some, then Close releases the rest.
	if err := s.Unlock(bg(), keys[:500]...); err != nil {
		t.Fatal(err)
	}
	if err := s.Unlock(bg(), keys[500]); err != nil {
		t.Fatal(err)
	}
	if err := s.Unlock(bg(), keys[500]); err == nil {
		t.Fatal("Unlock of a key not held = nil")
	}
	if n := len(s.Held()); n != 4499 {
		t.Fatalf("Held() = %d after unlocking 501", n)
	}
	if err := s.Close(bg()); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	if err := s.Close(bg()); !errors.Is(err, sqllock.ErrReleased) {
		t.Fatalf("second Close() = %v", err)
	}
	if _, err := s.TryLock(bg(), keys[0]); !errors.Is(err, sqllock.ErrReleased) {
		t.Fatalf("TryLock after Close = %v", err)
	}
	other.Close(bg())
	if n := advisoryCount(t, observer); n != 0 {
		t.Fatalf("%d locks left after Close", n)
	}
	if st := l.Stats(); st.Held != 0 || st.Discarded != 0 || st.Lost != 0 {
		t.Fatalf("Stats() = %+v", st)
	}
}

func TestSessionLost(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(50*time.Millisecond))
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Lock(bg(), sqllock.Int64(1)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.TryLock(bg(), manyKeys(10, 3)...); err != nil {
			t.Fatal(err)
		}
		terminate(t, srv, s.PID())
		select {
		case <-s.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("Session not reported lost")
		}
		if !errors.Is(s.Err(), sqllock.ErrLockLost) {
			t.Fatalf("Err() = %v", s.Err())
		}
		if _, err := s.TryLock(bg(), sqllock.Int64(2)); !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("TryLock on a lost Session = %v", err)
		}
		if st := l.Stats(); st.Lost != 11 || st.Held != 0 {
			t.Fatalf("Stats() = %+v", st)
		}
		// A context already done sends nothing and leaves a Session intact.
		s3, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		done, cancelDone := context.WithCancel(bg())
		cancelDone()
		if _, err := s3.TryLock(done, sqllock.Int64(3)); !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("TryLock(done ctx) = %v", err)
		}
		if err := s3.Lock(done, sqllock.Int64(3)); !errors.Is(err, sqllock.ErrNotAcquired) || s3.Err() != nil {
			t.Fatalf("Lock(done ctx) = %v, Err() = %v", err, s3.Err())
		}
		if err := s3.Close(bg()); err != nil {
			t.Fatal(err)
		}
		// A cancelled blocking Lock ends the Session: its outcome is unknown.
		s2, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		holder, err := l.Lock(bg(), sqllock.Int64(9))
		if err != nil {
			t.Fatal(err)
		}
		// (A deadline is kept by the server, which leaves the Session
		// intact: TestDeadlineKeptByServer. A cancel is not.)
		ctx, cancel := context.WithCancel(bg())
		defer cancel()
		time.AfterFunc(100*time.Millisecond, cancel)
		if err := s2.Lock(ctx, sqllock.Int64(9)); !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Session.Lock cancelled = %v", err)
		}
		if !errors.Is(s2.Err(), sqllock.ErrLockLost) {
			t.Fatalf("Session after a cancelled Lock: Err() = %v", s2.Err())
		}
		holder.Unlock(bg())
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestBatchKeyForms: a batch statement takes and releases the keys it is
// given, in both forms and at their extremes (pair keys travel packed in
// one bigint, their halves signed): a Session's TryLock of many keys; the
// tries that queue together on a busy shared session (each round trip 40
// ms long); and unlocks and tries that queue together behind a call that
// holds the session, which go in one statement (the Locker counts those).
// pg_locks shows exactly the keys that should be held after each.
func TestBatchKeyForms(t *testing.T) {
	t.Parallel()
	keysA := []sqllock.Key{
		sqllock.Pair(-1, 5), sqllock.Pair(5, -1), sqllock.Pair(-1, -1), sqllock.Pair(0, 0),
		sqllock.Pair(math.MinInt32, math.MaxInt32), sqllock.Pair(math.MaxInt32, math.MinInt32),
		sqllock.Int64(0), sqllock.Int64(-1), sqllock.Int64(math.MinInt64), sqllock.Int64(math.MaxInt64),
		sqllock.Int64(1<<40 + 5), sqllock.Int64(5),
	}
	keysB := []sqllock.Key{
		sqllock.Pair(-2, 7), sqllock.Pair(7, -2), sqllock.Pair(-2, -2), sqllock.Pair(0, 1),
		sqllock.Pair(math.MinInt32+1, math.MaxInt32), sqllock.Pair(math.MaxInt32, math.MinInt32+1),
		sqllock.Int64(1), sqllock.Int64(-2), sqllock.Int64(math.MinInt64 + 1), sqllock.Int64(math.MaxInt64 - 1),
		sqllock.Int64(1<<40 + 6), sqllock.Int64(6),
	}
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			dsn := srv.NewDatabase(t)
			observer := pgtest.Open(t, "pgx", dsn)
			want := func(keys []sqllock.Key, pid int, what string) {
				t.Helper()
				locks, err := sqllock.Inspect(bg(), observer, nil)
				if err != nil {
					t.Fatal(err)
				}
				held := map[sqllock.Key]bool{}
				for _, l := range locks {
					if l.Granted && (pid == 0 || l.PID == pid) {
						held[l.Key] = true
					}
				}
				for _, k := range keys {
					if !held[k] {
						t.Errorf("%s: key %v is not held", what, k)
					}
				}
				if len(held) != len(keys) {
					t.Errorf("%s: pg_locks shows %d keys held, want %d: %v", what, len(held), len(keys), held)
				}
				if t.Failed() {
					t.FailNow()
				}
			}

			s, err := sqllock.New(pgtest.Open(t, drv, dsn)).Session(bg())
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.TryLock(bg(), keysA...)
			if err != nil || len(got) != len(keysA) {
				t.Fatalf("Session TryLock of %d keys = %d keys, %v", len(keysA), len(got), err)
			}
			want(keysA, s.PID(), "a Session's batch")
			if err := s.Unlock(bg(), keysA...); err != nil {
				t.Fatalf("Session Unlock = %v", err)
			}
			want(nil, 0, "after the Session's Unlock")
			s.Close(bg())

			slow := pgtest.StartProxy(t, srv.Addr(), 20*time.Millisecond)
			l := sqllock.New(pgtest.Open(t, drv, slow.DSN(dsn)))
			sqllock.SkipPoolerProbe(l) // its statements are not the lock calls' round trips counted below
			var wg sync.WaitGroup
			try := func(k sqllock.Key, into **sqllock.Lock) {
				lk, err := l.TryLock(bg(), k)
				if err != nil {
					t.Errorf("TryLock(%v) = %v", k, err)
				}
				*into = lk
			}
			unlock := func(lk *sqllock.Lock) {
				if err := lk.Unlock(bg()); err != nil {
					t.Errorf("Unlock(%v) = %v", lk.Key(), err)
				}
			}
			cur, next := keysA, keysB
			locks := make([]*sqllock.Lock, len(cur))
			for i, k := range cur {
				wg.Go(func() { try(k, &locks[i]) })
			}
			waitGroup(t, &wg, hangCeiling)
			if trips := slow.RoundTrips(); trips >= int64(len(cur)) {
				t.Errorf("%d round trips for %d tries at once: they did not meet in batches", trips, len(cur))
			}
			want(cur, 0, "tries that met on a shared session")
			// Twice (lib/pq's session prepares its statements after a few):
			// a call's unlock holds the session while the others' unlocks
			// and tries queue behind it.
			for round := range 2 {
				mixed := sqllock.MixedBatches(l)
				var blocker *sqllock.Lock
				try(sqllock.Int64(424242), &blocker)
				wg.Go(func() { unlock(blocker) })
				time.Sleep(5 * time.Millisecond)
				took := make([]*sqllock.Lock, len(next))
				for i, lk := range locks {
					wg.Go(func() { unlock(lk) })
					wg.Go(func() { try(next[i], &took[i]) })
				}
				waitGroup(t, &wg, hangCeiling)
				want(next, 0, fmt.Sprintf("round %d: unlocks and tries that met", round))
				if sqllock.MixedBatches(l) == mixed {
					t.Fatalf("round %d: no statement carried unlocks and tries together", round)
				}
				locks, cur, next = took, next, cur
			}
			for _, lk := range locks {
				wg.Go(func() { unlock(lk) })
			}
			waitGroup(t, &wg, hangCeiling)
			want(nil, 0, "after the unlocks that met")
		})
	}
}

// TestSessionLockTableFull: filling the server's lock table returns
// ErrLockTableFull, releases what the failed call took, and keeps the
// Session's earlier locks.
func TestSessionLockTableFull(t *testing.T) {
	long(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		observer := pgtest.Open(t, "pgx", dsn)
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(bg())
		if _, err := s.TryLock(bg(), manyKeys(100, 4)...); err != nil {
			t.Fatal(err)
		}
		_, err = s.TryLock(bg(), manyKeys(100000, 5)...)
		if !errors.Is(err, sqllock.ErrLockTableFull) {
			t.Fatalf("TryLock past the lock table = %v, want ErrLockTableFull", err)
		}
		if s.Err() != nil || len(s.Held()) != 100 {
			t.Fatalf("after ErrLockTableFull: Err() = %v, Held() = %d; want the 100 earlier locks", s.Err(), len(s.Held()))
		}
		if n := advisoryCount(t, observer); n != 100 {
			t.Fatalf("pg_locks shows %d locks, want 100 (the failed call's locks released)", n)
		}
		if err := s.Close(bg()); err != nil {
			t.Fatal(err)
		}
		if n := advisoryCount(t, observer); n != 0 {
			t.Fatalf("%d locks left", n)
		}
	})
}

// TestSessionUnlockRepeatedKey: a key given twice to Unlock is released
// once, and the Session keeps its other locks.
func TestSessionUnlockRepeatedKey(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		a, b := sqllock.Int64(71), sqllock.Int64(72)
		if got, err := s.TryLock(bg(), a, b); err != nil || len(got) != 2 {
			t.Fatalf("TryLock = %v, %v", got, err)
		}
		if err := s.Unlock(bg(), a, a); err != nil {
			t.Fatalf("Unlock(k, k) = %v, want nil", err)
		}
		if err := s.Err(); err != nil {
			t.Fatalf("Err() after Unlock(k, k) = %v", err)
		}
		if held := s.Held(); len(held) != 1 || held[0] != b {
			t.Fatalf("Held() = %v, want [%v]", held, b)
		}
		if pids := holders(t, db, b); len(pids) != 1 || pids[0] != s.PID() {
			t.Fatalf("holders of %v = %v, want [%d]", b, pids, s.PID())
		}
		if err := s.Unlock(bg(), a); err == nil {
			t.Fatal("Unlock of a released key = nil")
		}
		if err := s.Close(bg()); err != nil {
			t.Fatal(err)
		}
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestStatementRowsClosedOnce: sqllock closes the rows of every statement
// it runs on a driver connection exactly once. lib/pq's Close, called a
// second time under a cancellable context (the unlock's, always) before
// its watcher goroutine has run, panics ("attempt to set nil err"): a
// Session.Unlock did that with one processor.
func TestStatementRowsClosedOnce(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, cc := openCountingDriver(t, drv, dsn)
			l := sqllock.New(db, sqllock.WithKeepAlive(0))
			s, err := l.Session(bg())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(bg())
			ctx, cancel := context.WithCancel(bg())
			defer cancel()
			keys := manyKeys(10, 94)
			for i := range 5 {
				got, err := s.TryLock(ctx, keys...)
				if err != nil || len(got) != len(keys) {
					t.Fatalf("round %d: TryLock = %v, %v", i, got, err)
				}
				if err := s.Unlock(ctx, got...); err != nil {
					t.Fatalf("round %d: Unlock: %v", i, err)
				}
			}
			lk, err := l.Lock(ctx, keys[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if n := cc.DoubleCloses(); n != 0 {
				t.Fatalf("%d rows closed twice", n)
			}
		})
	}
}

// TestSessionLostDuringWait: a Session found lost while its Lock waits in
// the server is told at once (Err, Done), without waiting for the wait;
// its connection is discarded as the wait returns, so the server frees
// what it held and what the wait was granted.
func TestSessionLostDuringWait(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		a, b := sqllock.Int64(201), sqllock.Int64(202)
		other := sqllock.New(pgtest.Open(t, "pgx", dsn))
		holder, err := other.Lock(bg(), b)
		if err != nil {
			t.Fatal(err)
		}
		l := sqllock.New(db)
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.TryLock(bg(), a); len(got) != 1 || err != nil {
			t.Fatalf("TryLock(a) = %v, %v", got, err)
		}
		waited := make(chan error, 1)
		go func() { waited <- s.Lock(bg(), b) }()
		testkit.WaitWaiters(t, db, b, 1)

		start := time.Now()
		lost := make(chan struct{})
		go func() {
			sqllock.LoseSession(s, errors.New("found gone"))
			close(lost)
		}()
		select {
		case <-lost:
		case <-time.After(2 * time.Second):
			t.Fatal("reporting the Session lost waited for its Lock's wait")
		}
		select {
		case <-s.Done():
		case <-time.After(time.Second):
			t.Fatal("Done not closed for a lost Session")
		}
		if !errors.Is(s.Err(), sqllock.ErrLockLost) {
			t.Fatalf("Err() = %v, want ErrLockLost", s.Err())
		}
		t.Logf("told lost in %v, its wait still on", time.Since(start))
		// The wait goes on in the server: the session holds a still.
		if n := advisoryCount(t, db); n != 3 { // a, the holder's b, the wait for b
			t.Fatalf("%d advisory locks while the lost Session waits, want 3", n)
		}
		if err := holder.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-waited:
			// Granted, to a session that goes: the Session was lost.
			if !errors.Is(err, sqllock.ErrLockLost) {
				t.Fatalf("the lost Session's Lock = %v, want ErrLockLost", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the wait did not return once b was free")
		}
		if held, st := s.Held(), l.Stats(); len(held) != 0 || st.Held != 0 {
			t.Fatalf("a lost Session: Held() = %v, Stats().Held = %d", held, st.Held)
		}
		waitNoLocks(t, db, 5*time.Second) // a and the granted b went with the session
		if got, err := other.TryLock(bg(), a); err != nil {
			t.Fatalf("TryLock(a) after the Session's end = %v", err)
		} else if err := got.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSessionConnStatementDoesNotDelayLoss: a statement of the caller's own
// on Session.Conn() does not hold up whoever reports the Session lost (the
// keep-alive, which watches the Locker's other locks too); the connection
// is discarded once that statement returns.
func TestSessionConnStatementDoesNotDelayLoss(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		s, err := sqllock.New(db).Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.TryLock(bg(), sqllock.Int64(301)); len(got) != 1 || err != nil {
			t.Fatalf("TryLock = %v, %v", got, err)
		}
		conn, pid := s.Conn(), s.PID()
		slept := make(chan error, 1)
		go func() {
			_, err := conn.ExecContext(bg(), "SELECT pg_sleep(2)")
			slept <- err
		}()
		observer := pgtest.Open(t, "pgx", dsn)
		for deadline := time.Now().Add(5 * time.Second); ; {
			var state string
			if err := observer.QueryRow("SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = $1", pid).Scan(&state); err == nil && state == "PgSleep" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the caller's statement did not start")
			}
			time.Sleep(10 * time.Millisecond)
		}
		start := time.Now()
		sqllock.LoseSession(s, errors.New("found gone"))
		if took := time.Since(start); took > time.Second {
			t.Fatalf("reporting the Session lost took %v: it waited for the caller's statement", took)
		}
		if !errors.Is(s.Err(), sqllock.ErrLockLost) {
			t.Fatalf("Err() = %v, want ErrLockLost", s.Err())
		}
		if err := <-slept; err != nil {
			t.Fatalf("the caller's statement: %v", err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; {
			var n int
			if err := observer.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the lost Session's backend is still there after the caller's statement returned")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// TestSessionConnSettingsStayOut: settings made on Session.Conn() never
// come back through the pool: Close closes a connection it handed out.
func TestSessionConnSettingsStayOut(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		db.SetMaxOpenConns(2)
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.TryLock(bg(), sqllock.Int64(95)); err != nil {
			t.Fatal(err)
		}
		conn := s.Conn()
		for _, q := range []string{"SET lock_timeout = '1ms'", "SET statement_timeout = '50ms'", "SET application_name = 'leaked'"} {
			if _, err := conn.ExecContext(bg(), q); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(bg()); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		// Every connection the pool hands out now, the Session's among
		// them were it given back, has the server's settings.
		conns := make([]*sql.Conn, 2)
		for i := range conns {
			if conns[i], err = db.Conn(bg()); err != nil {
				t.Fatal(err)
			}
			defer conns[i].Close()
			var st, app string
			if err := conns[i].QueryRowContext(bg(), "SELECT current_setting('statement_timeout'), current_setting('application_name')").Scan(&st, &app); err != nil {
				t.Fatal(err)
			}
			if st != "0" || app == "leaked" {
				t.Errorf("a pooled connection has statement_timeout %q, application_name %q: the Session's settings came back", st, app)
			}
			if _, err := conns[i].ExecContext(bg(), "SELECT pg_sleep(0.1)"); err != nil {
				t.Errorf("pg_sleep(0.1) on a pooled connection: %v", err)
			}
		}
		if got := holders(t, pgtest.Open(t, "pgx", dsn), sqllock.Int64(95)); len(got) != 0 {
			t.Errorf("holders of 95 after Close = %v", got)
		}
	})
}
