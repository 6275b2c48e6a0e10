package pgtest

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestBouncerCloseTwice: a second Close (StartPgBouncer's cleanup after
// the test's own) returns the first one's result at once instead of
// waiting for a process that was already reaped. A stand-in process plays
// PgBouncer, so the test needs no pgbouncer binary.
func TestBouncerCloseTwice(t *testing.T) {
	dir, err := os.MkdirTemp("", "sqllock-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	b := &Bouncer{dir: dir, cmd: cmd, done: done}
	closed := make(chan error, 2)
	go func() {
		closed <- b.Close()
		closed <- b.Close()
	}()
	var errs []error
	for range 2 {
		select {
		case err := <-closed:
			errs = append(errs, err)
		case <-time.After(15 * time.Second):
			t.Fatalf("Close called twice: still running after 15s (results so far: %v)", errs)
		}
	}
	if errs[0] != nil || errs[1] != errs[0] {
		t.Fatalf("Close, Close = %v, %v; want nil twice", errs[0], errs[1])
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the bouncer's directory is still there: %v", err)
	}
}
