package sqllock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
)

const helperEnv = "SQLLOCK_TEST_HELPER"

// helperCeiling bounds a re-executed helper process: far longer than any
// helper takes on a loaded machine, far shorter than the test binary's
// timeout, so that a helper that hangs fails its test with its stacks
// instead of stopping the whole run at the timeout.
const helperCeiling = 3 * time.Minute

// runHelper starts cmd, a re-executed test binary, and waits for it (see
// waitHelper).
func runHelper(cmd *exec.Cmd, ceiling time.Duration) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	return waitHelper(cmd, ceiling)
}

// waitHelper waits for cmd, a started re-executed test binary, for at most
// ceiling. Then it sends SIGQUIT, on which the Go runtime writes every
// goroutine's stack to the process's standard error (where cmd sends it),
// and kills the process if it is still there a few seconds later; the
// error says so.
func waitHelper(cmd *exec.Cmd, ceiling time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t := time.NewTimer(ceiling)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		<-done
	}
	return fmt.Errorf("helper process %d still running after %v: stopped with SIGQUIT (its goroutines' stacks are in its output)", cmd.Process.Pid, ceiling)
}

// helperMain is the body of a re-executed test binary. It reads its job from
// the environment, and its exit status is the verdict: 0 fine, 1 mutual
// exclusion broken, 2 error.
func helperMain(role string) int {
	db, err := sql.Open(os.Getenv("HELPER_DRIVER"), os.Getenv("HELPER_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	switch role {
	case "mutex":
		return helperMutex(db, os.Getenv("HELPER_DIR"))
	case "frozen":
		return helperFrozen(db)
	case "semaphore":
		return helperSemaphore(db, os.Getenv("HELPER_DIR"))
	case "candidate":
		return helperCandidate(db, os.Getenv("HELPER_DIR"), os.Getenv("HELPER_VALUE"))
	case "remote-waiter":
		return helperRemoteWaiter(db)
	case "cic-waiters":
		return helperCICWaiters(db)
	case "leader":
		return helperLeader(db, os.Getenv("HELPER_VALUE"))
	case "line":
		return helperLine(db)
	case "places":
		return helperPlaces(db)
	case "tx-holder":
		return helperTxHolder(db)
	}
	fmt.Fprintln(os.Stderr, "unknown helper role", role)
	return 2
}

// helperMutex enters the critical section of one key many times from
// several goroutines. Inside, it creates a marker file that must not exist:
// if it does, another process or goroutine is inside too.
func helperMutex(db *sql.DB, dir string) int {
	l := sqllock.New(db)
	marker := filepath.Join(dir, "inside")
	var wg sync.WaitGroup
	var mu sync.Mutex
	code := 0
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				err := l.Do(context.Background(), sqllock.Int64(42), func(context.Context) error {
					f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
					if err != nil {
						return fmt.Errorf("overlap: %w", err)
					}
					f.Close()
					time.Sleep(time.Millisecond)
					log, err := os.OpenFile(filepath.Join(dir, "log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
					if err != nil {
						return err
					}
					fmt.Fprintf(log, "%d\n", os.Getpid())
					log.Close()
					return os.Remove(marker)
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					mu.Lock()
					if strings.Contains(err.Error(), "overlap") {
						code = 1
					} else if code == 0 {
						code = 2
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return code
}

// TestMutualExclusionProcesses runs three separate OS processes (this test
// binary, re-executed), each with four goroutines, against one key.
func TestMutualExclusionProcesses(t *testing.T) {
	long(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		dir := t.TempDir()
		drv := "pgx"
		if strings.HasSuffix(t.Name(), "postgres") {
			drv = "postgres"
		}
		const procs = 3
		errs := make(chan error, procs)
		for p := 0; p < procs; p++ {
			go func() {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=mutex", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn, "HELPER_DIR="+dir)
				var out bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &out
				err := runHelper(cmd, helperCeiling)
				if err != nil {
					err = fmt.Errorf("helper process: %w\n%s", err, out.Bytes())
				}
				errs <- err
			}()
		}
		for p := 0; p < procs; p++ {
			if err := <-errs; err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) && ee.ExitCode() == 1 {
					t.Fatalf("mutual exclusion broken: %v", err)
				}
				t.Fatal(err)
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, "log"))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Fields(string(b))
		pids := map[string]int{}
		for _, l := range lines {
			pids[l]++
		}
		if len(lines) != procs*4*10 || len(pids) != procs {
			t.Fatalf("critical sections: %d by %d processes, want %d by %d", len(lines), len(pids), procs*40, procs)
		}
		if n := advisoryCount(t, db); n != 0 {
			t.Fatalf("%d advisory locks left", n)
		}
	})
}

// helperFrozen takes key 77 with the trials' settings (a session of its
// own with HELPER_DEDICATED set), says "locked TOKEN", and waits for a line
// on stdin (the test stops and resumes the process meanwhile). Then, first
// thing, it asks Err, and writes to the fenced row with its token all the
// same, as a holder that did not look would: it says "resumed: Err ERR,
// wrote N".
func helperFrozen(db *sql.DB) int {
	opts := []sqllock.Option{sqllock.WithKeepAlive(trialKeepAlive), sqllock.WithOrphanBound(trialBound)}
	if os.Getenv("HELPER_DEDICATED") != "" {
		opts = append(opts, sqllock.WithDedicatedSessions())
	}
	l := sqllock.New(db, opts...)
	lk, err := l.Lock(context.Background(), sqllock.Int64(77))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	token, err := lk.Token(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("locked", token)
	var line string
	fmt.Scanln(&line)
	lerr := lk.Err()
	wrote := int64(-1)
	res, err := db.Exec(`UPDATE fenced SET fence = $1, v = v + 1 WHERE id = 1 AND fence <= $1`, token)
	if err == nil {
		wrote, _ = res.RowsAffected()
	}
	fmt.Printf("resumed: Err %v, wrote %d\n", lerr, wrote)
	return 0
}

// helperSemaphore runs 8 goroutines that enter a semaphore of 3 slots over
// and over until HELPER_UNTIL (unix ms), each wait with a random deadline
// (some are cancelled as a slot frees), and checks, inside, that at most 3
// marker files exist in dir across all processes. It prints how many times
// each goroutine got in; exit 1 when the limit was broken or a goroutine
// never got in.
func helperSemaphore(db *sql.DB, dir string) int {
	run, _ := time.ParseDuration(os.Getenv("HELPER_RUN"))
	db.SetMaxIdleConns(8) // one per worker: the default 2 connects anew per call
	sem := sqllock.New(db, sqllock.WithKeepAlive(time.Second)).Semaphore("reports", 3)
	// The run begins once every process is ready (a loaded machine can
	// take most of a short run to start one), and lasts run.
	ready := filepath.Join(dir, "ready")
	os.WriteFile(filepath.Join(ready, strconv.Itoa(os.Getpid())), nil, 0o644)
	for start := time.Now(); ; time.Sleep(5 * time.Millisecond) {
		if files, _ := os.ReadDir(ready); len(files) >= 3 {
			break
		}
		if time.Since(start) > 30*time.Second {
			fmt.Fprintln(os.Stderr, "the other processes never got ready")
			return 2
		}
	}
	// Each worker runs for run, and on until it got in once (with
	// HELPER_EVERY; else until one of the process's did), for at most a
	// minute: a loaded machine can spend a short run setting up
	// connections, each call's deadline ending first.
	every := os.Getenv("HELPER_EVERY") != ""
	var got atomic.Int64
	until := time.Now().Add(run).UnixMilli()
	ceiling := time.Now().Add(run + time.Minute).UnixMilli()
	dir = filepath.Join(dir, "inside")
	var wg sync.WaitGroup
	var mu sync.Mutex
	code := 0
	entries := make([]int, 8)
	for g := range entries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(g)))
			more := func(now int64) bool {
				return now < until || now < ceiling && entries[g] == 0 && (every || got.Load() == 0)
			}
			for now := time.Now().UnixMilli(); more(now); now = time.Now().UnixMilli() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(20+rng.IntN(400))*time.Millisecond)
				p, err := sem.Acquire(ctx)
				cancel()
				if err != nil {
					if !errors.Is(err, sqllock.ErrNotAcquired) {
						fmt.Fprintln(os.Stderr, "acquire:", err)
						mu.Lock()
						code = 2
						mu.Unlock()
					}
					continue
				}
				marker := filepath.Join(dir, fmt.Sprintf("inside-%d-%d", os.Getpid(), g))
				os.WriteFile(marker, nil, 0o644)
				if files, _ := os.ReadDir(dir); len(files) > 3 {
					fmt.Fprintf(os.Stderr, "%d inside at once\n", len(files))
					mu.Lock()
					code = 1
					mu.Unlock()
				}
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				os.Remove(marker)
				if err := p.Unlock(context.Background()); err != nil {
					fmt.Fprintln(os.Stderr, "release:", err)
				}
				entries[g]++
				got.Add(1)
			}
		}()
	}
	wg.Wait()
	fmt.Println(strings.Trim(fmt.Sprint(entries), "[]"))
	return code
}
