package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
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

// bin is the sqllock binary built for these tests.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sqllock-cli-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "sqllock")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// result is one finished sqllock process.
type result struct {
	code    int
	stdout  string
	stderr  string
	elapsed time.Duration
}

func sqllockCmd(dsn string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
	return cmd
}

func runCLI(t *testing.T, dsn string, args ...string) result {
	t.Helper()
	cmd := sqllockCmd(dsn, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), elapsed: time.Since(start)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return r
}

func database(t *testing.T) (string, *sql.DB) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	return dsn, pgtest.Open(t, "pgx", dsn)
}

func TestRunNonblockExactlyOne(t *testing.T) {
	long(t)
	dsn, db := database(t)
	dir := t.TempDir()
	const n = 5
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runCLI(t, dsn, "run", "-n", "-E", "3", "cron:reindex_posts", "--",
				"sh", "-c", fmt.Sprintf("echo %d >> %s/ran; sleep 1", i, dir))
		}()
	}
	wg.Wait()
	ran, conflicts := 0, 0
	for _, r := range results {
		switch r.code {
		case 0:
			ran++
		case 3:
			conflicts++
			if !strings.Contains(r.stderr, "held elsewhere") {
				t.Errorf("conflict message = %q", r.stderr)
			}
		default:
			t.Errorf("exit %d: %s", r.code, r.stderr)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "ran"))
	if ran != 1 || conflicts != 4 || len(strings.Fields(string(b))) != 1 {
		t.Fatalf("ran %d, conflicts %d, COMMAND ran %q; want 1, 4, once", ran, conflicts, b)
	}
	waitNoLocks(t, db)
}

func TestRunWaitsWithoutOverlap(t *testing.T) {
	long(t)
	dsn, db := database(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := runCLI(t, dsn, "run", "(7,8)", "--", "sh", "-c",
				fmt.Sprintf("echo start $(date +%%s%%N) >> %s; sleep 0.3; echo end $(date +%%s%%N) >> %s", log, log))
			if r.code != 0 {
				t.Errorf("exit %d: %s", r.code, r.stderr)
			}
		}()
	}
	wg.Wait()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	type ev struct {
		at    int64
		start bool
	}
	var evs []ev
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		at, _ := strconv.ParseInt(f[1], 10, 64)
		evs = append(evs, ev{at, f[0] == "start"})
	}
	sort.Slice(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	inside, starts := 0, 0
	for _, e := range evs {
		if e.start {
			inside++
			starts++
		} else {
			inside--
		}
		if inside > 1 {
			t.Fatalf("two runs overlapped: %s", b)
		}
	}
	if starts != 3 {
		t.Fatalf("%d runs, want 3: %s", starts, b)
	}
	waitNoLocks(t, db)
}

func TestRunTimeout(t *testing.T) {
	dsn, db := database(t)
	l := sqllock.New(db)
	lk, err := l.Lock(context.Background(), sqllock.Hash("job"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(context.Background())
	// (-w bounds the connection too: 1 s leaves room for a loaded machine.)
	r := runCLI(t, dsn, "run", "-w", "1s", "-E", "9", "job", "--", "true")
	if r.code != 9 || !strings.Contains(r.stderr, "still held elsewhere after 1s") {
		t.Fatalf("exit %d, stderr %q; want 9 and a timeout message", r.code, r.stderr)
	}
	// The server ends the wait shortly before the deadline (up to 100 ms).
	if r.elapsed < 850*time.Millisecond || r.elapsed > 6*time.Second {
		t.Fatalf("gave up after %v, want about 1s", r.elapsed)
	}
	q := runCLI(t, dsn, "run", "-n", "-q", "job", "--", "true")
	if q.code != 1 || q.stderr != "" {
		t.Fatalf("-n -q: exit %d, stderr %q; want 1 and silence", q.code, q.stderr)
	}
}

func TestRunForwardsSignals(t *testing.T) {
	dsn, db := database(t)
	dir := t.TempDir()
	got := filepath.Join(dir, "got")
	ready := filepath.Join(dir, "ready")
	cmd := sqllockCmd(dsn, "run", "sig", "--", "sh", "-c",
		fmt.Sprintf("trap 'echo TERM > %s; exit 0' TERM; touch %s; while :; do sleep 0.05; done", got, ready))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, ready)
	if len(holders(t, db, sqllock.Hash("sig"))) != 1 {
		t.Fatal("the lock is not held while COMMAND runs")
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("sqllock run after SIGTERM: %v %s", err, errb.String())
	}
	if b, _ := os.ReadFile(got); strings.TrimSpace(string(b)) != "TERM" {
		t.Fatalf("COMMAND did not receive SIGTERM: %q", b)
	}
	waitNoLocks(t, db)
}

func TestRunLostLockStopsCommand(t *testing.T) {
	srv := pgtest.Start(t)
	dsn, db := database(t)
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	cmd := sqllockCmd(dsn, "run", "--keep-alive", "100ms", "--on-lost", "2s", "lost-job", "--", "sh", "-c",
		fmt.Sprintf("touch %s; sleep 30", ready))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, ready)
	locks, err := sqllock.Inspect(context.Background(), db, nil, sqllock.Hash("lost-job"))
	if err != nil || len(locks) != 1 || locks[0].ApplicationName != "sqllock run: lost-job" {
		t.Fatalf("Inspect = %+v, %v", locks, err)
	}
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	start := time.Now()
	if _, err := admin.Exec("SELECT pg_terminate_backend($1)", locks[0].PID); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitLost {
		t.Fatalf("exit = %v, want %d; stderr %s", err, exitLost, errb.String())
	}
	if !strings.Contains(errb.String(), "was lost") || time.Since(start) > 10*time.Second {
		t.Fatalf("stderr %q after %v", errb.String(), time.Since(start))
	}
}

func TestInspect(t *testing.T) {
	dsn, db := database(t)
	ctx := context.Background()
	l := sqllock.New(db)
	big, pair := sqllock.Int64(1<<33+1), sqllock.Pair(-4, 12)
	h1, err := l.Lock(ctx, big)
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Unlock(ctx)
	h2, err := l.RLock(ctx, pair)
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Unlock(ctx)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go sqllock.New(db).Lock(wctx, big) // another Locker's: a caller of l would queue inside l
	deadline := time.Now().Add(10 * time.Second)
	for {
		locks, _ := sqllock.Inspect(ctx, db, nil, big)
		if len(locks) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	reg := filepath.Join(t.TempDir(), "locks.txt")
	os.WriteFile(reg, []byte("# team locks\nbig-job 8589934593\n"), 0o644)
	r := runCLI(t, dsn, "inspect", "--registry", reg)
	if r.code != 0 {
		t.Fatalf("inspect: %d %s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "KEY") {
		t.Fatalf("inspect output:\n%s", r.stdout)
	}
	for i, want := range []string{"8589934593 bigint big-job exclusive held", "8589934593 bigint big-job exclusive waiting", "(-4,12) pair - shared held"} {
		if got := strings.Join(strings.Fields(lines[i+1]), " "); !strings.HasPrefix(got, want) {
			t.Errorf("row %d = %q, want prefix %q", i+1, got, want)
		}
	}
	if !strings.Contains(lines[2], strconv.Itoa(h1.PID())) {
		t.Errorf("waiter row does not name its blocker %d: %q", h1.PID(), lines[2])
	}
	j := runCLI(t, dsn, "inspect", "--json")
	var locks []jsonLock
	if err := json.Unmarshal([]byte(j.stdout), &locks); err != nil || len(locks) != 3 {
		t.Fatalf("inspect --json = %v, %q", err, j.stdout)
	}
	if locks[0].Bigint == nil || *locks[0].Bigint != 1<<33+1 || locks[1].State != "waiting" || locks[1].WaitingSince == nil ||
		len(locks[1].BlockedBy) != 1 || locks[1].BlockedBy[0] != h1.PID() || locks[2].Class == nil || *locks[2].Class != -4 || *locks[2].ID != 12 {
		t.Fatalf("inspect --json decoded %+v", locks)
	}
}

func TestKey(t *testing.T) {
	r := runCLI(t, "", "key", "cron:reindex_posts")
	for _, want := range []string{
		"hash      4387803684103558220",
		"SELECT pg_try_advisory_lock(4387803684103558220);",
		"crc32     3230921880",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("key output lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestKeyDocIsOutput: docs/cli.md shows sqllock key's output whole, as
// the command prints it.
func TestKeyDocIsOutput(t *testing.T) {
	b, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	const prompt = "$ sqllock key "
	_, rest, ok := strings.Cut(string(b), "```\n"+prompt)
	if !ok {
		t.Fatalf("docs/cli.md has no block starting %q", prompt)
	}
	rest, _, _ = strings.Cut(rest, "```")
	name, doc, _ := strings.Cut(rest, "\n")
	var out, errb bytes.Buffer
	if code := run([]string{"key", name}, &out, &errb); code != 0 {
		t.Fatalf("sqllock key %s = %d: %s", name, code, errb.String())
	}
	if out.String() != doc {
		t.Errorf("docs/cli.md shows for sqllock key %s:\n%s\nthe command prints:\n%s", name, doc, out.String())
	}
}

func TestBadInput(t *testing.T) {
	srv := pgtest.Start(t)
	tests := []struct {
		name string
		dsn  string
		args []string
		code int
		want string
	}{
		{"bad DSN", "postgres://u:s3cret@127.0.0.1:notaport/db", []string{"run", "k", "--", "true"}, exitConfig, "bad DSN postgres://u:xxxxx@"},
		{"unreachable", "postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=2", []string{"run", "k", "--", "true"}, exitUnavailable, "cannot reach PostgreSQL at 127.0.0.1:1"},
		{"bad key", srv.DSN(), []string{"run", "(1,2", "--", "true"}, exitUsage, `invalid key "(1,2": unbalanced parentheses`},
		{"key out of range", srv.DSN(), []string{"run", "99999999999999999999", "--", "true"}, exitUsage, "out of range"},
		{"missing command", srv.DSN(), []string{"run", "k", "--"}, exitUsage, "missing COMMAND"},
		{"missing key", srv.DSN(), []string{"run"}, exitUsage, "missing KEY"},
		{"bad flag", srv.DSN(), []string{"run", "--bogus", "k", "--", "true"}, exitUsage, "flag provided but not defined"},
		{"unknown command", srv.DSN(), []string{"frob"}, exitUsage, "unknown command"},
		{"command not found", srv.DSN(), []string{"run", "k", "--", "/nonexistent/cmd"}, exitNotFound, "cannot run /nonexistent/cmd"},
		{"command status", srv.DSN(), []string{"run", "k", "--", "sh", "-c", "exit 7"}, 7, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(t, tt.dsn, tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", r.code, r.stderr, tt.code, tt.want)
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Fatalf("the password leaked into stderr: %q", r.stderr)
			}
		})
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:pw@h/db":                         "postgres://u:xxxxx@h/db",
		"host=h password=pw user=u":                    "host=h password=xxxxx user=u",
		"host=h password='p w' user=u":                 "host=h password=xxxxx user=u",
		"cannot parse `postgres://a:b@h:x/d`: invalid": "cannot parse `postgres://a:xxxxx@h:x/d`: invalid",
		"postgres://u@h/db":                            "postgres://u@h/db",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func holders(t *testing.T, db *sql.DB, k sqllock.Key) []sqllock.HeldLock {
	t.Helper()
	locks, err := sqllock.Inspect(context.Background(), db, nil, k)
	if err != nil {
		t.Fatal(err)
	}
	return locks
}

func waitNoLocks(t *testing.T, db *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		locks, err := sqllock.Inspect(context.Background(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(locks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("locks left: %+v", locks)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunShared: shared holders run together; an exclusive run conflicts.
func TestRunShared(t *testing.T) {
	long(t)
	dsn, db := database(t)
	dir := t.TempDir()
	ready, done := filepath.Join(dir, "ready"), filepath.Join(dir, "done")
	// The holder holds until the checks are done (a fixed sleep is too
	// short on a loaded machine).
	holder := sqllockCmd(dsn, "run", "-s", "report:read", "--", "sh", "-c",
		fmt.Sprintf("touch %s; i=0; while [ ! -e %s ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done", ready, done))
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	waitFile(t, ready)
	if r := runCLI(t, dsn, "run", "-s", "-n", "report:read", "--", "true"); r.code != 0 {
		t.Fatalf("second shared run: exit %d, %s", r.code, r.stderr)
	}
	if r := runCLI(t, dsn, "run", "-n", "-E", "4", "report:read", "--", "true"); r.code != 4 {
		t.Fatalf("exclusive run against a shared holder: exit %d, want 4: %s", r.code, r.stderr)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := holder.Wait(); err != nil {
		t.Fatal(err)
	}
	waitNoLocks(t, db)
}

// TestLibpqEnvironment: without --dsn and DATABASE_URL, the PG* variables
// are used, and application_name names the key.
func TestLibpqEnvironment(t *testing.T) {
	long(t)
	srv := pgtest.Start(t)
	dsn, db := database(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	cmd := exec.Command(bin, "run", "env-job", "--", "sh", "-c", fmt.Sprintf("touch %s; sleep 0.5", ready))
	cmd.Env = append(os.Environ(), "DATABASE_URL=", "PGHOST="+srv.Host, "PGPORT="+strconv.Itoa(srv.Port),
		"PGUSER="+u.User.Username(), "PGPASSWORD="+pw, "PGDATABASE="+pgtest.DatabaseOf(dsn), "PGSSLMODE=disable")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, ready)
	locks := holders(t, db, sqllock.Hash("env-job"))
	if len(locks) != 1 || locks[0].ApplicationName != "sqllock run: env-job" {
		t.Fatalf("holders = %+v", locks)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run with PG* variables: %v %s", err, errb.String())
	}
}

// long skips t under -short (stress, fault and timing-heavy runs), except
// in CI (CI=true), where every test runs.
func long(t testing.TB) {
	t.Helper()
	testkit.Long(t)
}

// TestRunHelp: run -h names each flag once (short and long together), and
// gives the exit codes and examples; inspect -h's placeholders match its
// text.
func TestRunHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"run", "-h"}, &out, &errb); code != 0 && code != exitUsage {
		t.Fatalf("run -h = %d", code)
	}
	help := errb.String()
	for _, want := range []string{"-n, --nonblock", "-w, --timeout DURATION", "-E, --conflict-exit-code INT", "Exit status:", "75 ", "Examples:"} {
		if !strings.Contains(help, want) {
			t.Errorf("run -h lacks %q:\n%s", want, help)
		}
	}
	if n := strings.Count(help, "nonblock"); n != 1 {
		t.Errorf("run -h names --nonblock %d times, want once:\n%s", n, help)
	}
	errb.Reset()
	run([]string{"inspect", "-h"}, &out, &errb)
	for _, want := range []string{"-registry FILE", "-watch INTERVAL", "-stranded D"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("inspect -h lacks %q:\n%s", want, errb.String())
		}
	}
	errb.Reset()
	if code := run([]string{"break", "-h"}, &out, &errb); code != 0 {
		t.Fatalf("break -h = %d", code)
	}
	for _, want := range []string{"--idle-at-least DURATION", "--application NAME", "--yes", "Exit status:", "Examples:"} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("break -h lacks %q:\n%s", want, errb.String())
		}
	}
}

// TestUsageAligned: the usage text's commands start their descriptions
// in one column.
func TestUsageAligned(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--help"}, &out, &errb); code != 0 {
		t.Fatalf("sqllock --help = %d", code)
	}
	cols := map[int][]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(l, "  sqllock ") {
			continue
		}
		gap := strings.Index(l, "   ")
		if gap < 0 {
			t.Fatalf("usage line %q has no description", l)
		}
		desc := len(l) - len(strings.TrimLeft(l[gap:], " "))
		cols[desc] = append(cols[desc], l)
	}
	if len(cols) != 1 {
		t.Errorf("the usage text's descriptions start in %d columns, want one:\n%s", len(cols), out.String())
	}
}

// TestKeyHelp: key -h says what the command does, as run -h and inspect
// -h do.
func TestKeyHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"key", "-h"}, &out, &errb); code != 0 {
		t.Fatalf("key -h = %d", code)
	}
	if !strings.Contains(errb.String(), "usage: sqllock key NAME") || !strings.Contains(errb.String(), "zlib.crc32") {
		t.Errorf("key -h printed %q", errb.String())
	}
}

// TestInspectElection: inspect shows an election's leader, with its value,
// and its waiting candidates.
func TestInspectElection(t *testing.T) {
	dsn, db := database(t)
	e := sqllock.New(db).Election(sqllock.Hash("leader:scheduler"))
	term, err := e.Campaign(context.Background(), "host-a")
	if err != nil {
		t.Fatal(err)
	}
	defer term.Unlock(context.Background())
	r := runCLI(t, dsn, "inspect")
	if r.code != 0 || !strings.Contains(r.stdout, "leader") || !strings.Contains(r.stdout, "sqllock-election:host-a") {
		t.Fatalf("inspect of an election: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
