package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestObserveBriefTerms: with the default keep-alive (5 s), terms of
// 100 ms, with 200 ms without a leader between them, are each reported in
// order: the term's start (its value and backend), then no leader; also
// to an observer of another role, which may not see the candidates'
// sessions' state.
func TestObserveBriefTerms(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		t.Run("same role", func(t *testing.T) {
			briefTerms(t, db, pgtest.Open(t, driverOf(db), dsn), sqllock.Hash("election:brief"))
		})
		t.Run("another role", func(t *testing.T) {
			admin := pgtest.Open(t, driverOf(db), pgtest.Start(t).AdminDSNFor(pgtest.DatabaseOf(dsn)))
			var privileged bool
			if err := db.QueryRow(`SELECT current_setting('is_superuser') = 'on' OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')`).Scan(&privileged); err != nil {
				t.Fatal(err)
			}
			t.Logf("the observer may see the candidates' sessions' state: %v", privileged)
			briefTerms(t, db, admin, sqllock.Hash("election:brief, another role"))
		})
	})
}

// briefTerms runs 5 terms of 100 ms on key k through candidates, 200 ms
// apart (2 with -short), and fails t unless an observer through observers
// reports each.
func briefTerms(t *testing.T, observers, candidates *sql.DB, k sqllock.Key) {
	candidate := sqllock.New(candidates).Election(k)
	ctx, cancel := context.WithTimeout(bg(), time.Minute)
	defer cancel()
	changes := sqllock.New(observers).Election(k).Observe(ctx)
	if first := <-changes; first.PID != 0 {
		t.Fatalf("Observe before any campaign = %v, want no leader", first)
	}
	seen := make(chan []sqllock.Leader, 1)
	terms := 5
	if testing.Short() {
		terms = 2
	}
	go func() {
		var got []sqllock.Leader
		for ld := range changes {
			got = append(got, ld)
			if len(got) == 2*terms {
				break
			}
		}
		seen <- got
	}()
	want := make([]string, 0, 2*terms)
	for i := range terms {
		value := fmt.Sprintf("brief-%d", i)
		term, err := candidate.Campaign(ctx, value)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%q (backend %d)", value, term.PID()), "no leader")
		time.Sleep(100 * time.Millisecond)
		if err := term.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var got []sqllock.Leader
	select {
	case got = <-seen:
	case <-time.After(5 * time.Second):
		// Observe missed a change: what it saw is reported below.
		cancel()
		got = <-seen
	}
	var gotS []string
	for _, ld := range got {
		gotS = append(gotS, ld.String())
	}
	if !slices.Equal(gotS, want) {
		t.Fatalf("Observe reported\n\t%s\nwant\n\t%s", strings.Join(gotS, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// TestObserveKilledLeader: a leader in another process, killed with
// SIGKILL, is reported gone within a second, with the default keep-alive
// (5 s): its kernel closes its connection, the server ends its session at
// once, and Observe asks every 20 ms. The second covers a loaded machine.
func TestObserveKilledLeader(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("election:killed")
		ctx, cancel := context.WithTimeout(bg(), time.Minute)
		defer cancel()
		changes := sqllock.New(db).Election(k).Observe(ctx)
		for round := range 2 {
			value := fmt.Sprintf("doomed-%d", round)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=leader", "HELPER_DRIVER="+driverOf(db), "HELPER_DSN="+dsn,
				"HELPER_KEY="+k.String(), "HELPER_VALUE="+value)
			cmd.Stderr = os.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- waitHelper(cmd, helperCeiling) }()
			var leader sqllock.Leader
			for leader.Value != value {
				select {
				case leader = <-changes:
				case err := <-exited:
					t.Fatalf("the candidate process exited (%v) before it was reported leading", err)
				case <-time.After(30 * time.Second):
					cmd.Process.Kill()
					t.Fatalf("the candidate process was not reported leading within 30 s (last: %v)", leader)
				}
			}
			killed := time.Now()
			cmd.Process.Signal(syscall.SIGKILL)
			<-exited
			const bound = time.Second
			select {
			case ld := <-changes:
				if d := time.Since(killed); ld.PID != 0 || d > bound {
					t.Fatalf("after the leader %v was killed, Observe reported %v after %v; want no leader within %v", leader, ld, d, bound)
				}
				t.Logf("killed leader %v reported gone after %v", leader, time.Since(killed).Round(time.Millisecond))
			case <-time.After(bound):
				t.Fatalf("the leader %v was killed, and Observe still reported it after %v", leader, bound)
			}
		}
	})
}

// helperLeader campaigns for the key in HELPER_KEY with value, and holds
// the leadership until it is killed (or for a minute).
func helperLeader(db *sql.DB, value string) int {
	k, err := sqllock.ParseKey(os.Getenv("HELPER_KEY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	term, err := sqllock.New(db).Election(k).Campaign(ctx, value)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	<-ctx.Done()
	term.Unlock(context.Background())
	return 0
}

// TestObserveSlowConsumer: a consumer that reads nothing while terms
// come and go then receives every change, in order.
func TestObserveSlowConsumer(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("election:slow consumer")
		candidate := sqllock.New(pgtest.Open(t, driverOf(db), dsn)).Election(k)
		ctx, cancel := context.WithTimeout(bg(), time.Minute)
		defer cancel()
		changes := sqllock.New(db).Election(k).Observe(ctx)
		if first := <-changes; first.PID != 0 {
			t.Fatalf("Observe before any campaign = %v, want no leader", first)
		}
		// Each term, and each gap after it, lasts until a poll of the
		// observer's ran whole within it (as pg_stat_activity shows it),
		// however late a loaded machine runs the polls.
		admin := pgtest.Open(t, "pgx", dsn)
		polled := func(what string) {
			t.Helper()
			var since time.Time
			if err := admin.QueryRow("SELECT clock_timestamp()").Scan(&since); err != nil {
				t.Fatal(err)
			}
			waitFor(t, what, func() bool {
				var n int
				err := admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
					AND query LIKE '/* sqllock: election */%' AND state = 'idle' AND query_start > $1`, since).Scan(&n)
				return err == nil && n > 0
			})
		}
		var want []string
		for i := range 3 {
			value := fmt.Sprintf("unread-%d", i)
			term, err := candidate.Campaign(ctx, value)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, fmt.Sprintf("%q (backend %d)", value, term.PID()), "no leader")
			polled("a poll during the term")
			if err := term.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			polled("a poll after the term")
		}
		var got []string
		for len(got) < len(want) {
			select {
			case ld := <-changes:
				got = append(got, ld.String())
			case <-time.After(5 * time.Second):
				t.Fatalf("the late consumer received\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("the late consumer received\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
		}
	})
}

// TestObserveHeldByHand: a lock on the key taken by hand, by a session
// that is no candidate (its name does not change), is reported within
// the second Observe documents, as a leader without a value, and so is
// its release.
func TestObserveHeldByHand(t *testing.T) {
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Int64(4245)
		ctx, cancel := context.WithTimeout(bg(), time.Minute)
		defer cancel()
		changes := sqllock.New(db).Election(k).Observe(ctx)
		if first := <-changes; first.PID != 0 {
			t.Fatalf("Observe before any lock = %v, want no leader", first)
		}
		conn, err := pgtest.Open(t, driverOf(db), dsn).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		var pid int
		if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid() FROM pg_advisory_lock(4245)").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		const bound = time.Second + time.Second // the recheck, and a loaded machine
		expect := func(what string, want sqllock.Leader) {
			t.Helper()
			began := time.Now()
			select {
			case ld := <-changes:
				if ld.PID != want.PID || ld.Value != want.Value {
					t.Fatalf("%s: Observe = %v, want %v", what, ld, want)
				}
				t.Logf("%s: reported after %v", what, time.Since(began).Round(time.Millisecond))
			case <-time.After(bound):
				t.Fatalf("%s: not reported within %v", what, bound)
			}
		}
		expect("taken by hand", sqllock.Leader{PID: pid})
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock(4245)"); err != nil {
			t.Fatal(err)
		}
		expect("released", sqllock.Leader{})
	})
}
