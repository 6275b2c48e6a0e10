package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// TestCICWithWaitersOfProcesses: a holder's CREATE INDEX CONCURRENTLY, run
// from another connection of the holder's pool (where the server sees no
// deadlock: a wait that held a snapshot for long would hang it for good),
// completes every time while waiters of three other processes (ten in
// all, queued in their Lockers, their heads waiting in the server) wait
// for the holder's key: 20 trials at deadlock_timeout 1 s and 100 ms.
func TestCICWithWaitersOfProcesses(t *testing.T) {
	long(t)
	t.Parallel()
	srv := pgtest.Start(t)
	trials := 20
	for _, dt := range []time.Duration{time.Second, 100 * time.Millisecond} {
		for _, drv := range drivers {
			t.Run(fmt.Sprintf("deadlock_timeout=%v/%s", dt, drv), func(t *testing.T) {
				t.Parallel()
				dsn := srv.NewDatabase(t)
				setDeadlockTimeout(t, srv, dsn, dt)
				db := pgtest.Open(t, drv, dsn)
				if _, err := db.Exec("CREATE TABLE items AS SELECT g AS id, md5(g::text) AS name FROM generate_series(1, 2000) g"); err != nil {
					t.Fatal(err)
				}
				l := sqllock.New(db)
				k := sqllock.Int64(3900)
				dir := t.TempDir()
				// Three processes of waiters (4, 3 and 3 goroutines), which
				// take and release the key for as long as the stop file is
				// missing.
				var procs []*exec.Cmd
				for _, n := range []int{4, 3, 3} {
					cmd := exec.Command(os.Args[0], "-test.run=^$")
					cmd.Env = append(os.Environ(), helperEnv+"=cic-waiters", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn,
						"HELPER_DIR="+dir, "HELPER_KEY="+strconv.Itoa(3900), "HELPER_N="+strconv.Itoa(n))
					cmd.Stderr = os.Stderr
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					procs = append(procs, cmd)
				}
				stopped := false
				stop := func() {
					if stopped {
						return
					}
					stopped = true
					os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
					for _, cmd := range procs {
						if err := waitHelper(cmd, helperCeiling); err != nil {
							t.Errorf("a waiter process: %v", err)
						}
					}
				}
				defer stop()
				var worst time.Duration
				for trial := range trials {
					h, err := l.Lock(bg(), k)
					if err != nil {
						t.Fatal(err)
					}
					testkit.WaitWaiters(t, db, k, 3) // each process's first caller waits in the server
					time.Sleep(dt)                   // the waiters' slices are under way
					ctx, cancel := context.WithTimeout(bg(), 30*time.Second)
					began := time.Now()
					_, err = db.ExecContext(ctx, fmt.Sprintf("CREATE INDEX CONCURRENTLY items_%d ON items (name)", trial))
					took := time.Since(began)
					cancel()
					worst = max(worst, took)
					if err != nil {
						t.Errorf("trial %d: CREATE INDEX CONCURRENTLY after %v: %v", trial, took.Round(time.Millisecond), err)
					}
					if err := h.Unlock(bg()); err != nil {
						t.Fatal(err)
					}
				}
				stop()
				t.Logf("%d trials at deadlock_timeout %v: the index builds took at most %v", trials, dt, worst.Round(time.Millisecond))
				if limit := 3*dt + 5*time.Second; worst > limit {
					t.Errorf("an index build took %v, want at most %v: the waiters held it up", worst, limit)
				}
			})
		}
	}
}

// helperCICWaiters runs HELPER_N goroutines that take and release
// HELPER_KEY, each holding it 5 ms, until HELPER_DIR/stop exists.
func helperCICWaiters(db *sql.DB) int {
	k, err := strconv.ParseInt(os.Getenv("HELPER_KEY"), 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	n, _ := strconv.Atoi(os.Getenv("HELPER_N"))
	stopFile := filepath.Join(os.Getenv("HELPER_DIR"), "stop")
	l := sqllock.New(db)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			if _, err := os.Stat(stopFile); err == nil {
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	code := 0
	var mu sync.Mutex
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				lk, err := l.Lock(ctx, sqllock.Int64(k))
				if err != nil {
					if ctx.Err() == nil {
						fmt.Fprintln(os.Stderr, "waiter:", err)
						mu.Lock()
						code = 2
						mu.Unlock()
					}
					return
				}
				time.Sleep(5 * time.Millisecond)
				if err := lk.Unlock(context.Background()); err != nil {
					fmt.Fprintln(os.Stderr, "waiter unlock:", err)
					mu.Lock()
					code = 2
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return code
}
