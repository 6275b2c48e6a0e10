package sqllock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

func TestSemaphoreBasics(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		sem := l.Semaphore("exports", 3)
		var permits []*sqllock.Lock
		for i := 0; i < 3; i++ {
			p, err := sem.TryAcquire(bg())
			if err != nil {
				t.Fatalf("TryAcquire %d: %v", i, err)
			}
			permits = append(permits, p)
		}
		if _, err := sem.TryAcquire(bg()); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("a fourth TryAcquire = %v, want ErrNotAcquired", err)
		}
		slots := map[sqllock.Key]bool{}
		for _, p := range permits {
			slots[p.Key()] = true
		}
		for _, k := range sqllock.SemaphoreSlots("exports", 3) {
			if !slots[k] {
				t.Fatalf("slot %v not taken; permits %v", k, slots)
			}
		}
		// Inspect, given the semaphore in a registry, names its slots.
		reg := sqllock.NewRegistry()
		if err := reg.RegisterSemaphore("exports", 3); err != nil {
			t.Fatal(err)
		}
		locks, err := sqllock.Inspect(bg(), db, reg)
		if err != nil || len(locks) != 3 {
			t.Fatalf("Inspect = %v, %v", locks, err)
		}
		for _, l := range locks {
			if l.Semaphore != "exports" || !strings.HasPrefix(l.Name, "exports[") {
				t.Fatalf("slot row %+v: want semaphore exports, name exports[i]", l)
			}
		}
		// A waiter is served when a slot frees.
		got := make(chan error, 1)
		go func() {
			p, err := sem.Acquire(bg())
			if err == nil {
				err = p.Unlock(bg())
			}
			got <- err
		}()
		waitSemaphoreWaiter(t, db, "exports", 3)
		start := time.Now()
		if err := permits[1].Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		t.Logf("waiter served %v after a slot freed", time.Since(start).Round(time.Millisecond))
		permits[0].Unlock(bg())
		permits[2].Unlock(bg())
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestSemaphoreProcesses: 3 OS processes × 8 goroutines share a semaphore
// of 3 slots, with waits whose deadlines race the releases: never more
// than 3 inside (checked by the workers, and by pg_locks from here), every
// worker gets in (every process, in the two-second run of -short), and
// no slot stays held.
func TestSemaphoreProcesses(t *testing.T) {
	t.Parallel()
	run := 10 * time.Second
	if testkit.Short() {
		run = 2 * time.Second
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			srv := pgtest.Start(t)
			dsn := srv.NewDatabase(t)
			observer := pgtest.Open(t, "pgx", dsn)
			dir := t.TempDir()
			for _, sub := range []string{"ready", "inside"} {
				if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			outs := make([]bytes.Buffer, 3)
			errs := make([]error, 3)
			for i := range outs {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=semaphore", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn,
					"HELPER_DIR="+dir, "HELPER_RUN="+run.String())
				if !testkit.Short() {
					cmd.Env = append(cmd.Env, "HELPER_EVERY=1")
				}
				cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = runHelper(cmd, helperCeiling) }()
			}
			slots := map[sqllock.Key]bool{}
			for _, k := range sqllock.SemaphoreSlots("reports", 3) {
				slots[k] = true
			}
			exited := make(chan struct{})
			go func() { wg.Wait(); close(exited) }()
			most := 0
			for running := true; running; {
				select {
				case <-exited:
					running = false
				default:
				}
				locks, err := sqllock.Inspect(bg(), observer, nil)
				if err != nil {
					t.Fatal(err)
				}
				held := 0
				for _, l := range locks {
					if l.Granted && slots[l.Key] {
						held++
					}
				}
				most = max(most, held)
				time.Sleep(20 * time.Millisecond)
			}
			waitGroup(t, &wg, hangCeiling)
			for i, err := range errs {
				t.Logf("process %d: %s", i, bytes.TrimSpace(outs[i].Bytes()))
				if err != nil {
					t.Errorf("process %d: %v: %s", i, err, outs[i].String())
					continue
				}
				lines := strings.Split(strings.TrimSpace(outs[i].String()), "\n")
				got := 0
				for j, f := range strings.Fields(lines[len(lines)-1]) {
					n, err := strconv.Atoi(f)
					if err != nil {
						t.Fatalf("process %d: entries %q: %v", i, lines[len(lines)-1], err)
					}
					got += n
					if n == 0 && !testkit.Short() {
						t.Errorf("process %d: worker %d never got in", i, j)
					}
				}
				if got == 0 {
					t.Errorf("process %d: no worker got in", i)
				}
			}
			t.Logf("most slots held at once, as pg_locks showed them: %d", most)
			if most > 3 {
				t.Fatalf("pg_locks showed %d slots held at once", most)
			}
			waitNoLocks(t, observer, 10*time.Second)
		})
	}
}

// TestSemaphoreCtxEndsAfterTry: an Acquire whose ctx ends just after its
// try found every slot held, before it waits (a moment that a deadline
// racing the call can hit: TestSemaphoreCancelRace met it once in 10,000
// calls), returns an error matching both ErrNotAcquired and ctx's error,
// and takes nothing.
func TestSemaphoreCtxEndsAfterTry(t *testing.T) {
	t.Parallel()
	const name = "ends-after-try"
	class, _, _ := sqllock.SemaphoreSlots(name, 1)[0].Pair()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		observer := pgtest.Open(t, "pgx", dsn)
		held, err := sqllock.New(db).Semaphore(name, 1).Acquire(bg())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg())
		defer cancel()
		restore := sqllock.SetAfterSlotTry(func(c int32) {
			if c == class {
				cancel()
			}
		})
		defer restore()
		lk, err := sqllock.New(db).Semaphore(name, 1).Acquire(ctx)
		if lk != nil || !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire whose ctx ended after its try = %v, %v; want an error matching ErrNotAcquired and context.Canceled", lk, err)
		}
		if pids := holders(t, observer, held.Key()); len(pids) != 1 || pids[0] != held.PID() {
			t.Fatalf("the held slot %v is held by %v, want only %d", held.Key(), pids, held.PID())
		}
		if err := held.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		waitFree(t, observer, held.Key(), 10*time.Second)
	})
}

// TestSemaphoreCancelRace: Acquire calls with random short deadlines race
// the grant of their wait. Every Lock returned is held in the server on its
// own backend, and never more than N are held at once; a call that was not
// granted leaves nothing held.
func TestSemaphoreCancelRace(t *testing.T) {
	t.Parallel()
	calls := 10000
	if testkit.Short() {
		calls = 400
	}
	const n, workers = 2, 8
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		db.SetMaxOpenConns(workers + 4)
		l := sqllock.New(db, sqllock.WithKeepAlive(0))
		sem := l.Semaphore("race", n)
		observer := pgtest.Open(t, "pgx", dsn)
		slots := sqllock.SemaphoreSlots("race", n)
		// Deadlines span a few uncontended calls, as this machine runs them
		// now: some calls win, some lose, many race.
		began := time.Now()
		for range 20 {
			p, err := sem.Acquire(bg())
			if err != nil {
				t.Fatal(err)
			}
			p.Unlock(bg())
		}
		var span atomic.Int64 // adapted below, so that both outcomes stay common
		span.Store(int64(max(5*time.Millisecond, 8*time.Since(began)/20)))
		var mu sync.Mutex
		holding := 0
		var acquired, refused, bad int64
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range calls / workers {
					d := time.Duration((i*7919+w*104729)%1000) * time.Duration(span.Load()) / 1000
					ctx, cancel := context.WithTimeout(bg(), d)
					lk, err := sem.Acquire(ctx)
					cancel()
					if err != nil {
						if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
							t.Errorf("Acquire = %v", err)
						}
						mu.Lock()
						refused++
						adapt(&span, acquired, refused)
						mu.Unlock()
						continue
					}
					mu.Lock()
					holding++
					acquired++
					adapt(&span, acquired, refused)
					if holding > n {
						bad++
					}
					mu.Unlock()
					if pids := holders(t, observer, lk.Key()); len(pids) != 1 || pids[0] != lk.PID() {
						mu.Lock()
						bad++
						mu.Unlock()
						t.Errorf("a returned permit on %v (backend %d) is held by %v in the server", lk.Key(), lk.PID(), pids)
					}
					mu.Lock()
					holding--
					mu.Unlock()
					if err := lk.Unlock(bg()); err != nil {
						t.Errorf("Unlock = %v", err)
					}
				}
			}()
		}
		waitGroup(t, &wg, hangCeiling)
		for _, k := range slots {
			waitFree(t, observer, k, 10*time.Second)
		}
		t.Logf("%d calls: %d acquired, %d not (deadline), %d violations, %d connections discarded",
			calls, acquired, refused, bad, l.Stats().Discarded)
		if bad != 0 {
			t.Fatalf("%d violations", bad)
		}
		if acquired < int64(calls)/20 || refused < int64(calls)/20 {
			t.Fatalf("the race was not exercised: %d acquired, %d refused", acquired, refused)
		}
	})
}

// waitSemaphoreWaiter waits until a session waits for one of the slots of
// the semaphore name of n slots.
func waitSemaphoreWaiter(t *testing.T, db *sql.DB, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		locks, err := sqllock.Inspect(bg(), db, nil, sqllock.SemaphoreSlots(name, n)...)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range locks {
			if !l.Granted {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session waits for semaphore %q after 10 s", name)
		}
		time.Sleep(time.Millisecond)
	}
}

// adapt lengthens the deadlines' span while most calls miss them, and
// shortens it while few do.
func adapt(span *atomic.Int64, acquired, refused int64) {
	if (acquired+refused)%50 != 0 {
		return
	}
	switch total := acquired + refused; {
	case acquired < total/4:
		span.Store(span.Load() * 2)
	case refused < total/4:
		span.Store(max(span.Load()/2, int64(time.Millisecond)))
	}
}
