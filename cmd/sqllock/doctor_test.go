package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
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

// doctorRuns is how many times each way (and with each DSN mode) the
// pooler finding is checked: 10, or 3 under -short.
func doctorRuns() int {
	if testkit.Short() {
		return 3
	}
	return 10
}

// doctorReport is one run of sqllock doctor --json: its findings by name.
type doctorReport map[string]finding

// runDoctor runs sqllock doctor --json on dsn (DATABASE_URL), wants exit
// 0 and one finding of each name, and returns them.
func runDoctor(t *testing.T, dsn string) doctorReport {
	t.Helper()
	r := runCLI(t, dsn, "doctor", "--json")
	if r.code != 0 {
		t.Fatalf("doctor: exit %d, stderr %q", r.code, r.stderr)
	}
	var fs []finding
	if err := json.Unmarshal([]byte(r.stdout), &fs); err != nil {
		t.Fatalf("doctor --json printed %q: %v", r.stdout, err)
	}
	rep := doctorReport{}
	for _, f := range fs {
		if _, dup := rep[f.Name]; dup {
			t.Fatalf("doctor reported %q twice: %s", f.Name, r.stdout)
		}
		if f.Message == "" || f.Status == "" {
			t.Fatalf("doctor's finding %q has no status or message: %+v", f.Name, f)
		}
		rep[f.Name] = f
	}
	for _, name := range []string{"server", "standby", "pooler", "prepared_statements", "idle_session_timeout",
		"idle_in_transaction_session_timeout", "deadlock_timeout", "lock_table"} {
		if _, ok := rep[name]; !ok {
			t.Fatalf("doctor reported no %q: %s", name, r.stdout)
		}
	}
	return rep
}

// want fails t unless finding name has status, and each of values (JSON's
// numbers are float64).
func (rep doctorReport) want(t *testing.T, name, status string, values map[string]any) {
	t.Helper()
	f := rep[name]
	if f.Status != status {
		t.Errorf("doctor: %s is %s, want %s: %s", name, f.Status, status, f.Message)
	}
	for k, v := range values {
		if got := f.Values[k]; fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("doctor: %s's %s = %v, want %v (%s)", name, k, got, v, f.Message)
		}
	}
}

// traffic is other clients hammering a server (or a pooler) with short
// statements and transactions, from both drivers, until t ends.
type traffic struct {
	ops, errs atomic.Int64
}

// startTraffic starts n clients on dsn, each a connection of its own:
// lib/pq and pgx (simple protocol) in turns, each alternating a statement
// with a transaction of two.
func startTraffic(t *testing.T, dsn string, n int) *traffic {
	t.Helper()
	tr := &traffic{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i := 0; i < n; i++ {
		driver, d := "postgres", dsn
		if i%2 == 1 {
			driver, d = "pgx", withParam(dsn, "default_query_exec_mode", "simple_protocol")
		}
		db := pgtest.Open(t, driver, d)
		db.SetMaxOpenConns(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ctx.Err() == nil; j++ {
				var err error
				if j%2 == 0 {
					var pid int
					err = db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid)
				} else {
					var tx *sql.Tx
					if tx, err = db.BeginTx(ctx, nil); err == nil {
						if _, err = tx.ExecContext(ctx, "SELECT 1"); err == nil {
							_, err = tx.ExecContext(ctx, "SELECT 2")
						}
						if err == nil {
							err = tx.Commit()
						} else {
							tx.Rollback()
						}
					}
				}
				if err != nil {
					if ctx.Err() == nil {
						tr.errs.Add(1)
						time.Sleep(5 * time.Millisecond)
					}
					continue
				}
				tr.ops.Add(1)
			}
		}()
	}
	// Under way before the first run.
	deadline := time.Now().Add(time.Minute)
	for tr.ops.Load() < int64(10*n) {
		if time.Now().After(deadline) {
			t.Fatalf("the other clients ran %d statements in a minute (%d errors)", tr.ops.Load(), tr.errs.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return tr
}

// withParam returns URL dsn with query parameter k set to v.
func withParam(dsn, k, v string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

// doctorUnderTraffic runs the doctor doctorRuns() times on dsn, and on dsn
// in pgx's simple protocol as many, each while tr's clients run
// statements (checked), and returns the reports.
func doctorUnderTraffic(t *testing.T, dsn string, tr *traffic) []doctorReport {
	t.Helper()
	var reps []doctorReport
	for _, d := range []string{dsn, withParam(dsn, "default_query_exec_mode", "simple_protocol")} {
		for i := 0; i < doctorRuns(); i++ {
			before := tr.ops.Load()
			reps = append(reps, runDoctor(t, d))
			if tr.ops.Load() == before {
				t.Fatalf("run %d: the other clients ran nothing while the doctor ran", i)
			}
		}
	}
	return reps
}

// TestDoctorPooler: the doctor tells a transaction pooler from a direct
// connection and from a session-mode pooler, under other clients'
// traffic, every time, with the DSN in pgx's default mode and in its
// simple protocol; whether prepared statements survive; PgBouncer's own
// timeouts named only behind a transaction pooler.
func TestDoctorPooler(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	if !srv.Local() {
		pgtest.Unavailable(t, "a local cluster (for PgBouncer)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	name := pgtest.DatabaseOf(dsn)

	t.Run("direct", func(t *testing.T) {
		tr := startTraffic(t, dsn, 6)
		for i, rep := range doctorUnderTraffic(t, dsn, tr) {
			rep.want(t, "pooler", statusOK, map[string]any{"transaction_pooler": false, "rounds": doctorRounds})
			if _, ok := rep["pooler"].Values["relayed"]; ok {
				t.Errorf("run %d: a direct connection is said relayed: %s", i, rep["pooler"].Message)
			}
			rep.want(t, "prepared_statements", statusOK, map[string]any{"survive": true})
			if _, ok := rep["pooler_timeouts"]; ok {
				t.Errorf("run %d: pooler_timeouts on a direct connection", i)
			}
		}
		t.Logf("direct: %d runs, no transaction pooler in any; other clients' statements: %d (%d errors)", 2*doctorRuns(), tr.ops.Load(), tr.errs.Load())
	})

	for _, pool := range []int{4, 8} {
		t.Run(fmt.Sprintf("transaction pool %d", pool), func(t *testing.T) { doctorTransactionPooler(t, srv, name, pool) })
	}

	t.Run("session", func(t *testing.T) {
		b := pgtest.StartPgBouncer(t, srv, "session", 20)
		bdsn := b.DSNFor(name)
		tr := startTraffic(t, bdsn, 6)
		for i, rep := range doctorUnderTraffic(t, bdsn, tr) {
			rep.want(t, "pooler", statusNote, map[string]any{"transaction_pooler": false, "relayed": true, "rounds": doctorRounds,
				"server_port": srv.Port, "reached_port": b.Port})
			if m := rep["pooler"].Message; !strings.Contains(m, "relays") || !strings.Contains(m, "client_idle_timeout") {
				t.Errorf("run %d: the session-mode pooler is not named as a relay: %s", i, m)
			}
			rep.want(t, "prepared_statements", statusOK, map[string]any{"survive": true})
			if _, ok := rep["pooler_timeouts"]; ok {
				t.Errorf("run %d: pooler_timeouts behind a session-mode pooler", i)
			}
		}
		t.Logf("session pooler: %d runs, no transaction pooler in any; other clients' statements: %d (%d errors)", 2*doctorRuns(), tr.ops.Load(), tr.errs.Load())
	})
	waitNoLocks(t, db)
}

// doctorTransactionPooler runs the doctor behind PgBouncer in
// transaction mode with pool server connections, under other clients'
// traffic: a transaction pooler every time, prepared statements lost.
func doctorTransactionPooler(t *testing.T, srv *pgtest.Server, name string, pool int) {
	b := pgtest.StartPgBouncer(t, srv, "transaction", pool)
	bdsn := b.DSNFor(name)
	tr := startTraffic(t, bdsn, 6)
	byProbe, byRounds := 0, 0
	for i, rep := range doctorUnderTraffic(t, bdsn, tr) {
		rep.want(t, "pooler", statusWarn, map[string]any{"transaction_pooler": true})
		if m := rep["pooler"].Message; !strings.Contains(m, "sqllock.WithTransactionPooler()") || !strings.Contains(m, "--transaction-pooler") {
			t.Errorf("run %d: the pooler finding names no option: %s", i, m)
		}
		if rep["pooler"].Values["probe_evidence"] != nil {
			byProbe++
		}
		if rep["pooler"].Values["rounds_evidence"] != "" {
			byRounds++
		}
		rep.want(t, "prepared_statements", map[bool]string{true: statusWarn, false: statusNote}[i < doctorRuns()], map[string]any{"survive": false})
		if f, ok := rep["pooler_timeouts"]; !ok || !strings.Contains(f.Message, "cannot be read") || !strings.Contains(f.Message, "idle_transaction_timeout") {
			t.Errorf("run %d: pooler_timeouts = %+v, want a note that PgBouncer's own cannot be read", i, f)
		}
	}
	if n := tr.errs.Load(); n != 0 {
		t.Errorf("the other clients (lib/pq, pgx's simple protocol) met %d errors through the transaction pooler", n)
	}
	t.Logf("transaction pooler (PgBouncer, pool_mode=transaction, default_pool_size %d): %d of %d runs seen by the Locker's probe, %d by the rounds; other clients' statements: %d (%d errors)",
		pool, byProbe, 2*doctorRuns(), byRounds, tr.ops.Load(), tr.errs.Load())
}

// TestDoctorSettings: on a real server, the doctor reports the server, a
// primary, the idle timeouts, deadlock_timeout and its slice, and the
// lock table with the advisory locks held and awaited now, as the
// server has them.
func TestDoctorSettings(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	name := pgtest.DatabaseOf(dsn)
	admin := pgtest.Open(t, "pgx", srv.AdminDSN())
	ctx := context.Background()
	for _, q := range []string{
		"ALTER DATABASE %q SET idle_session_timeout = '7s'",
		"ALTER DATABASE %q SET idle_in_transaction_session_timeout = '3s'",
		"ALTER DATABASE %q SET deadlock_timeout = '300ms'",
	} {
		if _, err := admin.ExecContext(ctx, fmt.Sprintf(q, name)); err != nil {
			t.Fatal(err)
		}
	}
	var num int
	var mlpt, mc, mpt int64
	if err := admin.QueryRowContext(ctx, `SELECT current_setting('server_version_num')::int, current_setting('max_locks_per_transaction')::int8,
		current_setting('max_connections')::int8, current_setting('max_prepared_transactions')::int8`).Scan(&num, &mlpt, &mc, &mpt); err != nil {
		t.Fatal(err)
	}
	// Three advisory locks held, one awaited.
	for _, k := range []int{901, 902, 903} {
		rawConn(t, dsn, fmt.Sprintf("SELECT pg_advisory_lock(%d)", k))
	}
	waiter, err := pgtest.Open(t, "pgx", dsn).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan struct{})
	go func() { defer close(waited); waiter.ExecContext(wctx, "SELECT pg_advisory_lock(901)") }()
	t.Cleanup(func() { cancel(); <-waited; waiter.Close() })
	waitAwaited(t, admin, 1)

	held, awaited := advisoryCount(t, admin)
	rep := runDoctor(t, dsn)
	if h, a := advisoryCount(t, admin); h != held || a != awaited || held < 3 || awaited < 1 {
		t.Fatalf("advisory locks held and awaited: %d and %d before the doctor ran, %d and %d after; want the test's 3 and 1 at least, and no change", held, awaited, h, a)
	}
	major := num / 10000
	rep.want(t, "server", map[bool]string{true: statusOK, false: statusNote}[major >= 14], map[string]any{"major": major, "supported": true, "flavour": "postgresql"})
	rep.want(t, "standby", statusOK, map[string]any{"in_recovery": false})
	if major >= 14 {
		rep.want(t, "idle_session_timeout", statusNote, map[string]any{"seconds": 7})
		if m := rep["idle_session_timeout"].Message; !strings.Contains(m, "holders are spared") {
			t.Errorf("idle_session_timeout: %s", m)
		}
	} else {
		rep.want(t, "idle_session_timeout", statusNote, nil)
	}
	rep.want(t, "idle_in_transaction_session_timeout", statusNote, map[string]any{"seconds": 3})
	rep.want(t, "deadlock_timeout", statusOK, map[string]any{"seconds": 0.3, "slice_seconds": 0.15})
	if m := rep["deadlock_timeout"].Message; !strings.Contains(m, "statements of 150ms") {
		t.Errorf("deadlock_timeout: %s", m)
	}
	rep.want(t, "lock_table", statusOK, map[string]any{"size": mlpt * (mc + mpt), "max_locks_per_transaction": mlpt, "max_connections": mc,
		"max_prepared_transactions": mpt, "advisory_held": held, "advisory_awaited": awaited})
	if m := rep["lock_table"].Message; !strings.Contains(m, fmt.Sprintf("room for about %d locks", mlpt*(mc+mpt))) {
		t.Errorf("lock_table: %s", m)
	}
}

// advisoryCount returns the advisory locks held and awaited in the
// server now.
func advisoryCount(t *testing.T, db *sql.DB) (held, awaited int) {
	t.Helper()
	if err := db.QueryRow(`SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&held, &awaited); err != nil {
		t.Fatal(err)
	}
	return held, awaited
}

// waitAwaited waits until n advisory locks are awaited in the server.
func waitAwaited(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var got int
		if err := db.QueryRow("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d advisory locks awaited, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDoctorStandby: the doctor probes a hot standby, and says sqllock
// refuses it.
func TestDoctorStandby(t *testing.T) {
	srv := pgtest.Start(t)
	if !srv.Local() {
		pgtest.Unavailable(t, "a local cluster (for a standby)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	standby := pgtest.StartStandby(t, srv)
	rep := runDoctor(t, standby.DSN())
	rep.want(t, "standby", statusError, map[string]any{"in_recovery": true})
	if m := rep["standby"].Message; !strings.Contains(m, "ErrStandby") || !strings.Contains(m, "primary") {
		t.Errorf("standby: %s", m)
	}
	rep.want(t, "pooler", statusOK, map[string]any{"transaction_pooler": false})
	if rep["server"].Values["supported"] != true {
		t.Errorf("server: %+v", rep["server"])
	}
}

// doctorExitRows are the statuses of docs/cli.md's table for sqllock
// doctor, each with the cases of TestDoctorExit that prove it.
var doctorExitRows = map[string][]string{
	"0":  {"probed"},
	"64": {"bad flag", "argument", "connect timeout"},
	"69": {"unreachable"},
	"77": {"authentication failed"},
	"78": {"bad DSN"},
}

// TestDoctorExit: each exit status of the doctor, and docs/cli.md's table
// of them.
func TestDoctorExit(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.DSN()
	u, _ := url.Parse(dsn)
	u.User = url.User("nosuchrole")
	cases := []struct {
		name string
		dsn  string
		args []string
		code int
		want string // in stderr
	}{
		{"probed", dsn, nil, 0, ""},
		{"bad flag", dsn, []string{"--bogus"}, exitUsage, "flag provided but not defined"},
		{"argument", dsn, []string{"extra"}, exitUsage, `unexpected argument "extra"`},
		{"connect timeout", dsn, []string{"--connect-timeout", "0s"}, exitUsage, "--connect-timeout must be positive"},
		{"unreachable", "postgres://u:s3cret@127.0.0.1:1/db", nil, exitUnavailable, "cannot reach PostgreSQL at 127.0.0.1:1"},
		{"authentication failed", u.String(), nil, exitNoPerm, "authentication failed"},
		{"bad DSN", "postgres://u:s3cret@127.0.0.1:notaport/db", nil, exitConfig, "bad DSN postgres://u:xxxxx@"},
	}
	names := map[string]bool{}
	for _, tc := range cases {
		names[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, tc.dsn, append([]string{"doctor"}, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("doctor %v: exit %d, stderr %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
			}
			if strings.Contains(r.stderr, "s3cret") {
				t.Fatalf("the password leaked: %q", r.stderr)
			}
			if tc.code == 0 && len(strings.Split(strings.TrimSpace(r.stdout), "\n")) < 8 {
				t.Fatalf("doctor printed %q, want a line per finding", r.stdout)
			}
		})
	}
	b, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## sqllock doctor\n")
	if !ok {
		t.Fatal("docs/cli.md has no section sqllock doctor")
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	_, table, ok := strings.Cut(sec, "| status | meaning |")
	if !ok {
		t.Fatal("docs/cli.md's sqllock doctor has no exit-status table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	var rows []string
	for _, m := range regexp.MustCompile(`(?m)^\| ([^|]+?) \| `).FindAllStringSubmatch(table, -1) {
		if r := strings.Trim(m[1], "` "); !strings.HasPrefix(r, "---") {
			rows = append(rows, r)
		}
	}
	if len(rows) != len(doctorExitRows) {
		t.Errorf("docs/cli.md lists the doctor's statuses %q; the tests cover %d", rows, len(doctorExitRows))
	}
	for _, r := range rows {
		if _, err := strconv.Atoi(r); err != nil || doctorExitRows[r] == nil {
			t.Errorf("doctor status %q of docs/cli.md has no test", r)
		}
		for _, n := range doctorExitRows[r] {
			if !names[n] {
				t.Errorf("doctor status %q: no case %q", r, n)
			}
		}
	}
}

// TestDoctorServerFlavours: what the doctor says of each server version()
// string: refused (CockroachDB, too old, not PostgreSQL), warned
// (YugabyteDB), noted (PostgreSQL 12 and 13: no lease), fine.
func TestDoctorServerFlavours(t *testing.T) {
	tests := []struct {
		version, status, flavour, want string
	}{
		{"PostgreSQL 16.4 (Debian 16.4-1.pgdg120+1) on x86_64-pc-linux-gnu, compiled by gcc", statusOK, "postgresql", "PostgreSQL 16.4 (Debian 16.4-1.pgdg120+1): supported"},
		{"PostgreSQL 13.16 on x86_64-pc-linux-gnu", statusNote, "postgresql", "no idle_session_timeout"},
		{"PostgreSQL 11.22 on x86_64-pc-linux-gnu", statusError, "postgresql", "PostgreSQL 11; sqllock needs PostgreSQL 12 or later"},
		{"CockroachDB CCL v24.1.0 (x86_64-pc-linux-gnu, built 2024/05/15 21:28:29, go1.22.2)", statusError, "cockroachdb", "ErrUnsupportedServer"},
		{"PostgreSQL 15.2-YB-2.25.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang", statusWarn, "yugabytedb", "yugabyte#25756"},
		{"PostgreSQL 11.2-YB-2.20.2.0-b0 on x86_64-pc-linux-gnu, compiled by clang", statusError, "yugabytedb", "yugabyte#25756"},
		{"PostgreSQL 8.0.2 on i686-pc-linux-gnu, compiled by GCC gcc (GCC) 3.4.2 20041017 (Red Hat 3.4.2-6.fc3), Redshift 1.0.77467", statusError, "redshift", "ErrUnsupportedServer"},
		{"MySQL 8.0", statusError, "postgresql", "ErrUnsupportedServer"},
	}
	for _, tc := range tests {
		f := serverFinding(tc.version, nil)
		if f.Status != tc.status || f.Values["flavour"] != tc.flavour || !strings.Contains(f.Message, tc.want) {
			t.Errorf("serverFinding(%q) = %s, %v, %q; want %s, %s, and %q", tc.version, f.Status, f.Values["flavour"], f.Message, tc.status, tc.flavour, tc.want)
		}
	}
	if f := serverFinding("", errors.New("boom")); f.Status != statusUnknown || !strings.Contains(f.Message, "boom") {
		t.Errorf("serverFinding with an error = %+v", f)
	}
}

// TestDoctorTimeouts: the idle timeouts and deadlock_timeout weighed
// against the keep-alive and the orphan bound, with and without a
// transaction pooler; the lock table's headroom.
func TestDoctorTimeouts(t *testing.T) {
	ms := func(v string) map[string]setting {
		return map[string]setting{"idle_session_timeout": {v, "ms"}, "idle_in_transaction_session_timeout": {v, "ms"}, "deadlock_timeout": {v, "ms"}}
	}
	table := map[string]setting{"max_locks_per_transaction": {"64", ""}, "max_connections": {"100", ""}, "max_prepared_transactions": {"0", ""}}
	tests := []struct {
		name   string
		f      finding
		status string
		want   string
	}{
		{"idle session off", idleSessionFinding(ms("0"), nil, false), statusOK, "0 (off)"},
		{"idle session", idleSessionFinding(ms("7000"), nil, false), statusNote, "7s: the server ends a session idle for 7s; sqllock sets its own"},
		{"idle session, pooler", idleSessionFinding(ms("7000"), nil, true), statusNote, "inside open transactions, where it does not apply"},
		{"idle session, PostgreSQL 13", idleSessionFinding(map[string]setting{}, nil, false), statusNote, "no idle_session_timeout"},
		{"idle in transaction off", idleInTxFinding(ms("0"), nil, true), statusOK, "0 (off)"},
		{"idle in transaction", idleInTxFinding(ms("3000"), nil, false), statusNote, "LockTx or InTx whose work pauses that long loses its lock; sqllock's session-level locks are held outside"},
		{"idle in transaction, pooler", idleInTxFinding(ms("3000"), nil, true), statusNote, "WithTransactionPooler holds its locks inside open transactions, each with its own (the orphan bound, 30s at its defaults; a holder idle for a third of it gets a statement at the keep-alive's next check, every 5s)"},
		{"deadlock_timeout", deadlockFinding(ms("1000"), nil), statusOK, "statements of 500ms each"},
		{"deadlock_timeout tiny", deadlockFinding(ms("5"), nil), statusWarn, "a statement every 3ms"},
		{"pg_settings unread", deadlockFinding(nil, errors.New("permission denied")), statusUnknown, "permission denied"},
		{"lock table", lockTableFinding(table, nil, lockCounts{100, 2, 1}, nil), statusOK, "room for about 6400 locks (max_locks_per_transaction 64 × (max_connections 100 + max_prepared_transactions 0))"},
		{"lock table nearly full", lockTableFinding(table, nil, lockCounts{5120, 5000, 0}, nil), statusWarn, "nearly full"},
		{"lock table uncounted", lockTableFinding(table, nil, lockCounts{}, errors.New("canceled")), statusUnknown, "could not count"},
		{"bad unit", idleInTxFinding(map[string]setting{"idle_in_transaction_session_timeout": {"3", "fortnights"}}, nil, false), statusUnknown, `unknown unit "fortnights"`},
	}
	for _, tc := range tests {
		if tc.f.Status != tc.status || !strings.Contains(tc.f.Message, tc.want) {
			t.Errorf("%s: %s %q; want %s and %q", tc.name, tc.f.Status, tc.f.Message, tc.status, tc.want)
		}
	}
}

// TestDoctorDefaultsAreLibrarys: the keep-alive and orphan bound the
// doctor weighs timeouts against are the library's defaults.
func TestDoctorDefaultsAreLibrarys(t *testing.T) {
	b, err := os.ReadFile("../../options.go")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]time.Duration{"defaultKeepAlive": libKeepAlive, "defaultOrphanBound": libOrphanBound} {
		m := regexp.MustCompile(`const ` + name + ` = (\d+) \* time\.Second`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("options.go has no %s in seconds", name)
		}
		if n, _ := strconv.Atoi(string(m[1])); time.Duration(n)*time.Second != want {
			t.Errorf("options.go's %s is %ss; the doctor weighs against %v", name, m[1], want)
		}
	}
}

// TestRunTransactionPooler: behind PgBouncer in transaction mode, under
// other clients' traffic, run --transaction-pooler holds its lock while
// COMMAND runs (another run backs out), releases it after, and leaves no
// lock on the pooler's server sessions; without the flag, run refuses
// (exit 70) and names the flag.
func TestRunTransactionPooler(t *testing.T) {
	srv := pgtest.Start(t)
	if !srv.Local() {
		pgtest.Unavailable(t, "a local cluster (for PgBouncer)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	dsn := srv.NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	b := pgtest.StartPgBouncer(t, srv, "transaction", 4)
	bdsn := b.DSNFor(pgtest.DatabaseOf(dsn))
	startTraffic(t, bdsn, 4)
	dir := t.TempDir()
	started, release := dir+"/started", dir+"/release"

	holder := sqllockCmd(bdsn, "run", "--transaction-pooler", "pooled", "--", "sh", "-c",
		fmt.Sprintf("touch %s; while [ ! -e %s ]; do sleep 0.05; done", started, release))
	var holderErr strings.Builder
	holder.Stderr = &holderErr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- holder.Wait() }()
	t.Cleanup(func() { holder.Process.Kill() })
	waitFile(t, started)
	if hs := holders(t, db, sqllock.Hash("pooled")); len(hs) != 1 || !hs[0].Granted {
		t.Fatalf("while COMMAND runs, the server shows %+v, want one holder", hs)
	}
	for _, flag := range []string{"--transaction-pooler", ""} {
		args := []string{"run", "-n", "pooled", "--", "true"}
		if flag != "" {
			args = []string{"run", "-n", flag, "pooled", "--", "true"}
		}
		r := runCLI(t, bdsn, args...)
		switch {
		case flag != "" && (r.code != 1 || !strings.Contains(r.stderr, "held elsewhere")):
			t.Errorf("a second run --transaction-pooler -n: exit %d, stderr %q; want 1, held elsewhere", r.code, r.stderr)
		case flag == "" && (r.code != exitSoftware || !strings.Contains(r.stderr, "--transaction-pooler")):
			t.Errorf("run -n without --transaction-pooler behind the pooler: exit %d, stderr %q; want %d, naming --transaction-pooler", r.code, r.stderr, exitSoftware)
		}
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the holding run: %v, stderr %q", err, holderErr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("the holding run did not end within a minute of its COMMAND's")
	}
	waitNoLocks(t, db)
	if r := runCLI(t, bdsn, "run", "-n", "--transaction-pooler", "pooled", "--", "true"); r.code != 0 {
		t.Errorf("run --transaction-pooler -n once the key is free: exit %d, stderr %q", r.code, r.stderr)
	}
	waitNoLocks(t, db)
}
