package sqllock_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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
		if ld, err := b.Leader(ctx); err != nil || ld.Value != "host-a" || ld.PID != la.Lock().PID() {
			t.Fatalf("Leader() = %v, %v; want host-a on backend %d", ld, err, la.Lock().PID())
		}
		if ch := <-changes; ch.Value != "host-a" {
			t.Fatalf("Observe = %v, want host-a", ch)
		}
		tokA, err := la.Token(ctx)
		if err != nil || tokA <= 0 {
			t.Fatalf("Token() = %d, %v", tokA, err)
		}
		elected := make(chan *sqllock.Leadership, 1)
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
		if err := la.Resign(bg()); err != nil {
			t.Fatal(err)
		}
		lb := <-elected
		if lb == nil {
			t.FailNow()
		}
		defer lb.Resign(bg())
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
		locks, err := sqllock.Inspect(bg(), db, sqllock.WithKeys(k))
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

// helperCandidate campaigns in a loop: each term it logs "start VALUE TOKEN
// UNIXNANO", holds the leadership for a moment (or until it is lost),
// resigns, logs "end VALUE TOKEN UNIXNANO LOST" (the time before the
// resignation; LOST: the server had already taken the lock), and campaigns
// again, until the stop file exists.
func helperCandidate(db *sql.DB, dir, value string) int {
	l := sqllock.New(db, sqllock.WithKeepAlive(200*time.Millisecond), sqllock.WithOrphanBound(3*time.Second))
	e := l.Election(sqllock.Hash("election:failover"))
	log, err := os.OpenFile(filepath.Join(dir, "terms"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer log.Close()
	for {
		if _, err := os.Stat(filepath.Join(dir, "stop")); err == nil {
			return 0
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ld, err := e.Campaign(ctx, value)
		cancel()
		if err != nil {
			continue // not elected in time, or the server restarting: campaign again
		}
		fmt.Fprintf(log, "elected %s\n", value)
		tctx, tcancel := context.WithTimeout(context.Background(), 2*time.Second)
		tok, err := ld.Token(tctx)
		tcancel()
		if err != nil {
			ld.Resign(context.Background())
			continue
		}
		fmt.Fprintf(log, "start %s %d %d\n", value, tok, time.Now().UnixNano())
		// A term lasts 30 ms, or, while the file "long" exists (the test
		// is about to hurt the leader), until it is lost.
		for held := true; held; {
			select {
			case <-ld.Done():
				held = false
			case <-time.After(30 * time.Millisecond):
				_, err := os.Stat(filepath.Join(dir, "long"))
				held = err == nil
			}
		}
		end := time.Now()
		// Lost by the server's account: the keep-alive found it gone, or
		// the unlock found nothing to release.
		lost := ld.Err() != nil
		if err := ld.Resign(context.Background()); errors.Is(err, sqllock.ErrLockLost) {
			lost = true
		}
		fmt.Fprintf(log, "end %s %d %d %v\n", value, tok, end.UnixNano(), lost)
	}
}

// TestElectionFailover: five candidate processes elect one leader after
// another; a leader killed with SIGKILL, a leader's backend terminated, a
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
