package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
)

const helperEnv = "SQLLOCK_TEST_HELPER"

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
				out, err := cmd.CombinedOutput()
				if err != nil {
					err = fmt.Errorf("helper process: %w\n%s", err, out)
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

// helperFrozen takes key 77 with the trials' settings, says "locked", waits
// for a line on standard input (the test stops and resumes the process in
// between), then says whether the lock survived and releases it.
func helperFrozen(db *sql.DB) int {
	l := sqllock.New(db, sqllock.WithKeepAlive(trialKeepAlive), sqllock.WithOrphanBound(trialBound))
	lk, err := l.Lock(context.Background(), sqllock.Int64(77))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("locked")
	var line string
	fmt.Scanln(&line)
	time.Sleep(3 * trialKeepAlive) // let the keep-alive run after the pause
	fmt.Printf("after the pause: Err %v, Unlock %v\n", lk.Err(), lk.Unlock(context.Background()))
	return 0
}
