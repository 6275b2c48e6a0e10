package sqllock_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
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

	"github.com/lib/pq"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestElection: one candidate leads; the others wait in Campaign; Leader
// and Observe show the leader's value; Resign elects the next at once; the
// terms' fencing tokens grow; a fenced write from an old term is refused.
func TestElection(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		if _, err := db.Exec("CREATE TABLE jobs (id int PRIMARY KEY, owner text, fence bigint NOT NULL DEFAULT 0)"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("INSERT INTO jobs (id) VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		k := sqllock.Hash("election:scheduler")
		a := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond)).Election(k)
		b := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(100*time.Millisecond)).Election(k)
		ctx, cancel := context.WithTimeout(bg(), 30*time.Second)
		defer cancel()
		changes := a.Observe(ctx)
		if first := <-changes; first.PID != 0 {
			t.Fatalf("Observe before any campaign = %v, want no leader", first)
		}
		la, err := a.Campaign(ctx, "host-a")
		if err != nil {
			t.Fatal(err)
		}
		if ld, err := b.Leader(ctx); err != nil || ld.Value != "host-a" || ld.PID != la.PID() {
			t.Fatalf("Leader() = %v, %v; want host-a on backend %d", ld, err, la.PID())
		}
		if ch := <-changes; ch.Value != "host-a" {
			t.Fatalf("Observe = %v, want host-a", ch)
		}
		tokA, err := la.Token(ctx)
		if err != nil || tokA <= 0 {
			t.Fatalf("Token() = %d, %v", tokA, err)
		}
		elected := make(chan *sqllock.Lock, 1)
		go func() {
			lb, err := b.Campaign(ctx, "host-b")
			if err != nil {
				t.Error(err)
			}
			elected <- lb
		}()
		waitWaiting(t, db, k)
		select {
		case <-elected:
			t.Fatal("a second candidate was elected while the first leads")
		default:
		}
		if _, err := a.Campaign(ctx, "it's"); !errors.Is(err, sqllock.ErrInvalidKey) {
			t.Fatalf("Campaign with an unusable value = %v, want ErrInvalidKey", err)
		}
		write := func(token int64, owner string) int64 {
			res, err := db.Exec("UPDATE jobs SET owner = $1, fence = $2 WHERE id = 1 AND fence < $2", owner, token)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := res.RowsAffected()
			return n
		}
		if write(tokA, "host-a") != 1 {
			t.Fatal("the leader's fenced write was refused")
		}
		resigned := time.Now()
		if err := la.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		lb := <-elected
		if lb == nil {
			t.FailNow()
		}
		defer lb.Unlock(bg())
		if d := time.Since(resigned); d > 2*time.Second {
			t.Fatalf("the next candidate was elected %v after the resignation", d)
		}
		tokB, err := lb.Token(ctx)
		if err != nil || tokB <= tokA {
			t.Fatalf("the next term's token = %d, %v; want more than %d", tokB, err, tokA)
		}
		if write(tokB, "host-b") != 1 || write(tokA, "host-a, paused") != 0 {
			t.Fatal("fencing: the new leader's write must pass and the old leader's must be refused")
		}
		if _, err := la.Token(ctx); !errors.Is(err, sqllock.ErrReleased) {
			t.Fatalf("Token() after Resign = %v, want ErrReleased", err)
		}
		for ch := range changes {
			if ch.Value == "host-b" {
				break
			}
			if ch.PID != 0 {
				t.Fatalf("Observe after host-a = %v, want no leader or host-b", ch)
			}
		}
	})
}

// waitWaiting waits until a session waits for k.
func waitWaiting(t *testing.T, db *sql.DB, k sqllock.Key) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		locks, err := sqllock.Inspect(bg(), db, nil, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range locks {
			if !l.Granted {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("no session waits for %v", k)
}

// helperCandidate leads with Election.Lead, term after term: each term it
// logs "start VALUE TOKEN UNIXNANO", holds the leadership for a moment (or
// until it is lost), and logs "end VALUE TOKEN UNIXNANO LOST" (the time
// the term's work ended; LOST: the server had already taken the lock, as
// the term's context or the resignation said), until the stop file
// exists.
func helperCandidate(db *sql.DB, dir, value string) int {
	l := sqllock.New(db, sqllock.WithKeepAlive(200*time.Millisecond), sqllock.WithOrphanBound(3*time.Second))
	e := l.Election(sqllock.Hash("election:failover"))
	log, err := os.OpenFile(filepath.Join(dir, "terms"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer log.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		for ctx.Err() == nil {
			if _, err := os.Stat(filepath.Join(dir, "stop")); err == nil {
				stop()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	for ctx.Err() == nil {
		var tok int64
		var end time.Time
		started := false
		err := e.Lead(ctx, value, func(tctx context.Context, ld *sqllock.Lock) error {
			fmt.Fprintf(log, "elected %s\n", value)
			started = false
			kctx, cancel := context.WithTimeout(tctx, 2*time.Second)
			var err error
			tok, err = ld.Token(kctx)
			cancel()
			if err != nil {
				return err
			}
			started = true
			fmt.Fprintf(log, "start %s %d %d\n", value, tok, time.Now().UnixNano())
			// A term lasts 30 ms, or, while the file "long" exists (the
			// test is about to hurt the leader), until it is lost.
			for held := true; held; {
				select {
				case <-tctx.Done():
					held = false
				case <-time.After(30 * time.Millisecond):
					_, err := os.Stat(filepath.Join(dir, "long"))
					held = err == nil
				}
			}
			end = time.Now()
			if errors.Is(context.Cause(tctx), sqllock.ErrLockLost) {
				// Lost: Lead campaigns again by itself.
				fmt.Fprintf(log, "end %s %d %d true\n", value, tok, end.UnixNano())
				started = false
			}
			return nil
		})
		if started {
			// fn returned as leader; Lead resigned: the unlock may have
			// found nothing to release.
			fmt.Fprintf(log, "end %s %d %d %v\n", value, tok, end.UnixNano(), errors.Is(err, sqllock.ErrLockLost))
		}
	}
	return 0
}

// TestElectionFailover: five candidate processes, each in Election.Lead,
// elect one leader after another; a leader killed with SIGKILL, a leader's backend terminated, a
// leader's connection cut off (its packets dropped, in a network
// namespace), and a server restart each bring a new leader within the
// keep-alive and the orphan bound (the restart: once the server is back); fencing tokens grow
// strictly from term to term, across the restart too; and a term overlaps
// the next, as its leader saw them, only when the server had taken its
// lock (the paused-leader case that fencing tokens are for).
func TestElectionFailover(t *testing.T) {
	long(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			srv := pgtest.StartIsolated(t) // a server of its own, behind a link the test can cut
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, "pgx", dsn)
			dir := t.TempDir()
			procs := map[string]*exec.Cmd{}
			startCandidate := func(value string) {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=candidate", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn, "HELPER_DIR="+dir, "HELPER_VALUE="+value)
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				procs[value] = cmd
			}
			for i := range 5 {
				startCandidate("cand-" + strconv.Itoa(i))
			}
			defer func() {
				os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)
				for _, p := range procs {
					done := make(chan struct{})
					go func() { p.Wait(); close(done) }()
					select {
					case <-done:
					case <-time.After(15 * time.Second):
						p.Process.Kill()
					}
				}
			}()
			e := sqllock.New(db).Election(sqllock.Hash("election:failover"))
			// An observer, asking every 20 ms: what it sees must follow the
			// terms, in order.
			octx, ostop := context.WithCancel(bg())
			observed := make(chan []string, 1)
			go func() {
				var seen []string
				for ld := range sqllock.New(db, sqllock.WithKeepAlive(20*time.Millisecond)).Election(sqllock.Hash("election:failover")).Observe(octx) {
					if ld.Value != "" {
						seen = append(seen, ld.Value)
					}
				}
				observed <- seen
			}()
			leader := func() sqllock.Leader {
				t.Helper()
				deadline := time.Now().Add(15 * time.Second)
				for time.Now().Before(deadline) {
					if ld, err := e.Leader(bg()); err == nil && ld.PID != 0 {
						return ld
					}
					time.Sleep(5 * time.Millisecond)
				}
				t.Fatal("no leader for 15 s")
				return sqllock.Leader{}
			}
			// A new leader after each fault, within bound.
			newLeaderAfter := func(what string, bound time.Duration, fault func(sqllock.Leader)) {
				t.Helper()
				// The leader keeps its term until the fault ends it.
				long := filepath.Join(dir, "long")
				os.WriteFile(long, nil, 0o644)
				defer os.Remove(long)
				time.Sleep(100 * time.Millisecond)
				old := leader()
				began := time.Now()
				fault(old)
				deadline := time.Now().Add(bound)
				for time.Now().Before(deadline) {
					if ld, err := e.Leader(bg()); err == nil && ld.PID != 0 && ld.PID != old.PID {
						t.Logf("%s of %v: new leader %v after %v", what, old, ld, time.Since(began).Round(time.Millisecond))
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
				t.Fatalf("%s of %v: no new leader within %v", what, old, bound)
			}
			time.Sleep(time.Second) // terms come and go
			// The candidates' keep-alive (200 ms) and orphan bound (3 s):
			// a dead or cut-off leader's lock is free within the bound.
			const bound = 200*time.Millisecond + 3*time.Second + 2*time.Second
			newLeaderAfter("kill -9", bound, func(old sqllock.Leader) {
				// The leader's process: its value names it; a term may have
				// ended meanwhile, so kill whoever leads by value.
				if p := procs[old.Value]; p != nil {
					p.Process.Signal(syscall.SIGKILL)
					p.Wait()
					delete(procs, old.Value)
					startCandidate(old.Value + "-again")
				}
			})
			newLeaderAfter("pg_terminate_backend", bound, func(old sqllock.Leader) { terminateQuietly(srv.Server, old.PID) })
			newLeaderAfter("network cut of the leader's connection", bound, func(old sqllock.Leader) {
				var port int
				if err := db.QueryRow("SELECT client_port FROM pg_stat_activity WHERE pid = $1", old.PID).Scan(&port); err != nil {
					t.Fatal(err)
				}
				if err := srv.DropFlow(port); err != nil {
					t.Fatal(err)
				}
			})
			if err := srv.Restore(); err != nil {
				t.Fatal(err)
			}
			newLeaderAfter("server restart", 20*time.Second, func(sqllock.Leader) {
				ctx, cancel := context.WithTimeout(bg(), time.Minute)
				defer cancel()
				if err := srv.Restart(ctx); err != nil {
					t.Fatal(err)
				}
			})
			// At least 50 terms in all, the restart among them.
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if b, _ := os.ReadFile(filepath.Join(dir, "terms")); strings.Count(string(b), "start ") >= 50 {
					break
				}
			}
			os.WriteFile(filepath.Join(dir, "stop"), nil, 0o644)

			ostop()
			seen := <-observed
			terms := readTerms(t, filepath.Join(dir, "terms"))
			// The observed leaders are the elected, in the order of their
			// elections (some terms, shorter than 20 ms, unseen).
			var elected []string
			if b, err := os.ReadFile(filepath.Join(dir, "terms")); err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					if v, ok := strings.CutPrefix(line, "elected "); ok {
						elected = append(elected, v)
					}
				}
			}
			j := 0
			for _, v := range seen {
				for j < len(elected) && elected[j] != v {
					j++
				}
				if j == len(elected) {
					t.Errorf("the observer saw %q out of the order of elections (seen: %v; elected: %v)", v, seen, elected)
					break
				}
				j++
			}
			t.Logf("the observer saw %d changes of leader", len(seen))
			if len(terms) < 50 {
				t.Fatalf("%d terms: the election was not exercised", len(terms))
			}
			for i := 1; i < len(terms); i++ {
				prev, cur := terms[i-1], terms[i]
				if cur.token <= prev.token {
					t.Errorf("term %d (%s) token %d after term %d (%s) token %d: tokens must grow", i, cur.value, cur.token, i-1, prev.value, prev.token)
				}
				if !prev.lost && cur.start.Before(prev.end) {
					t.Errorf("term %d (%s) started %v before term %d (%s) ended, not lost", i, cur.value, prev.end.Sub(cur.start), i-1, prev.value)
				}
			}
			t.Logf("%d terms, tokens %d to %d, %d ended by a loss", len(terms), terms[0].token, terms[len(terms)-1].token, countLost(terms))
		})
	}
}

// term is one leadership from the candidates' log.
type term struct {
	value      string
	token      int64
	start, end time.Time
	lost       bool
}

// readTerms reads the candidates' log into terms ordered by start (a term
// with no end, its process killed, ends at the next start).
func readTerms(t *testing.T, path string) []term {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	open := map[string]*term{}
	var terms []*term
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 {
			continue
		}
		tok, _ := strconv.ParseInt(fs[2], 10, 64)
		ns, _ := strconv.ParseInt(fs[3], 10, 64)
		id := fs[1] + " " + fs[2]
		switch fs[0] {
		case "start":
			tm := &term{value: fs[1], token: tok, start: time.Unix(0, ns), lost: true}
			open[id] = tm
			terms = append(terms, tm)
		case "end":
			if tm := open[id]; tm != nil {
				tm.end = time.Unix(0, ns)
				tm.lost = len(fs) > 4 && fs[4] == "true"
			}
		}
	}
	out := make([]term, 0, len(terms))
	for i, tm := range terms {
		if tm.end.IsZero() && i+1 < len(terms) {
			tm.end = terms[i+1].start
		}
		out = append(out, *tm)
	}
	return out
}

func countLost(ts []term) int {
	n := 0
	for _, t := range ts {
		if t.lost {
			n++
		}
	}
	return n
}

// terminateQuietly ends backend pid, if it still exists.
func terminateQuietly(srv *pgtest.Server, pid int) {
	admin, err := srv.Admin()
	if err != nil {
		return
	}
	defer admin.Close()
	admin.Exec("SELECT pg_terminate_backend($1)", pid)
}

// campaigns counts a Locker's lock calls (a Campaign is one) and records
// their errors.
type campaigns struct {
	n    atomic.Int64
	mu   sync.Mutex
	last error // guarded by mu
}

func (c *campaigns) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	c.n.Add(1)
	return func(_ *sqllock.Lock, err error) {
		c.mu.Lock()
		c.last = err
		c.mu.Unlock()
	}
}

func (c *campaigns) Event(context.Context, sqllock.Event) {}

// waitingAs waits until a session waits for k named appName, and returns
// its backend.
func waitingAs(t *testing.T, db *sql.DB, k sqllock.Key, appName string) int {
	t.Helper()
	var seen []sqllock.HeldLock
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		var err error
		if seen, err = sqllock.Inspect(bg(), db, nil, k); err != nil {
			t.Fatal(err)
		}
		for _, h := range seen {
			if !h.Granted && h.ApplicationName == appName {
				return h.PID
			}
		}
	}
	t.Fatalf("no session waits for %v named %q; Inspect: %+v", k, appName, seen)
	return 0
}

// waitingUntil is waitingAs until done has a value: it returns the pid of
// the session that waits for k named appName, or 0 and done's value when
// done came first.
func waitingUntil(t *testing.T, db *sql.DB, k sqllock.Key, appName string, done <-chan error) (int, error) {
	t.Helper()
	for {
		seen, err := sqllock.Inspect(bg(), db, nil, k)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range seen {
			if !h.Granted && h.ApplicationName == appName {
				return h.PID, nil
			}
		}
		select {
		case err := <-done:
			return 0, err
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// appNameOf returns the application_name of backend pid, and whether it
// still exists.
func appNameOf(t *testing.T, db *sql.DB, pid int) (string, bool) {
	t.Helper()
	var name string
	switch err := db.QueryRow("SELECT application_name FROM pg_stat_activity WHERE pid = $1", pid).Scan(&name); {
	case errors.Is(err, sql.ErrNoRows):
		return "", false
	case err != nil:
		t.Fatal(err)
	}
	return name, true
}

// settledAppName is appNameOf once backend pid's session has settled: it
// waits, up to a ceiling generous for a loaded machine, while the backend
// lives with another name than want (a discarded connection's backend
// takes a moment to end; a connection being given back has its settings
// reset first). A session left in the pool with another name keeps it,
// and is reported at the ceiling.
func settledAppName(t *testing.T, db *sql.DB, pid int, want string) (string, bool) {
	t.Helper()
	start := time.Now()
	first, _ := appNameOf(t, db, pid)
	for {
		name, ok := appNameOf(t, db, pid)
		if !ok || name == want || time.Since(start) > 15*time.Second {
			if first != name {
				t.Logf("backend %d showed %q, then %q (alive: %v) %v later", pid, first, name, ok, time.Since(start))
			}
			return name, ok
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestElectionCandidateNamed: a waiting candidate's session carries its
// value (Inspect, hence `sqllock inspect`, shows it), and its connection
// goes back to the pool with the application_name it came with, after the
// candidate led and resigned, and after it gave up waiting.
func TestElectionCandidateNamed(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		const orig = "the-app"
		cands := pgtest.Open(t, driverOf(db), withAppName(t, dsn, orig))
		cands.SetMaxIdleConns(16) // a session given back stays in the pool, where the test looks for it
		k := sqllock.Hash("election:named")
		a := sqllock.New(db).Election(k)
		logs := &capture{}
		b := sqllock.New(cands, sqllock.WithKeepAlive(100*time.Millisecond), sqllock.WithLogger(slog.New(logs))).Election(k)
		ctx, cancel := context.WithTimeout(bg(), time.Minute)
		defer cancel()
		la, err := a.Campaign(ctx, "host-a")
		if err != nil {
			t.Fatal(err)
		}
		elected := make(chan *sqllock.Lock, 1)
		go func() {
			lb, err := b.Campaign(ctx, "host-b")
			if err != nil {
				t.Error(err)
			}
			elected <- lb
		}()
		pid := waitingAs(t, db, k, sqllock.ElectionPrefix+"host-b")
		if ld, err := a.Leader(ctx); err != nil || ld.Value != "host-a" {
			t.Fatalf("Leader() while host-b waits = %v, %v; want host-a", ld, err)
		}
		if err := la.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lb := <-elected
		if lb == nil {
			t.FailNow()
		}
		if lb.PID() != pid {
			t.Fatalf("host-b leads on backend %d, waited on %d", lb.PID(), pid)
		}
		if ld, err := a.Leader(ctx); err != nil || ld.Value != "host-b" {
			t.Fatalf("Leader() = %v, %v; want host-b", ld, err)
		}
		if err := lb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if name, ok := settledAppName(t, db, pid, orig); !ok || name != orig {
			t.Fatalf("after the resignation, the candidate's session: application_name %q (alive: %v), want %q in the pool", name, ok, orig)
		}

		// A candidate that gives up: the server ends its wait just before
		// ctx's deadline, and its session goes back to the pool.
		if la, err = a.Campaign(ctx, "host-a"); err != nil {
			t.Fatal(err)
		}
		defer la.Unlock(bg())
		// A loaded machine can answer later than the margin the server
		// leaves before the deadline (the connection is then discarded,
		// logged): of five attempts, one must go back to the pool.
		// An attempt whose setup and waiting went by before the wait was
		// seen (a loaded machine) tells nothing: it is logged. Each waits
		// two seconds, so that its setup leaves it time to be seen.
		kept := false
		for attempt := 1; attempt <= 5 && !kept; attempt++ {
			gaveUp := make(chan error, 1)
			go func() {
				wctx, stop := context.WithTimeout(ctx, 2*time.Second)
				defer stop()
				_, err := b.Campaign(wctx, "host-c")
				gaveUp <- err
			}()
			pid, err := waitingUntil(t, db, k, sqllock.ElectionPrefix+"host-c", gaveUp)
			if err == nil {
				err = <-gaveUp
			}
			if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Campaign past its deadline = %v, want ErrNotAcquired and DeadlineExceeded", err)
			}
			if pid == 0 {
				t.Logf("attempt %d: the campaign ended before its wait was seen: %v", attempt, err)
				continue
			}
			name, ok := settledAppName(t, db, pid, orig)
			switch {
			case ok && name == orig:
				kept = true
			case ok:
				t.Fatalf("after giving up, the candidate's session: application_name %q, want %q in the pool", name, orig)
			default:
				t.Logf("attempt %d: the candidate's session was discarded after giving up: %q", attempt, logs.reasons("sqllock: connection discarded"))
			}
		}
		if !kept {
			t.Fatalf("after giving up, the candidate's session never went back to the pool in 5 attempts")
		}
	})
}

// driverOf returns the name the tests open db's driver with.
func driverOf(db *sql.DB) string {
	if _, ok := db.Driver().(*pq.Driver); ok {
		return "postgres"
	}
	return "pgx"
}

// TestElectionValues: Campaign (and Lead) take the values its doc allows,
// which the leader's session then carries, and refuse, with ErrInvalidKey
// and before any statement, the others.
func TestElectionValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
		ok          bool
	}{
		{"a host name", "host-a.example.com", true},
		{"spaces", "worker 7 of 9", true},
		{"46 bytes", strings.Repeat("x", 46), true},
		{"every other punctuation", "!#$%&()*+,-./:;<=>?@[]^_`{|}~", true},
		{"empty", "", false},
		{"47 bytes", strings.Repeat("x", 47), false},
		{"a double quote", `say "hi"`, false},
		{"a single quote", "it's", false},
		{"a backslash", `a\b`, false},
		{"a tab", "a\tb", false},
		{"not ASCII", "hôte", false},
		{"DEL", "a\x7f", false},
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		obs := &campaigns{}
		e := sqllock.New(db, sqllock.WithObserver(obs)).Election(sqllock.Hash("election:values"))
		for _, tt := range tests {
			ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
			defer cancel()
			ld, err := e.Campaign(ctx, tt.value)
			if !tt.ok {
				if err == nil {
					ld.Unlock(ctx)
				}
				lerr := e.Lead(ctx, tt.value, func(context.Context, *sqllock.Lock) error { return nil })
				if !errors.Is(err, sqllock.ErrInvalidKey) || !errors.Is(lerr, sqllock.ErrInvalidKey) || obs.n.Load() != 0 {
					t.Errorf("%s: Campaign(%q) = %v, Lead = %v after %d lock calls; want ErrInvalidKey, none", tt.name, tt.value, err, lerr, obs.n.Load())
				}
				obs.n.Store(0)
				continue
			}
			if err != nil {
				t.Errorf("%s: Campaign(%q) = %v, want elected", tt.name, tt.value, err)
				continue
			}
			if got, err := e.Leader(bg()); err != nil || got.Value != tt.value {
				t.Errorf("%s: Leader() = %v, %v; want %q", tt.name, got, err, tt.value)
			}
			if err := ld.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			obs.n.Store(0)
		}
	})
}

// TestLeadBackoff: against a server that does not answer (nothing listens
// on its port), Lead campaigns a few times a second at most, and returns
// when ctx ends with an error that matches ctx's.
func TestLeadBackoff(t *testing.T) {
	t.Parallel()
	port := refusedPort(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		obs := &campaigns{}
		e := sqllock.New(pgtest.Open(t, driverOf(db), u.String()), sqllock.WithObserver(obs)).Election(sqllock.Hash("election:down"))
		const span = 2 * time.Second
		ctx, cancel := context.WithTimeout(bg(), span)
		defer cancel()
		ran := false
		began := time.Now()
		err = e.Lead(ctx, "host-a", func(context.Context, *sqllock.Lock) error { ran = true; return nil })
		took := time.Since(began)
		n := obs.n.Load()
		obs.mu.Lock()
		last := obs.last
		obs.mu.Unlock()
		t.Logf("%d campaigns in %v (%.1f/s); the last failed with: %v", n, took.Round(time.Millisecond), float64(n)/took.Seconds(), last)
		if ran || !errors.Is(err, context.DeadlineExceeded) || took > span+time.Second {
			t.Fatalf("Lead = %v after %v (fn ran: %v), want DeadlineExceeded after %v", err, took, ran, span)
		}
		if n < 2 || n > 6 {
			t.Fatalf("%d campaigns in %v against a server that is down; want 2 to 6 (it retries, a few times a second at most)", n, took)
		}
	})
}

// TestLeadPermanent: Lead returns at once, after one campaign at most, on
// errors that no retry can fix.
func TestLeadPermanent(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		closed := pgtest.Open(t, driverOf(db), dsn)
		closed.Close()
		tests := []struct {
			name  string
			db    *sql.DB
			key   sqllock.Key
			value string
			want  error // nil: any error
			calls int64
		}{
			{"an empty value", db, sqllock.Hash("election:permanent"), "", sqllock.ErrInvalidKey, 0},
			{"a value with a quote", db, sqllock.Hash("election:permanent"), "it's", sqllock.ErrInvalidKey, 0},
			{"the zero Key", db, sqllock.Key{}, "host-a", sqllock.ErrInvalidKey, 0},
			{"a closed *sql.DB", closed, sqllock.Hash("election:permanent"), "host-a", nil, 1},
		}
		for _, tt := range tests {
			obs := &campaigns{}
			e := sqllock.New(tt.db, sqllock.WithObserver(obs)).Election(tt.key)
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			began := time.Now()
			err := e.Lead(ctx, tt.value, func(context.Context, *sqllock.Lock) error { return nil })
			took := time.Since(began)
			ended := ctx.Err() != nil
			cancel()
			if err == nil || tt.want != nil && !errors.Is(err, tt.want) || ended || took > time.Second || obs.n.Load() > tt.calls {
				t.Errorf("%s: Lead = %v after %v and %d lock calls; want %v at once, after %d at most", tt.name, err, took, obs.n.Load(), tt.want, tt.calls)
			}
		}
	})
}

// TestLeadLoss: when the leader's backend is terminated, fn's context ends
// with a cause that wraps ErrLockLost; Lead waits for fn, campaigns again
// and leads again, on another backend.
func TestLeadLoss(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("election:loss")
		obs := &campaigns{}
		e := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond), sqllock.WithObserver(obs)).Election(k)
		ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
		defer cancel()
		started := make(chan int, 2)
		var cause error
		terms := 0
		done := make(chan error, 1)
		go func() {
			done <- e.Lead(ctx, "host-a", func(tctx context.Context, term *sqllock.Lock) error {
				terms++
				started <- term.PID()
				if terms > 1 {
					return nil // done: Lead resigns and returns
				}
				<-tctx.Done()
				cause = context.Cause(tctx)
				return tctx.Err()
			})
		}()
		first := <-started
		killed := time.Now()
		if _, err := db.Exec("SELECT pg_terminate_backend($1)", first); err != nil {
			t.Fatal(err)
		}
		var second int
		select {
		case second = <-started:
		case err := <-done:
			t.Fatalf("Lead = %v after the loss, want it to lead again", err)
		case <-time.After(10 * time.Second):
			t.Fatal("not leading again 10 s after the loss")
		}
		t.Logf("leading again %v after the leader's backend was terminated", time.Since(killed).Round(time.Millisecond))
		if err := <-done; err != nil {
			t.Fatalf("Lead = %v, want nil (fn returned nil)", err)
		}
		if !errors.Is(cause, sqllock.ErrLockLost) {
			t.Fatalf("the lost term's context.Cause = %v, want ErrLockLost", cause)
		}
		if second == first || obs.n.Load() != 2 {
			t.Fatalf("second term on backend %d (first %d) after %d campaigns; want another backend, 2 campaigns", second, first, obs.n.Load())
		}
		if h := holders(t, db, k); len(h) != 0 {
			t.Fatalf("key held by %v after Lead returned", h)
		}

		// A loss that fn meets before it is told (no keep-alive here): a
		// statement on the lost session fails, fn returns its error, the
		// resignation finds the lock gone, and Lead campaigns again.
		k = sqllock.Hash("election:loss-met")
		obs = &campaigns{}
		e = sqllock.New(db, sqllock.WithKeepAlive(0), sqllock.WithObserver(obs)).Election(k)
		terms = 0
		var tokenErr error
		err := e.Lead(ctx, "host-a", func(tctx context.Context, term *sqllock.Lock) error {
			if terms++; terms > 1 {
				return nil
			}
			pid := term.PID()
			if _, err := db.Exec("SELECT pg_terminate_backend($1)", pid); err != nil {
				return err
			}
			for _, alive := appNameOf(t, db, pid); alive; _, alive = appNameOf(t, db, pid) {
				time.Sleep(time.Millisecond)
			}
			_, tokenErr = term.Token(tctx)
			return tokenErr
		})
		if err != nil || terms != 2 || tokenErr == nil || obs.n.Load() != 2 {
			t.Fatalf("Lead = %v after %d terms and %d campaigns (the lost term's Token: %v); want nil after 2 terms, 2 campaigns", err, terms, obs.n.Load(), tokenErr)
		}
	})
}

// TestLeadReturn: when fn returns while leading (nil, an error, after
// resigning itself) or panics, Lead resigns: the key is free as soon as
// Lead returns (or panics), and Lead returns fn's error.
func TestLeadReturn(t *testing.T) {
	t.Parallel()
	errFn := errors.New("fn failed")
	tests := []struct {
		name string
		fn   func(context.Context, *sqllock.Lock) error
		want error // nil: nil
	}{
		{"nil", func(context.Context, *sqllock.Lock) error { return nil }, nil},
		{"an error", func(context.Context, *sqllock.Lock) error { return errFn }, errFn},
		{"resigned by fn", func(ctx context.Context, term *sqllock.Lock) error {
			if err := term.Unlock(ctx); err != nil {
				return err
			}
			<-ctx.Done() // the term's context ends with the resignation
			return nil
		}, nil},
		{"a panic", func(context.Context, *sqllock.Lock) error { panic(errFn) }, errFn},
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("election:return")
		e := sqllock.New(db).Election(k)
		for _, tt := range tests {
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err, _ = r.(error)
					}
				}()
				err = e.Lead(ctx, "host-a", tt.fn)
			}()
			cancel()
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("%s: Lead = %v, want %v", tt.name, err, tt.want)
			}
			if h := holders(t, db, k); len(h) != 0 {
				t.Fatalf("%s: key held by %v right after Lead returned", tt.name, h)
			}
		}
	})
}

// TestLeadContext: when ctx ends while leading, fn's context ends, and
// Lead resigns and returns an error matching context.Canceled; when it
// ends while campaigning, Lead returns one matching context.Canceled and
// ErrNotAcquired, and fn never ran.
func TestLeadContext(t *testing.T) {
	t.Parallel()
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("election:ctx")
		e := sqllock.New(db).Election(k)
		ctx, cancel := context.WithCancel(bg())
		leading := make(chan struct{})
		var fnCause error
		done := make(chan error, 1)
		go func() {
			done <- e.Lead(ctx, "host-a", func(tctx context.Context, _ *sqllock.Lock) error {
				close(leading)
				<-tctx.Done()
				fnCause = context.Cause(tctx)
				return nil
			})
		}()
		<-leading
		cancel()
		err := <-done
		if !errors.Is(err, context.Canceled) || errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(fnCause, context.Canceled) {
			t.Fatalf("Lead after ctx ended while leading = %v (fn's cause %v), want context.Canceled, not ErrNotAcquired", err, fnCause)
		}
		if h := holders(t, db, k); len(h) != 0 {
			t.Fatalf("key held by %v right after Lead returned", h)
		}

		// Campaigning: another candidate leads.
		other, err := sqllock.New(pgtest.Open(t, "pgx", dsn)).Election(k).Campaign(bg(), "host-b")
		if err != nil {
			t.Fatal(err)
		}
		defer other.Unlock(bg())
		ctx, cancel = context.WithCancel(bg())
		go func() {
			done <- e.Lead(ctx, "host-a", func(context.Context, *sqllock.Lock) error {
				t.Error("fn ran while another candidate leads")
				return nil
			})
		}()
		waitingAs(t, db, k, sqllock.ElectionPrefix+"host-a")
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) || !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("Lead after ctx ended while campaigning = %v, want context.Canceled and ErrNotAcquired", err)
		}
	})
}

// TestLeadExactlyOne: candidates in goroutines, each with a Locker of its
// own, Lead one term after another: at most one fn runs at any time.
func TestLeadExactlyOne(t *testing.T) {
	t.Parallel()
	const candidates = 4
	terms := int64(60)
	if testing.Short() {
		terms = 20
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("election:one")
		ctx, cancel := context.WithTimeout(bg(), 30*time.Second)
		defer cancel()
		var running, done atomic.Int64
		var wg sync.WaitGroup
		for i := range candidates {
			e := sqllock.New(db).Election(k)
			wg.Go(func() {
				for done.Load() < terms && ctx.Err() == nil {
					err := e.Lead(ctx, "cand-"+strconv.Itoa(i), func(context.Context, *sqllock.Lock) error {
						if n := running.Add(1); n != 1 {
							t.Errorf("%d fns run at once", n)
						}
						time.Sleep(time.Millisecond)
						running.Add(-1)
						done.Add(1)
						return nil
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		waitGroup(t, &wg, hangCeiling)
		if done.Load() < terms {
			t.Fatalf("%d terms, want %d", done.Load(), terms)
		}
		if h := holders(t, db, k); len(h) != 0 {
			t.Fatalf("key held by %v after every Lead returned", h)
		}
	})
}

// TestElectionLeaderInLockerStats: a candidate is a lock of its Locker, not
// of a Locker of its own: a leader is counted in its Locker's Stats, and
// the Locker's keep-alive reports its term lost when its session ends.
func TestElectionLeaderInLockerStats(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
		ld, err := l.Election(sqllock.Hash("election:stats")).Campaign(bg(), "host-a")
		if err != nil {
			t.Fatal(err)
		}
		if st := l.Stats(); st.Held != 1 || st.Acquired != 1 {
			t.Fatalf("Stats() while leading = %+v, want the term held and acquired", st)
		}
		checks := l.Stats().KeepAliveChecks
		terminateQuietly(srv, ld.PID())
		select {
		case <-ld.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the term's session ended: Done not closed in 10 s")
		}
		if err := ld.Err(); !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Err() after the session ended = %v, want ErrLockLost", err)
		}
		if st := l.Stats(); st.Lost != 1 || st.Held != 0 || st.KeepAliveChecks <= checks {
			t.Fatalf("Stats() after the loss = %+v, want it lost by the Locker's keep-alive, nothing held", st)
		}
	})
}

// refusedPort returns a local TCP port where connections are refused, for
// t's life: a socket bound to it that does not listen. (A port found free
// and given back was taken meanwhile, in a run of many tests, by another
// test's server, which then answered.)
func refusedPort(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*syscall.SockaddrInet4).Port
}
