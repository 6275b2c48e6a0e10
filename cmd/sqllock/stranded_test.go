package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/pgtest"
)

// rawHolder is a session that took an advisory lock by hand and went
// quiet, as a psql left open does.
type rawHolder struct {
	pid  int
	key  sqllock.Key
	app  string
	stop func()
}

// psqlHolder starts psql, which takes lock k and waits at its prompt
// (its standard input stays open), as a person's psql left open does;
// where the server has no psql at hand, a plain database/sql connection
// that does the same stands in for it.
func psqlHolder(t *testing.T, srv *pgtest.Server, dsn string, k int64) rawHolder {
	t.Helper()
	h := rawHolder{key: sqllock.Int64(k), app: "psql"}
	if srv.BinDir() == "" {
		conn := rawConn(t, dsn, fmt.Sprintf("SELECT set_config('application_name', 'psql', false), pg_advisory_lock(%d)", k))
		h.stop = func() { conn.Close() }
	} else {
		cmd := exec.Command(filepath.Join(srv.BinDir(), "psql"), "-X", "-q", "-d", dsn)
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(in, fmt.Sprintf("SELECT pg_advisory_lock(%d);\n", k)); err != nil {
			t.Fatal(err)
		}
		h.stop = func() { in.Close(); cmd.Wait() }
	}
	t.Cleanup(h.stop)
	h.pid = waitHolder(t, dsn, h.key)
	return h
}

// rawConn runs q on a connection of its own, which it keeps open (for
// t's life) and idle.
func rawConn(t *testing.T, dsn, q string) *sql.Conn {
	t.Helper()
	conn, err := pgtest.Open(t, "pgx", dsn).Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for _, s := range strings.Split(q, ";") {
		if _, err := conn.ExecContext(context.Background(), s); err != nil {
			t.Fatal(err)
		}
	}
	return conn
}

// waitHolder waits until a session holds k, and returns its pid.
func waitHolder(t *testing.T, dsn string, k sqllock.Key) int {
	t.Helper()
	db := pgtest.Open(t, "pgx", dsn)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, h := range holders(t, db, k) {
			if h.Granted {
				return h.PID
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no one holds %v", k)
	return 0
}

// liveHolders takes locks through sqllock in every way it holds them, on
// both drivers, and keeps them for t's life: the keys they hold.
func liveHolders(t *testing.T, dsn string) []sqllock.Key {
	t.Helper()
	ctx := context.Background()
	var keys []sqllock.Key
	next := int64(9_000_000)
	key := func() sqllock.Key { next++; k := sqllock.Int64(next); keys = append(keys, k); return k }
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, drv := range []string{"postgres", "pgx"} {
		db := pgtest.Open(t, drv, dsn)
		for _, l := range []*sqllock.Locker{
			sqllock.New(db), // leased, touched every 10 s
			sqllock.New(db, sqllock.WithOrphanBound(3*time.Second)),                          // touched every second
			sqllock.New(db, sqllock.WithKeepAlive(0)),                                        // not leased: idle for good
			sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0)),       // a session per lock
			sqllock.New(db, sqllock.WithApplicationName("worker"), sqllock.WithKeepAlive(0)), // named like a raw holder below
		} {
			// A few rounds first: lib/pq's shared sessions then prepare
			// their statements (EXECUTE sqllock_...).
			for i := range 10 {
				lk, err := l.TryLock(ctx, sqllock.Int64(8_999_000+int64(i)))
				check(err)
				check(lk.Unlock(ctx))
			}
			tk, err := l.Lock(ctx, key())
			check(err)
			_, err = tk.Token(ctx)
			check(err)
			t.Cleanup(func() { tk.Unlock(ctx) })
			rk, err := l.RLock(ctx, key())
			check(err)
			t.Cleanup(func() { rk.Unlock(ctx) })

			started, done := make(chan struct{}), make(chan struct{})
			dk := key()
			go l.Do(ctx, dk, func(context.Context) error { close(started); <-done; return nil })
			<-started
			t.Cleanup(func() { close(done) })

			e := l.Election(key())
			term, err := e.Campaign(ctx, "leader")
			check(err)
			check(e.Proclaim(ctx, "leader-2"))
			t.Cleanup(func() { term.Unlock(ctx) })

			s, err := l.Session(ctx)
			check(err)
			_, err = s.TryLock(ctx, key(), key())
			check(err)
			t.Cleanup(func() { s.Close(ctx) })

			next++
			permit, err := l.Semaphore(fmt.Sprintf("stranded-%d", next), 3).Acquire(ctx)
			check(err)
			t.Cleanup(func() { permit.Unlock(ctx) })

			// The shared session's last statement: on lib/pq, an EXECUTE.
			lk, err := l.TryLock(ctx, key())
			check(err)
			t.Cleanup(func() { lk.Unlock(ctx) })
		}
	}
	return keys
}

// strandedJSON runs inspect --stranded d --json and returns its rows.
func strandedJSON(t *testing.T, dsn string, d string) []jsonLock {
	t.Helper()
	r := runCLI(t, dsn, "inspect", "--stranded", d, "--json")
	if r.code != 0 {
		t.Fatalf("inspect --stranded %s: exit %d, %s", d, r.code, r.stderr)
	}
	var rows []jsonLock
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("inspect --stranded %s --json: %v\n%s", d, err, r.stdout)
	}
	return rows
}

// TestStrandedAndBreak: a lock left by an idle psql, and one left by a
// connection idle in a transaction, are listed by inspect --stranded with
// their application and client address, and freed by break; locks that
// sqllock holds, in every way it holds them and on both drivers, are never
// listed, even at --stranded 0s, nor broken. break is a dry run by
// default, refuses a holder idle for less than --idle-at-least or named
// otherwise than --application, one running a statement, and another
// role's that it may not examine, and needs --application with --yes; its
// terminating statement leaves alone a holder that ran a statement since
// it was read.
func TestStrandedAndBreak(t *testing.T) {
	srv := pgtest.Start(t)
	dsn, db := database(t)
	live := liveHolders(t, dsn)
	psql := psqlHolder(t, srv, dsn, 4242)
	worker := rawHolder{key: sqllock.Pair(7, 8), app: "worker"}
	rawConn(t, dsn, "SELECT set_config('application_name', 'worker', false); BEGIN; SELECT pg_advisory_xact_lock(7, 8)")
	worker.pid = waitHolder(t, dsn, worker.key)
	time.Sleep(1500 * time.Millisecond) // the raw holders idle for a while

	// Listed: the raw holders only, whatever D below their idle time.
	for _, d := range []string{"0s", "1s"} {
		rows := strandedJSON(t, dsn, d)
		var got []string
		for _, r := range rows {
			got = append(got, r.Key)
			if r.IdleSeconds == nil || *r.IdleSeconds < 1 {
				t.Errorf("--stranded %s: %s idle for %v, want at least 1s", d, r.Key, r.IdleSeconds)
			}
			if r.ClientAddr == "" && srv.SocketDir() == "" {
				t.Errorf("--stranded %s: %s has no client address", d, r.Key)
			}
		}
		slices.Sort(got)
		if want := []string{"(7,8)", "4242"}; !slices.Equal(got, want) {
			t.Fatalf("--stranded %s lists %v, want %v (sqllock's holders of %v never)", d, got, want, live)
		}
		for _, r := range rows {
			want := map[string]rawHolder{"4242": psql, "(7,8)": worker}[r.Key]
			if r.PID != want.pid || r.ApplicationName != want.app {
				t.Errorf("--stranded %s: %s held by %d %q, want %d %q", d, r.Key, r.PID, r.ApplicationName, want.pid, want.app)
			}
		}
	}
	if rows := strandedJSON(t, dsn, "1h"); len(rows) != 0 {
		t.Fatalf("--stranded 1h lists %+v, want none", rows)
	}
	r := runCLI(t, dsn, "inspect", "--stranded", "0s")
	for _, want := range []string{"4242", "psql", "idle in transaction", "on sessions of sqllock", "are not listed"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("inspect --stranded 0s: no %q in\n%s", want, r.stdout)
		}
	}
	t.Log("inspect --stranded 0s:\n" + r.stdout)

	stillHeld := func(h rawHolder) {
		t.Helper()
		for _, l := range holders(t, db, h.key) {
			if l.Granted && l.PID == h.pid {
				return
			}
		}
		t.Fatalf("%v is no longer held by backend %d", h.key, h.pid)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"break", "--idle-at-least", "500ms", "4242"}, 0, "would terminate it with --application psql --yes"},
		{[]string{"break", "--application", "psql", "4242"}, 1, "less than --idle-at-least 1m0s"},
		{[]string{"break", "--idle-at-least", "500ms", "--application", "psql", "4242"}, 0, "dry run: nothing was done"},
		{[]string{"break", "--idle-at-least", "500ms", "--application", "cron", "--yes", "4242"}, 1, `not --application "cron"`},
		{[]string{"break", "--idle-at-least", "500ms", "--yes", "4242"}, exitUsage, "--yes needs --application"},
		{[]string{"break", "--idle-at-least", "1h", "--application", "psql", "--yes", "4242"}, 1, "less than --idle-at-least 1h0m0s"},
		{[]string{"break", "4243"}, 1, "is not held"},
	} {
		r := runCLI(t, dsn, c.args...)
		if r.code != c.code || !strings.Contains(r.stdout+r.stderr, c.want) {
			t.Errorf("%v: exit %d, %s%s; want %d and %q", c.args, r.code, r.stdout, r.stderr, c.code, c.want)
		}
		stillHeld(psql)
	}
	// A holder running a statement, and a session of another role that
	// this role may not examine, are left alone.
	busy := rawHolder{key: sqllock.Int64(4244)}
	busyDB := pgtest.Open(t, "pgx", dsn)
	go busyDB.Exec("SELECT pg_advisory_lock(4244), pg_sleep(30)")
	busy.pid = waitHolder(t, dsn, busy.key)
	defer db.Exec("SELECT pg_cancel_backend($1)", busy.pid)
	admin := rawConn(t, srv.AdminDSNFor(pgtest.DatabaseOf(dsn)), "SELECT pg_advisory_lock(4245)")
	defer admin.ExecContext(context.Background(), "SELECT pg_advisory_unlock_all()")
	var privileged bool
	if err := db.QueryRow(`SELECT current_setting('is_superuser') = 'on' OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')`).Scan(&privileged); err != nil {
		t.Fatal(err)
	}
	waitHolder(t, dsn, sqllock.Int64(4245))
	time.Sleep(100 * time.Millisecond)
	if r := runCLI(t, dsn, "break", "--idle-at-least", "0s", "--application", "", "--yes", "4244"); r.code != 1 || !strings.Contains(r.stdout, "its session is not idle (active)") {
		t.Errorf("break of a holder running a statement: exit %d, %s%s; want 1 and a refusal", r.code, r.stdout, r.stderr)
	}
	if !privileged {
		if r := runCLI(t, dsn, "break", "--idle-at-least", "0s", "--application", "", "--yes", "4245"); r.code != 1 || !strings.Contains(r.stdout, "a session of another role") {
			t.Errorf("break of another role's holder: exit %d, %s%s; want 1 and a refusal", r.code, r.stdout, r.stderr)
		}
		if r := runCLI(t, dsn, "inspect", "--stranded", "0s"); !strings.Contains(r.stdout, "1 lock(s) belong to sessions of other roles") || strings.Contains(r.stdout, "4245") {
			t.Errorf("inspect --stranded 0s with another role's lock:\n%s", r.stdout)
		}
	}

	// sqllock's own: never broken, whatever the guards allow (four runs at
	// a time).
	var wg sync.WaitGroup
	runs := make(chan struct{}, 4)
	for _, k := range live {
		wg.Add(1)
		runs <- struct{}{}
		go func() {
			defer func() { <-runs; wg.Done() }()
			r := runCLI(t, dsn, "break", "--idle-at-least", "0s", "--application", "worker", "--yes", k.String())
			if r.code != 1 || !strings.Contains(r.stdout, "a lock session of sqllock") {
				t.Errorf("break of sqllock's %v: exit %d, %s%s; want 1 and a refusal", k, r.code, r.stdout, r.stderr)
			}
		}()
	}
	wg.Wait()

	// A holder that ran a statement since it was read is left alone: the
	// terminate statement checks the state it was read in.
	var since time.Time
	if err := db.QueryRow("SELECT state_change FROM pg_stat_activity WHERE pid = $1", psql.pid).Scan(&since); err != nil {
		t.Fatal(err)
	}
	c, o, sub := tagOf(psql.key)
	var ok bool
	err := db.QueryRow(sqltext.BreakSQL, psql.pid, c, o, sub, since.Add(-time.Microsecond), "0 microseconds", "psql").Scan(&ok)
	if !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("BreakSQL with another state_change = %v, %v; want no row", ok, err)
	}
	stillHeld(psql)

	for _, h := range []rawHolder{psql, worker} {
		r := runCLI(t, dsn, "break", "--idle-at-least", "500ms", "--application", h.app, "--yes", h.key.String())
		if r.code != 0 || !strings.Contains(r.stdout, "terminated backend "+strconv.Itoa(h.pid)) || !strings.Contains(r.stdout, "freed") {
			t.Fatalf("break --yes %v: exit %d, %s%s", h.key, r.code, r.stdout, r.stderr)
		}
		t.Log(strings.TrimSpace(r.stdout))
		if hs := holders(t, db, h.key); len(hs) != 0 {
			t.Fatalf("%v still held after break: %+v", h.key, hs)
		}
	}
	// sqllock's locks are all still held.
	for _, k := range live {
		if n := len(holders(t, db, k)); n == 0 {
			t.Errorf("sqllock's lock %v was freed", k)
		}
	}
	if rows := strandedJSON(t, dsn, "0s"); len(rows) != 0 && !privileged {
		t.Fatalf("--stranded 0s after break lists %+v, want none", rows)
	}
}
