package main

import (
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
)

// heldSpan waits for the first holder of k, then returns, by the server's
// clock, how long it held k: from its lock statement's end (the session's
// state_change, as run's session runs nothing after it) to the first poll
// of pg_locks that found the lock gone.
func heldSpan(t *testing.T, db *sql.DB, k sqllock.Key) time.Duration {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var pid int
	for pid == 0 {
		for _, h := range holders(t, db, k) {
			if h.Granted {
				pid = h.PID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no one took %v", k)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var granted time.Time
	if err := db.QueryRow(`SELECT state_change FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&granted); err != nil {
		t.Fatal(err)
	}
	for time.Now().Before(deadline) {
		var now time.Time
		var n int
		if err := db.QueryRow(`SELECT clock_timestamp(), count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1`, pid).Scan(&now, &n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return now.Sub(granted)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("backend %d still holds %v", pid, k)
	return 0
}

// TestRunHoldAtMost: with --hold-at-most D, a COMMAND that runs past D
// gets SIGTERM at D; one that ignores it gets SIGKILL after --on-lost.
// run exits 124 and releases the lock once COMMAND has ended: the server
// shows it held for D (plus the grace, for the COMMAND that ignored
// SIGTERM), and no longer. A COMMAND that ends sooner keeps its status.
func TestRunHoldAtMost(t *testing.T) {
	const bound, grace = time.Second, 2 * time.Second
	dsn, db := database(t)
	for _, c := range []struct {
		name   string
		script string
		// span is what the server should show the lock held for, at least.
		span time.Duration
	}{
		{"heeds SIGTERM", "echo $$ > %s; sleep 30", bound},
		{"ignores SIGTERM", "trap '' TERM; echo $$ > %s; sleep 30", bound + grace},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := sqllock.Hash("bound:" + c.name)
			pidFile := filepath.Join(t.TempDir(), "pid")
			cmd := sqllockCmd(dsn, "run", "--hold-at-most", bound.String(), "--on-lost", grace.String(), "bound:"+c.name, "--",
				"sh", "-c", strings.Replace(c.script, "%s", pidFile, 1))
			var errb strings.Builder
			cmd.Stderr = &errb
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			span := heldSpan(t, db, k)
			cmd.Wait()
			code := cmd.ProcessState.ExitCode()
			t.Logf("server: held %v (bound %v, grace %v); run exited %d: %s", span, bound, grace, code, strings.TrimSpace(errb.String()))
			if code != exitBound || !strings.Contains(errb.String(), "ran past --hold-at-most 1s; it was stopped") {
				t.Errorf("run exited %d, stderr %q; want %d and the bound's message", code, errb.String(), exitBound)
			}
			// Bounds by what they measure: the lock is held until COMMAND
			// has ended (no sooner than the signal that ends it), and the
			// release follows at once: a second of slack for a loaded
			// machine, less than the grace that a run which waited for
			// SIGKILL needlessly would add.
			if span < c.span || span > c.span+time.Second {
				t.Errorf("the server shows the lock held %v, want from %v to %v", span, c.span, c.span+time.Second)
			}
			b, err := os.ReadFile(pidFile)
			if err != nil {
				t.Fatal(err)
			}
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			if pid == 0 || alive(pid) {
				t.Errorf("COMMAND (pid %d) outlived run", pid)
			}
		})
	}
	t.Run("ends sooner", func(t *testing.T) {
		r := runCLI(t, dsn, "run", "--hold-at-most", "10s", "bound:sooner", "--", "sh", "-c", "exit 5")
		if r.code != 5 || r.elapsed > 9*time.Second {
			t.Errorf("run exited %d after %v, stderr %q; want COMMAND's 5 at once", r.code, r.elapsed, r.stderr)
		}
	})
	t.Run("with a window", func(t *testing.T) {
		// The window holds a short COMMAND's lock to its end, under the
		// bound.
		r := runCLI(t, dsn, "run", "--hold-at-least", "500ms", "--hold-at-most", "2s", "bound:window", "--", "true")
		if r.code != 0 || r.elapsed < 500*time.Millisecond {
			t.Errorf("run exited %d after %v, stderr %q; want 0 after the 500ms window", r.code, r.elapsed, r.stderr)
		}
	})
	waitNoLocks(t, db)
}
