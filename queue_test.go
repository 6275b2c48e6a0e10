package sqllock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// The Locker's queues: its callers that wait for one key queue inside it,
// in arrival order, and only the first waits in the server.

// waitingRows returns how many sessions wait in the server for k itself,
// or for a ticket of its line (see testkit.Blocked): a shared session that
// holds places in line for a Locker's queued callers waits for nothing.
func waitingRows(t testing.TB, q sqllock.Querier, k sqllock.Key) int {
	t.Helper()
	return testkit.Blocked(t, q, k)
}

// watchWaiting samples, until stop is closed, the most sessions seen
// waiting for k at once.
func watchWaiting(t testing.TB, q sqllock.Querier, k sqllock.Key, stop <-chan struct{}) <-chan int {
	most := make(chan int, 1)
	go func() {
		m := 0
		for {
			select {
			case <-stop:
				most <- m
				return
			case <-time.After(5 * time.Millisecond):
			}
			m = max(m, waitingRows(t, q, k))
		}
	}()
	return most
}

// TestQueueArrivalOrder: 50 goroutines of one Locker, arriving 20 ms
// apart on a key another Locker holds, are served in exactly their order
// of arrival, and at most one of the Locker's sessions waits in the
// server for the key at any time.
func TestQueueArrivalOrder(t *testing.T) {
	t.Parallel()
	const n = 50
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		observer := pgtest.Open(t, "pgx", dsn)
		k := sqllock.Int64(3800)
		holder, err := sqllock.New(pgtest.Open(t, "pgx", dsn)).Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		l := sqllock.New(db)
		stop := make(chan struct{})
		most := watchWaiting(t, observer, k, stop)
		var mu sync.Mutex
		var served []int
		var wg sync.WaitGroup
		var arrivals atomic.Int64
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Arrival is the call (a goroutine started on a loaded
				// machine may run later than the next one); the next
				// starts once this one queued (one preempted between
				// the two for longer than the pause would arrive later).
				i := int(arrivals.Add(1) - 1)
				lk, err := l.Lock(bg(), k)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				served = append(served, i)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				if err := lk.Unlock(bg()); err != nil {
					t.Error(err)
				}
			}()
			for deadline := time.Now().Add(10 * time.Second); sqllock.Queued(l, k) <= i && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := holder.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		waitGroup(t, &wg, hangCeiling)
		close(stop)
		want := make([]int, n)
		for i := range want {
			want[i] = i
		}
		if !slices.Equal(served, want) {
			t.Errorf("served in the order %v, want the order of arrival", served)
		}
		if m := <-most; m > 1 {
			t.Errorf("%d of the Locker's sessions waited in the server at once, want at most 1", m)
		}
	})
}

// TestQueueManyWaitersFewSessions: 500 goroutines of one Locker wait for
// 10 keys other Lockers hold: at most 10 of its sessions wait in the
// server, at most 26 are open in all (the shared ones and the waiting
// ones), and all 500 are served once the keys are free.
func TestQueueManyWaitersFewSessions(t *testing.T) {
	t.Parallel()
	const waiters, keys = 500, 10
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		observer := pgtest.Open(t, "pgx", dsn)
		holderL := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		var held []*sqllock.Lock
		for i := range keys {
			lk, err := holderL.Lock(bg(), sqllock.Pair(3801, int32(i)))
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, lk)
		}
		l := sqllock.New(db)
		var served atomic.Int64
		var wg sync.WaitGroup
		for i := range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lk, err := l.Lock(bg(), sqllock.Pair(3801, int32(i%keys)))
				if err != nil {
					t.Error(err)
					return
				}
				served.Add(1)
				if err := lk.Unlock(bg()); err != nil {
					t.Error(err)
				}
			}()
		}
		// Every key has its waiter in the server; look a while longer.
		for i := range keys {
			testkit.WaitWaiters(t, observer, sqllock.Pair(3801, int32(i)), 1)
		}
		mostWaiting, mostOpen := 0, 0
		for range 20 {
			n := 0
			for i := range keys {
				n += waitingRows(t, observer, sqllock.Pair(3801, int32(i)))
			}
			mostWaiting = max(mostWaiting, n)
			mostOpen = max(mostOpen, db.Stats().OpenConnections)
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%d waiters on %d keys: at most %d waiting sessions, %d open", waiters, keys, mostWaiting, mostOpen)
		if mostWaiting > keys {
			t.Errorf("%d sessions waited in the server, want at most %d", mostWaiting, keys)
		}
		if mostOpen > 26 {
			t.Errorf("the Locker had %d sessions open, want at most 26", mostOpen)
		}
		for _, lk := range held {
			lk.Unlock(bg())
		}
		waitGroup(t, &wg, hangCeiling)
		if got := served.Load(); got != waiters {
			t.Errorf("%d of %d waiters served", got, waiters)
		}
		if st := db.Stats(); st.OpenConnections > 26 {
			t.Errorf("the Locker had %d sessions open once all were served, want at most 26", st.OpenConnections)
		}
	})
}

// TestQueueKeysAfterContention: 60 free keys, each found held by a waiting
// call less than a second before, are then held at once on at most 16
// sessions: a free key is tried on a shared session first, whatever
// happened to it before.
func TestQueueKeysAfterContention(t *testing.T) {
	t.Parallel()
	const keys = 60
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		other := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		observer := pgtest.Open(t, "pgx", dsn)
		for i := range keys {
			k := sqllock.Pair(3802, int32(i))
			h, err := other.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				lk, err := l.Lock(bg(), k) // finds k held, waits
				if err == nil {
					err = lk.Unlock(bg())
				}
				got <- err
			}()
			testkit.WaitWaiters(t, observer, k, 1)
			h.Unlock(bg())
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		}
		began := time.Now()
		var locks []*sqllock.Lock
		for i := range keys {
			lk, err := l.Lock(bg(), sqllock.Pair(3802, int32(i)))
			if err != nil {
				t.Fatal(err)
			}
			locks = append(locks, lk)
		}
		pids := map[int]bool{}
		for _, lk := range locks {
			pids[lk.PID()] = true
		}
		t.Logf("%d keys, contended within the last %v, held on %d sessions", keys, time.Since(began).Round(time.Millisecond), len(pids))
		if len(pids) > 16 {
			t.Errorf("%d keys held on %d sessions, want at most 16", keys, len(pids))
		}
		for _, lk := range locks {
			lk.Unlock(bg())
		}
	})
}

// TestQueueLeaveOnCancel: a caller whose context ends while it waits in
// the Locker's queue leaves it while the key is still held, and takes
// nothing; those behind it are served, in order.
func TestQueueLeaveOnCancel(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Int64(3803)
		holder, err := sqllock.New(pgtest.Open(t, "pgx", dsn)).Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		l := sqllock.New(db)
		first := make(chan *sqllock.Lock, 1)
		go func() {
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Error(err)
			}
			first <- lk
		}()
		testkit.WaitWaiters(t, db, k, 1)
		ctx, cancel := context.WithCancel(bg())
		left := make(chan error, 1)
		go func() {
			_, err := l.Lock(ctx, k)
			left <- err
		}()
		queued := func(n int) {
			for deadline := time.Now().Add(10 * time.Second); sqllock.Queued(l, k) != n; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("Queued = %d, want %d callers of the key", sqllock.Queued(l, k), n)
				}
			}
		}
		queued(2)
		third := make(chan *sqllock.Lock, 1)
		go func() {
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Error(err)
			}
			third <- lk
		}()
		queued(3)
		// The key stays held until the cancelled caller has left: it
		// leaves by itself, or not at all.
		began := time.Now()
		cancel()
		select {
		case err := <-left:
			if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
				t.Errorf("the cancelled caller's Lock = %v, want ErrNotAcquired and context.Canceled", err)
			}
			t.Logf("the cancelled caller left after %v", time.Since(began))
		case <-time.After(hangCeiling):
			t.Fatalf("the cancelled caller did not leave the queue in %v, while the key was held", hangCeiling)
		}
		queued(2)
		holder.Unlock(bg())
		lk := <-first
		if lk == nil {
			t.FailNow()
		}
		lk.Unlock(bg())
		lk = <-third
		if lk == nil {
			t.FailNow()
		}
		if got := holders(t, db, k); !slices.Equal(got, []int{lk.PID()}) {
			t.Errorf("holders = %v, want the third caller's backend %d", got, lk.PID())
		}
		lk.Unlock(bg())
		waitFree(t, db, k, 5*time.Second)
	})
}

// TestQueueRemoteWaiterServed: while 64 goroutines of one Locker take and
// release one key as fast as they can (the key handed from one to the
// next inside the Locker), a waiter in another process is served in its
// turn: while it waits, each local caller is granted the key at most once
// (they queued before it, each with its place in line), so at most 64
// local grants fall in its wait (16 more allowed: a grant is stamped a
// moment after the server gave it). Its wait is counted from its arrival
// in the key's line, by the server (its ticket seen in pg_locks): its call
// reaches the line only once a session of its own is set up for the wait,
// which on a loaded machine takes long enough for many local grants.
func TestQueueRemoteWaiterServed(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			l := sqllock.New(pgtest.Open(t, drv, dsn))
			k := sqllock.Int64(3804)
			ctx, cancel := context.WithCancel(bg())
			var cycles atomic.Int64
			var grantsMu sync.Mutex
			var grants []time.Time
			var wg sync.WaitGroup
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						lk, err := l.Lock(ctx, k)
						if err != nil {
							return
						}
						cycles.Add(1)
						grantsMu.Lock()
						grants = append(grants, time.Now())
						grantsMu.Unlock()
						lk.Unlock(bg())
					}
				}()
			}
			time.Sleep(300 * time.Millisecond)
			observer := pgtest.Open(t, "pgx", dsn)
			waits := []time.Duration{}
			passed := []int{}
			for i := range 5 {
				name := fmt.Sprintf("sqllock-remote-w%d", i)
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=remote-waiter", "HELPER_DRIVER="+drv, "HELPER_DSN="+withAppName(t, dsn, name), "HELPER_KEY=3804")
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				exited := make(chan error, 1)
				go func() { exited <- waitHelper(cmd, helperCeiling) }()
				// When it joins the line, by this process's clock (a poll
				// late by one query at most: fewer grants counted, never more).
				var inLine time.Time
				var werr error
			poll:
				for {
					select {
					case werr = <-exited:
						break poll
					default:
					}
					if inLine.IsZero() && slices.Contains(testkit.LineOrder(t, observer, k), name) {
						inLine = time.Now()
					}
					time.Sleep(2 * time.Millisecond)
				}
				if werr != nil {
					t.Fatalf("the waiter process (its ticket seen in the line: %v): %v: %s%s", !inLine.IsZero(), werr, stdout.Bytes(), stderr.Bytes())
				}
				out := stdout.Bytes()
				// Its wait, and when it began (one clock: the machine's).
				var d time.Duration
				var began int64
				var err error
				fields := strings.Fields(string(out))
				if len(fields) == 2 {
					d, err = time.ParseDuration(fields[0])
					if err == nil {
						began, err = strconv.ParseInt(fields[1], 10, 64)
					}
				}
				if len(fields) != 2 || err != nil {
					t.Fatalf("the waiter process said %q", out)
				}
				from := time.Unix(0, began)
				to := from.Add(d)
				if inLine.After(from) {
					from = inLine // else granted before a poll saw it wait: counted from its call
				}
				waits = append(waits, to.Sub(from))
				n := 0
				grantsMu.Lock()
				for _, g := range grants {
					if g.After(from) && g.Before(to) {
						n++
					}
				}
				grantsMu.Unlock()
				passed = append(passed, n)
			}
			cancel()
			waitGroup(t, &wg, hangCeiling)
			t.Logf("%s: %d local cycles; a waiter in another process was granted %v after it joined the line, with %v local grants in that wait", drv, cycles.Load(), waits, passed)
			for i, n := range passed {
				if n > 64+16 {
					t.Errorf("a waiter in another process waited %v, while the local callers were granted the key %d times: want at most 64 (+16)", waits[i], n)
				}
			}
			if cycles.Load() < 100 {
				t.Errorf("%d local cycles: the Locker's own callers were not served", cycles.Load())
			}
		})
	}
}

// helperRemoteWaiter takes HELPER_KEY once, and prints how long that took.
func helperRemoteWaiter(db *sql.DB) int {
	k, err := strconv.ParseInt(os.Getenv("HELPER_KEY"), 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// Its debug log goes to stderr, which the test shows when it fails:
	// whether it waited with a ticket, and why not.
	l := sqllock.New(db, sqllock.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Set up first (connection, server check, pooler probe), on another
	// key: the wait measured is the wait for k.
	warm, err := l.Lock(ctx, sqllock.Int64(k+1))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	warm.Unlock(context.Background())
	began := time.Now()
	lk, err := l.Lock(ctx, sqllock.Int64(k))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	took := time.Since(began)
	lk.Unlock(context.Background())
	fmt.Println(took, began.UnixNano())
	return 0
}

// TestLockHoldInHandle: a lock's hold is made in its handle, whichever
// way it came: a try, a wait on the server, and a key handed on inside
// the Locker (the waiter's lock then sits on the releaser's backend).
// Each such lock holds its key, and its Unlock frees it.
func TestLockHoldInHandle(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l, other := sqllock.New(db), sqllock.New(pgtest.Open(t, "pgx", dsn))
		k := sqllock.Int64(3805)
		waitFor := func(ok func() bool) {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("not within 10 s")
				}
			}
		}
		check := func(how string, lk *sqllock.Lock) {
			t.Helper()
			if !sqllock.OwnHold(lk) {
				t.Errorf("%s: the hold was made apart from its handle", how)
			}
			if got := holders(t, db, k); !slices.Equal(got, []int{lk.PID()}) {
				t.Errorf("%s: holders = %v, want %d", how, got, lk.PID())
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Errorf("%s: unlock: %v", how, err)
			}
			waitFree(t, db, k, 5*time.Second)
		}
		lk, err := l.TryLock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		check("try", lk)

		held, err := other.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		// lockAside has l wait for k in a goroutine: its lock comes on got.
		got := make(chan *sqllock.Lock, 1)
		lockAside := func() {
			go func() {
				lk, err := l.Lock(bg(), k)
				if err != nil {
					t.Error(err)
				}
				got <- lk
			}()
		}
		lockAside()
		testkit.WaitWaiters(t, db, k, 1)
		held.Unlock(bg())
		check("waited on the server", <-got)

		// Handed on: a caller queued behind the Locker's own holder is
		// handed the key without a statement, once a check found no one
		// else in line, within a run after the server's grant (here long:
		// the check's answer takes what a loaded machine takes).
		sqllock.SetHandoffRun(l, time.Hour)
		first, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		lockAside()
		waitFor(func() bool { return sqllock.Queued(l, k) == 1 && sqllock.NextCleared(l, k) })
		before := sqllock.HandOffs(l)
		first.Unlock(bg())
		next := <-got
		if sqllock.HandOffs(l) == before {
			t.Error("a caller queued behind the Locker's holder, cleared by the check of the line, was not handed the key inside the Locker")
		}
		check("queued behind the Locker's holder", next)
	})
}
