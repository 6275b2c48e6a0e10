package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// exitRows are the statuses of docs/cli.md's exit-status table, each with
// the test cases below that prove it. TestExitTableIsProven keeps the two
// in step.
var exitRows = map[string][]string{
	"COMMAND's":         {"command status"},
	"conflict code (1)": {"held elsewhere -n", "held elsewhere -w", "conflict code -E"},
	"64":                {"bad flag", "flag after KEY", "negative timeout", "negative keep-alive", "empty key name", "holder told too late", "keep-alive too long", "hold window too long", "bound not positive", "bound shorter than window"},
	"69":                {"unreachable"},
	"70":                {"standby"},
	"75":                {"lost while running", "lost before the command ended"},
	"77":                {"authentication failed"},
	"124":               {"ran past its bound"},
	"78":                {"bad DSN"},
	"126, 127":          {"not executable", "not found"},
	"128+N":             {"command killed by a signal", "interrupted while waiting", "interrupted while connecting"},
}

// TestExitTableIsProven: every row of docs/cli.md's exit-status table has
// cases in TestExitStatuses, and every case exists.
func TestExitTableIsProven(t *testing.T) {
	b, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "### Exit status")
	if !ok {
		t.Fatal("docs/cli.md has no exit-status table")
	}
	row := regexp.MustCompile(`(?m)^\| ([^|]+?) \| `)
	var rows []string
	for _, m := range row.FindAllStringSubmatch(strings.SplitN(table, "\n\n", 3)[1], -1) {
		if r := strings.Trim(m[1], "` "); r != "status" && !strings.HasPrefix(r, "---") {
			rows = append(rows, r)
		}
	}
	if len(rows) != len(exitRows) {
		t.Errorf("docs/cli.md lists %d statuses %q; the tests cover %d", len(rows), rows, len(exitRows))
	}
	cases := map[string]bool{"interrupted while waiting": true, "interrupted while connecting": true} // TestExitStatuses's own subtests
	for _, c := range exitCases(t, pgtest.Start(t).DSN()) {
		cases[c.name] = true
	}
	for _, r := range rows {
		names, ok := exitRows[r]
		if !ok {
			t.Errorf("status %q of docs/cli.md has no test", r)
		}
		for _, n := range names {
			if !cases[n] {
				t.Errorf("status %q: no case %q in TestExitStatuses", r, n)
			}
		}
	}
}

// exitCase is one run of the CLI and the status it must end with.
type exitCase struct {
	name  string
	dsn   string
	args  []string
	code  int
	want  string                      // in stderr
	setup func(t *testing.T) []string // optional: returns args, overriding args
}

// silentServer accepts TCP connections and never answers: a server that
// hangs.
func silentServer(t *testing.T) string {
	addr, _ := silentServerAccepting(t)
	return addr
}

// silentServerAccepting is silentServer, with a channel that receives once
// per connection it accepted.
func silentServerAccepting(t *testing.T) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn // guarded by mu
	accepted := make(chan struct{}, 100)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	return ln.Addr().String(), accepted
}

// exitCases are the cases of TestExitStatuses, run against dsn's database
// (where the test holds the lock "held").
func exitCases(t *testing.T, dsn string) []exitCase {
	srv := pgtest.Start(t)
	u, _ := url.Parse(dsn)
	u.User = url.User("nosuchrole")
	noRole := u.String()
	return []exitCase{
		{name: "command status", dsn: dsn, args: []string{"run", "k1", "--", "sh", "-c", "exit 7"}, code: 7},
		{name: "held elsewhere -n", dsn: dsn, args: []string{"run", "-n", "held", "--", "true"}, code: 1, want: "held elsewhere (by pid "},
		{name: "held elsewhere -w", dsn: dsn, args: []string{"run", "-w", "1s", "held", "--", "true"}, code: 1, want: "still held elsewhere after 1s"},
		{name: "conflict code -E", dsn: dsn, args: []string{"run", "-n", "-E", "9", "held", "--", "true"}, code: 9},
		{name: "bad flag", dsn: dsn, args: []string{"run", "--bogus", "k", "--", "true"}, code: exitUsage, want: "flag provided but not defined"},
		{name: "flag after KEY", dsn: dsn, args: []string{"run", "k", "-n", "--", "true"}, code: exitUsage, want: "flags go before KEY"},
		{name: "negative timeout", dsn: dsn, args: []string{"run", "-w", "-5s", "k", "--", "true"}, code: exitUsage, want: "must not be negative"},
		{name: "negative keep-alive", dsn: dsn, args: []string{"run", "--keep-alive", "-1s", "k", "--", "true"}, code: exitUsage, want: "must not be negative"},
		{name: "empty key name", dsn: dsn, args: []string{"key", ""}, code: exitUsage, want: "empty NAME"},
		{name: "keep-alive too long", dsn: dsn, args: []string{"run", "--keep-alive", "2h", "--orphan-bound", "0", "k", "--", "true"}, code: exitUsage, want: "at most 1h"},
		{name: "hold window too long", dsn: dsn, args: []string{"run", "--hold-at-least", "169h", "k", "--", "true"}, code: exitUsage, want: "from 0 to 168h"},
		{name: "bound not positive", dsn: dsn, args: []string{"run", "--hold-at-most", "0s", "k", "--", "true"}, code: exitUsage, want: "--hold-at-most must be positive"},
		{name: "bound shorter than window", dsn: dsn, args: []string{"run", "--hold-at-least", "2s", "--hold-at-most", "1s", "k", "--", "true"}, code: exitUsage, want: "shorter than --hold-at-least"},
		{name: "ran past its bound", dsn: dsn, args: []string{"run", "--hold-at-most", "200ms", "kb", "--", "sleep", "10"}, code: exitBound, want: "ran past --hold-at-most 200ms"},
		{name: "holder told too late", dsn: dsn, args: []string{"run", "--keep-alive", "1h", "--orphan-bound", "30s", "k", "--", "true"}, code: exitUsage, want: "the holder must be told first"},
		{name: "unreachable", dsn: "postgres://u:s3cret@127.0.0.1:1/db", args: []string{"run", "k", "--", "true"}, code: exitUnavailable, want: "cannot reach PostgreSQL at 127.0.0.1:1"},
		{name: "standby", args: []string{"run", "-n", "k", "--", "true"}, code: exitSoftware, want: "standby", setup: func(t *testing.T) []string {
			if !srv.Local() {
				pgtest.Unavailable(t, "a local cluster (for a standby)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
			}
			standby := pgtest.StartStandby(t, srv)
			return []string{"run", "--dsn", standby.DSN(), "-n", "k", "--", "true"}
		}},
		{name: "lost while running", dsn: dsn, code: exitLost, want: "was lost while", setup: func(t *testing.T) []string {
			return []string{"run", "--keep-alive", "100ms", "--on-lost", "2s", "lost1", "--", "sh", "-c",
				terminateOwnSession(srv, "lost1") + "; sleep 30"}
		}},
		{name: "lost before the command ended", dsn: dsn, code: exitLost, want: "was lost before", setup: func(t *testing.T) []string {
			// No keep-alive to notice: the unlock does.
			return []string{"run", "--keep-alive", "0", "lost2", "--", "sh", "-c", terminateOwnSession(srv, "lost2") + "; exit 0"}
		}},
		{name: "authentication failed", dsn: noRole, args: []string{"run", "k", "--", "true"}, code: exitNoPerm, want: "authentication failed"},
		{name: "bad DSN", dsn: "postgres://u:s3cret@127.0.0.1:notaport/db", args: []string{"run", "k", "--", "true"}, code: exitConfig, want: "bad DSN postgres://u:xxxxx@"},
		{name: "not executable", dsn: dsn, code: exitCannotRun, want: "cannot run", setup: func(t *testing.T) []string {
			f := filepath.Join(t.TempDir(), "script")
			if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			return []string{"run", "k2", "--", f}
		}},
		{name: "not found", dsn: dsn, args: []string{"run", "k", "--", "/nonexistent/cmd"}, code: exitNotFound, want: "cannot run /nonexistent/cmd"},
		{name: "command killed by a signal", dsn: dsn, args: []string{"run", "k3", "--", "sh", "-c", "kill -KILL $$"}, code: 128 + 9},
	}
}

// terminateOwnSession is a shell command that ends the session holding the
// lock named name, from psql as the superuser, and waits until it is gone.
func terminateOwnSession(srv *pgtest.Server, name string) string {
	q := fmt.Sprintf("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'sqllock run: %s'", name)
	return fmt.Sprintf("%s -X -q -d %q -c %q >/dev/null", filepath.Join(srv.BinDir(), "psql"), srv.AdminDSN(), q)
}

func TestExitStatuses(t *testing.T) {
	dsn, db := database(t)
	l := sqllock.New(db, sqllock.WithApplicationName("exit-status-test"))
	held, err := l.Lock(context.Background(), sqllock.Hash("held"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(context.Background())
	for _, tc := range exitCases(t, dsn) {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.setup != nil {
				args = tc.setup(t)
			}
			r := runCLI(t, tc.dsn, args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("%v: exit %d, stderr %q; want %d and %q", args, r.code, r.stderr, tc.code, tc.want)
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Fatalf("the password leaked into stderr: %q", r.stderr)
			}
		})
	}
	// The interrupted rows need a signal at the right moment.
	t.Run("interrupted while waiting", func(t *testing.T) {
		assertInterrupted(t, dsn, []string{"run", "held", "--", "true"}, func() {
			testkit.WaitWaiters(t, db, sqllock.Hash("held"), 1)
		})
	})
	t.Run("interrupted while connecting", func(t *testing.T) {
		addr, accepted := silentServerAccepting(t)
		assertInterrupted(t, "postgres://u@"+addr+"/db", []string{"run", "k", "--", "true"}, func() {
			select { // run is connecting
			case <-accepted:
			case <-time.After(10 * time.Second):
				t.Fatal("run never connected to the silent server")
			}
		})
	})
}

// assertInterrupted starts sqllock with args, calls ready, sends SIGTERM,
// and wants exit 128+15 well before what it waits for could end (the lock
// stays held; the connect timeout is 15 s): 10 s, for a loaded machine.
func assertInterrupted(t *testing.T, dsn string, args []string, ready func()) {
	t.Helper()
	cmd := sqllockCmd(dsn, args...)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready()
	start := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	t.Logf("exit %d %v after SIGTERM: %s", code, time.Since(start), strings.TrimSpace(errb.String()))
	if code != 128+int(syscall.SIGTERM) || time.Since(start) > 10*time.Second {
		t.Fatalf("exit %d (%v) after %v, want %d at once; stderr %q", code, err, time.Since(start), 128+int(syscall.SIGTERM), errb.String())
	}
}

// TestConnectTimeout: a server that never answers is given up on after
// --connect-timeout (exit 69), or after -w (the conflict code).
func TestConnectTimeout(t *testing.T) {
	dsn := "postgres://u@" + silentServer(t) + "/db"
	r := runCLI(t, dsn, "run", "--connect-timeout", "300ms", "k", "--", "true")
	if r.code != exitUnavailable || !strings.Contains(r.stderr, "no answer within --connect-timeout 300ms") || r.elapsed > 3*time.Second {
		t.Fatalf("--connect-timeout: exit %d after %v, stderr %q", r.code, r.elapsed, r.stderr)
	}
	r = runCLI(t, dsn, "run", "-w", "300ms", "k", "--", "true")
	if r.code != 1 || r.elapsed > 3*time.Second {
		t.Fatalf("-w: exit %d after %v, stderr %q; want 1 within -w", r.code, r.elapsed, r.stderr)
	}
}

// TestRunChildDiesWithRun: kill -9 of sqllock run stops COMMAND too, so it
// never runs without the lock, and the next run gets the lock.
func TestRunChildDiesWithRun(t *testing.T) {
	long(t)
	dsn, db := database(t)
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	cmd := sqllockCmd(dsn, "run", "-n", "orphan", "--", "sh", "-c", fmt.Sprintf("echo $$ > %s.tmp; mv %s.tmp %s; exec sleep 30", pidFile, pidFile, pidFile))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, pidFile)
	b, _ := os.ReadFile(pidFile)
	child, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd.Process.Kill()
	cmd.Wait()
	for alive(child) {
		if time.Since(start) > 5*time.Second {
			syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("COMMAND (pid %d) still runs %v after sqllock run was killed", child, time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("COMMAND ended %v after sqllock run was killed", time.Since(start))
	waitNoLocks(t, db)
	if r := runCLI(t, dsn, "run", "-n", "orphan", "--", "true"); r.code != 0 {
		t.Fatalf("next run: exit %d, %s", r.code, r.stderr)
	}
}

// TestRunKeyForms: negative keys after the flags, a key name longer than
// application_name allows.
func TestRunKeyForms(t *testing.T) {
	long(t)
	dsn, db := database(t)
	for _, tc := range []struct {
		arg string
		k   sqllock.Key
	}{
		{"-5", sqllock.Int64(-5)},
		{"-1,2", sqllock.Pair(-1, 2)},
		{strings.Repeat("n", 10000), sqllock.Hash(strings.Repeat("n", 10000))},
	} {
		ready := filepath.Join(t.TempDir(), "ready")
		cmd := sqllockCmd(dsn, "run", "-n", "-E", "3", tc.arg, "--", "sh", "-c", "touch "+ready+"; sleep 0.5")
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFile(t, ready)
		if got := holders(t, db, tc.k); len(got) != 1 {
			t.Errorf("key %.20q: holders of %v = %v", tc.arg, tc.k, got)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("key %.20q: %v %s", tc.arg, err, errb.String())
		}
	}
	waitNoLocks(t, db)
}

// TestInspectIsTerminalSafe: control characters from the server (query
// text, application names) are escaped in the table, and --watch clears
// the screen only on a terminal.
func TestInspectIsTerminalSafe(t *testing.T) {
	dsn, db := database(t)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const evil = "\033]0;PWNED\007\033[2J\u009b31m"
	if _, err := conn.ExecContext(context.Background(), "SET application_name = 'app\033[2J'"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "SELECT pg_advisory_lock(77) /* "+evil+" é */"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock_all()")
	r := runCLI(t, dsn, "inspect")
	if r.code != 0 {
		t.Fatalf("inspect: exit %d, %s", r.code, r.stderr)
	}
	for _, bad := range []string{"\033", "\007", "\u009b"} {
		if strings.Contains(r.stdout, bad) {
			t.Fatalf("inspect printed the raw control character %q: %q", bad, r.stdout)
		}
	}
	if !strings.Contains(r.stdout, `\x1b]0;PWNED\x07`) {
		t.Fatalf("inspect did not show the escaped text: %q", r.stdout)
	}
	// --watch into a pipe: no screen-clearing codes.
	cmd := sqllockCmd(dsn, "inspect", "--watch", "100ms")
	var out lockedBuffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); strings.Count(out.String(), "every 100ms") < 2 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // two listings (a loaded machine is slow to start)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if n := strings.Count(out.String(), "every 100ms"); n < 2 || strings.Contains(out.String(), "\033[") {
		t.Fatalf("--watch into a pipe: %d listings, screen codes %v: %q", n, strings.Contains(out.String(), "\033["), out.String())
	}
}

func TestShortAndPrintable(t *testing.T) {
	s := short(strings.Repeat("é", 100), 60)
	if !utf8Valid(s) || len([]rune(s)) != 60 {
		t.Fatalf("short cut %q (%d runes)", s, len([]rune(s)))
	}
	if got := printable("a\tb\x1bc\x7f\u0085\xff"); got != `a\x09b\x1bc\x7f\u0085\xff` {
		t.Fatalf("printable = %q", got)
	}
	if got := printable("job\u202etxt.exe\u2066"); got != `job\u202etxt.exe\u2066` {
		t.Fatalf("printable of bidi controls = %q, want them escaped", got)
	}
	if got := clip(strings.Repeat("ü", 40), maxAppName); len(got) > maxAppName || !utf8Valid(got) {
		t.Fatalf("clip = %q (%d bytes)", got, len(got))
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\ufffd") == s }

// TestRegistryFileWhitespace: a tab separates NAME from KEY like a space.
func TestRegistryFileWhitespace(t *testing.T) {
	f := filepath.Join(t.TempDir(), "reg")
	if err := os.WriteFile(f, []byte("cron:a\t42\ncron:b  (1, 2)\ncron:c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reg, err := loadRegistry(f)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]sqllock.Key{"cron:a": sqllock.Int64(42), "cron:b": sqllock.Pair(1, 2), "cron:c": sqllock.Hash("cron:c")}
	got := map[string]sqllock.Key{}
	for name, k := range reg.All() {
		got[name] = k
	}
	if !maps.Equal(got, want) {
		t.Errorf("registry = %v, want %v", got, want)
	}
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: trust kill(0)
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// TestRunWaitsThroughConcurrentIndexBuild: `sqllock run` waiting for a
// lock whose holder runs CREATE INDEX CONCURRENTLY neither fails nor makes
// the build fail.
func TestRunWaitsThroughConcurrentIndexBuild(t *testing.T) {
	srv := pgtest.Start(t)
	dsn, db := database(t)
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(fmt.Sprintf("ALTER DATABASE %q SET deadlock_timeout = '100ms'", pgtest.DatabaseOf(dsn))); err != nil {
		t.Fatal(err)
	}
	holderDB := pgtest.Open(t, "pgx", dsn)
	if _, err := holderDB.Exec("CREATE TABLE items AS SELECT g AS id FROM generate_series(1, 10000) g"); err != nil {
		t.Fatal(err)
	}
	// The holder runs the index build in the session that holds the lock.
	hs, err := sqllock.New(holderDB).Session(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := hs.Lock(context.Background(), sqllock.Hash("migrate")); err != nil {
		t.Fatal(err)
	}
	cmd := sqllockCmd(dsn, "run", "migrate", "--", "true")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitWaiters(t, db, sqllock.Hash("migrate"), 1)
	time.Sleep(300 * time.Millisecond) // past the waiter's own deadlock check
	if _, err := hs.Conn().ExecContext(context.Background(), "CREATE INDEX CONCURRENTLY items_id ON items (id)"); err != nil {
		t.Fatalf("CREATE INDEX CONCURRENTLY while sqllock run waits: %v", err)
	}
	if err := hs.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("sqllock run: %v %s", err, errb.String())
	}
}

// TestRunHoldAtLeast: with --hold-at-least, run keeps the lock after a
// short COMMAND until the window ends, so a second run in the window backs
// out; then it exits with COMMAND's status, no earlier than the window.
//
// The window ends no earlier than the first run's start plus the window:
// a second run that returned before then ran inside it. On a loaded
// machine starting two processes can take longer than a window; then the
// trial says nothing, and runs again with a window twice as long.
func TestRunHoldAtLeast(t *testing.T) {
	dsn, db := database(t)
	dir := t.TempDir()
	for window := 2 * time.Second; ; window *= 2 {
		if window > 32*time.Second {
			t.Fatal("no second run returned inside a window of up to 32s")
		}
		key := fmt.Sprintf("tick %v", window)
		ended := filepath.Join(dir, key)
		start := time.Now()
		first := sqllockCmd(dsn, "run", "-n", "--hold-at-least", window.String(), key, "--", "sh", "-c", `touch "$0"; exit 3`, ended)
		if err := first.Start(); err != nil {
			t.Fatal(err)
		}
		// COMMAND has ended, and so has the first run's lock (taken before).
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(ended); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("COMMAND did not run within a minute")
			}
		}
		if len(holders(t, db, sqllock.Hash(key))) != 1 {
			t.Fatal("COMMAND ended, and no one holds the key")
		}
		second := runCLI(t, dsn, "run", "-n", key, "--", "true")
		inside := time.Since(start) < window
		first.Wait()
		code, took := first.ProcessState.ExitCode(), time.Since(start)
		t.Logf("window %v: a second run returned %d after %v (inside: %v); the first exited %d after %v",
			window, second.code, second.elapsed, inside, code, took)
		if code != 3 || took < window {
			t.Fatalf("run with a window of %v: exit %d after %v; want 3, after the window", window, code, took)
		}
		if second.code != 1 && second.code != 0 {
			t.Fatalf("a second run: exit %d, %s", second.code, second.stderr)
		}
		if !inside {
			continue
		}
		if second.code != 1 {
			t.Fatalf("a run inside the window: exit %d, %s; want 1", second.code, second.stderr)
		}
		if r := runCLI(t, dsn, "run", "-n", key, "--", "true"); r.code != 0 {
			t.Fatalf("a run after the window: exit %d, %s", r.code, r.stderr)
		}
		return
	}
}

// TestRunSlots: with --slots 2, two of three runs at once go ahead and the
// third backs out (-n), or waits its turn.
func TestRunSlots(t *testing.T) {
	dsn, _ := database(t)
	dir := t.TempDir()
	var wg sync.WaitGroup
	codes := make([]int, 3)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = runCLI(t, dsn, "run", "-n", "--slots", "2", "reports", "--", "sh", "-c",
				fmt.Sprintf("touch %s/ran-%d; sleep 1", dir, i)).code
		}()
	}
	wg.Wait()
	ran, backedOut := 0, 0
	for _, c := range codes {
		switch c {
		case 0:
			ran++
		case 1:
			backedOut++
		}
	}
	if ran != 2 || backedOut != 1 {
		t.Fatalf("exit codes %v: want two runs and one backing out", codes)
	}
	// Without -n the third waits for a slot.
	start := time.Now()
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = runCLI(t, dsn, "run", "--slots", "2", "reports", "--", "sleep", "0.5").code
		}()
	}
	wg.Wait()
	if codes[0]+codes[1]+codes[2] != 0 || time.Since(start) < time.Second {
		t.Fatalf("waiting runs: exit codes %v after %v; want all 0 after at least two rounds of 0.5s", codes, time.Since(start))
	}
}

// TestInspectSemaphore: with the semaphore in the registry file, inspect
// shows its slots as one row.
func TestInspectSemaphore(t *testing.T) {
	dsn, db := database(t)
	sem := sqllock.New(db).Semaphore("reports", 3)
	for i := 0; i < 2; i++ {
		p, err := sem.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer p.Unlock(context.Background())
	}
	reg := filepath.Join(t.TempDir(), "registry")
	if err := os.WriteFile(reg, []byte("reports slots=3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, dsn, "inspect", "--registry", reg)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.Contains(lines[1], "reports") || !strings.Contains(lines[1], "2 held") {
		t.Fatalf("inspect: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("\n%s", r.stdout)
	j := runCLI(t, dsn, "inspect", "--json", "--registry", reg)
	if strings.Count(j.stdout, `"semaphore": "reports"`) != 2 {
		t.Fatalf("inspect --json: %s", j.stdout)
	}
}

// TestRunHoldWindowSignalsAndLoss: each row of the hold window's
// behaviour. A signal while COMMAND runs stops COMMAND and run exits at
// once with COMMAND's status (no window); a signal during the window
// releases the lock and exits 128+N; a loss during the window, after
// COMMAND ended, ends the window with a warning and COMMAND's status.
func TestRunHoldWindowSignalsAndLoss(t *testing.T) {
	srv := pgtest.Start(t)
	dsn, db := database(t)
	k := sqllock.Hash("window")
	waitHeld := func() int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			for _, h := range holders(t, db, k) {
				if h.Granted {
					return h.PID
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("run never took the lock")
		return 0
	}
	start := func(command string) (*exec.Cmd, *bytes.Buffer) {
		t.Helper()
		var errb bytes.Buffer
		cmd := sqllockCmd(dsn, "run", "--hold-at-least", "30s", "--keep-alive", "200ms", "window", "--", "sh", "-c", command)
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &errb
	}
	// SIGTERM while COMMAND runs.
	dir := t.TempDir()
	cmd, _ := start("touch " + dir + "/running; sleep 30")
	waitHeld()
	waitFile(t, dir+"/running")
	began := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if code, took := cmd.ProcessState.ExitCode(), time.Since(began); code != 143 || took > 5*time.Second {
		t.Fatalf("SIGTERM during COMMAND: exit %d after %v; want 143 at once (no window)", code, took)
	}
	waitNoLocks(t, db)
	// SIGTERM during the window.
	cmd, _ = start("exit 0")
	waitHeld()
	time.Sleep(300 * time.Millisecond) // COMMAND has ended; the window is open
	began = time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if code, took := cmd.ProcessState.ExitCode(), time.Since(began); code != 143 || took > 5*time.Second {
		t.Fatalf("SIGTERM during the window: exit %d after %v; want 143 at once", code, took)
	}
	waitNoLocks(t, db)
	// A loss during the window, after COMMAND ended.
	cmd, errb := start("exit 0")
	pid := waitHeld()
	time.Sleep(300 * time.Millisecond)
	admin := pgtest.Open(t, "pgx", srv.AdminDSN())
	if _, err := admin.Exec("SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(errb.String(), "during the hold window") || strings.Contains(errb.String(), "before sh ended") {
		t.Fatalf("loss during the window: exit %d, stderr %q; want 0 and a warning about the window", code, errb.String())
	}
}

// TestHoldAtLeastLimitIsLibrarys: --hold-at-least's maximum is the
// longest window Lock.UnlockAfter takes.
func TestHoldAtLeastLimitIsLibrarys(t *testing.T) {
	_, db := database(t)
	lk, err := sqllock.New(db).Lock(context.Background(), sqllock.Int64(909))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(context.Background())
	if err := lk.UnlockAfter(maxHoldAtLeast + 1); err == nil {
		t.Errorf("UnlockAfter(%v) = nil: the library takes a longer window than --hold-at-least", maxHoldAtLeast+1)
	}
	if err := lk.UnlockAfter(maxHoldAtLeast); err != nil {
		t.Errorf("UnlockAfter(%v) = %v: the library refuses a window --hold-at-least takes", maxHoldAtLeast, err)
	}
}

// TestRunSlotsRefusals: --slots 0 is a usage error, and a run refused by a
// full semaphore names a holder, as a plain run does.
func TestRunSlotsRefusals(t *testing.T) {
	dsn, db := database(t)
	if r := runCLI(t, dsn, "run", "--slots", "0", "jobs", "--", "true"); r.code != exitUsage {
		t.Fatalf("--slots 0: exit %d, %s; want %d", r.code, r.stderr, exitUsage)
	}
	p, err := sqllock.New(db, sqllock.WithApplicationName("slot-holder")).Semaphore("jobs", 1).TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Unlock(context.Background())
	r := runCLI(t, dsn, "run", "-n", "--slots", "1", "jobs", "--", "true")
	if r.code != 1 || !strings.Contains(r.stderr, fmt.Sprintf("by pid %d", p.PID())) {
		t.Fatalf("a refused --slots run: exit %d, %q; want 1 naming pid %d", r.code, r.stderr, p.PID())
	}
}

// lockedBuffer is a bytes.Buffer that a command writes while the test
// reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
