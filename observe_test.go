package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
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
// sessions' state. A term, or a time without a leader, is sure to be
// reported when one of Observe's readings of the holder ran whole within
// it (Observe's doc: a stall of the observer as long as the term hides
// it, which a loaded machine makes): each such one is, and nothing is
// reported that did not happen, in an order that did not happen.
func TestObserveBriefTerms(t *testing.T) {
	asks := observeAsks(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		t.Run("same role", func(t *testing.T) {
			briefTerms(t, asks, db, pgtest.Open(t, driverOf(db), dsn), sqllock.Hash("election:brief "+driverOf(db)))
		})
		t.Run("another role", func(t *testing.T) {
			admin := pgtest.Open(t, driverOf(db), pgtest.Start(t).AdminDSNFor(pgtest.DatabaseOf(dsn)))
			var privileged bool
			if err := db.QueryRow(`SELECT current_setting('is_superuser') = 'on' OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')`).Scan(&privileged); err != nil {
				t.Fatal(err)
			}
			t.Logf("the observer may see the candidates' sessions' state: %v", privileged)
			briefTerms(t, asks, db, admin, sqllock.Hash("election:brief, another role "+driverOf(db)))
		})
	})
}

// briefTerms runs terms of 100 ms on key k through candidates, 200 ms
// apart, until 5 of them (2 with -short) had a reading of the holder by
// an observer through observers run whole within them (asks: see
// observeAsks), and fails t unless the observer reports what it must (see
// TestObserveBriefTerms).
func briefTerms(t *testing.T, asks func(sqllock.Key) []observeAsk, observers, candidates *sql.DB, k sqllock.Key) {
	candidate := sqllock.New(candidates).Election(k)
	ctx, cancel := context.WithTimeout(bg(), time.Minute)
	defer cancel()
	changes := sqllock.New(observers).Election(k).Observe(ctx)
	if first := <-changes; first.PID != 0 {
		t.Fatalf("Observe before any campaign = %v, want no leader", first)
	}
	var mu sync.Mutex
	var got []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ld := range changes {
			mu.Lock()
			got = append(got, ld.String())
			mu.Unlock()
		}
	}()
	// A phase is a term or a time without a leader: what Observe reports
	// of it, and when it began and ended.
	type phase struct {
		what     string
		from, to time.Time
	}
	// readWithin reports whether a reading of the holder ran whole within p.
	readWithin := func(p phase) bool {
		return slices.ContainsFunc(asks(k), func(a observeAsk) bool {
			return a.read && !a.sent.Before(p.from) && !a.answered.After(p.to)
		})
	}
	terms := 5
	if testing.Short() {
		terms = 2
	}
	var all []phase
	read := 0
	for i := 0; read < terms; i++ {
		if i == 10*terms {
			t.Fatalf("in %d terms of 100 ms, %d had a reading of the holder run whole within them, want %d: the observer's asks (one every 20 ms) stalled", i, read, terms)
		}
		value := fmt.Sprintf("brief-%d", i)
		term, err := candidate.Campaign(ctx, value)
		if err != nil {
			t.Fatal(err)
		}
		p := phase{what: fmt.Sprintf("%q (backend %d)", value, term.PID()), from: time.Now()}
		time.Sleep(100 * time.Millisecond)
		p.to = time.Now()
		if err := term.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		gap := phase{what: "no leader", from: time.Now()}
		time.Sleep(200 * time.Millisecond)
		gap.to = time.Now()
		all = append(all, p, gap)
		if readWithin(p) {
			read++
		}
	}
	// The last time without a leader lasts until a reading ran whole
	// within it, and Observe reported it.
	last := &all[len(all)-1]
	waitFor(t, "a reading after the last term", func() bool {
		last.to = time.Now()
		return readWithin(*last)
	})
	waitFor(t, "no leader reported after the last term", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == "no leader"
	})
	cancel()
	<-done
	var want, happened []string
	for _, p := range all {
		happened = append(happened, p.what)
		if readWithin(p) {
			want = append(want, p.what)
		}
	}
	if !isSubsequence(want, got) || !isSubsequence(got, happened) {
		t.Fatalf("Observe reported\n\t%s\nwant, of\n\t%s\n(in order), at least those with a reading run whole within them\n\t%s",
			strings.Join(got, "\n\t"), strings.Join(happened, "\n\t"), strings.Join(want, "\n\t"))
	}
	t.Logf("%d terms; %d of %d terms and times without a leader had a reading run whole within them; %d reported", len(all)/2, len(want), len(all), len(got))
}

// isSubsequence reports whether sub's elements are found in seq, in order.
func isSubsequence(sub, seq []string) bool {
	i := 0
	for _, s := range seq {
		if i < len(sub) && sub[i] == s {
			i++
		}
	}
	return i == len(sub)
}

// TestObserveKilledLeader: a leader in another process, killed with
// SIGKILL, is reported gone as soon as its server session has ended, with
// the default keep-alive (5 s): its kernel closes its connection, the
// server ends its session at once (within 30 s, for a loaded machine:
// waited for, and its time logged), and Observe reports no leader by its
// first ask sent after the session was gone (or one in flight then).
// Counted in Observe's asks, not by a clock, which a loaded machine runs
// late.
func TestObserveKilledLeader(t *testing.T) {
	asks := observeAsks(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		watch := pgtest.Open(t, "pgx", dsn)
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
			var gone time.Time
			for deadline := killed.Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				var n int
				if err := watch.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", leader.PID).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					gone = time.Now()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the killed leader's session (backend %d) still there 30 s after the kill", leader.PID)
				}
			}
			var ld sqllock.Leader
			select {
			case ld = <-changes:
			case <-ctx.Done():
				t.Fatalf("the leader %v was killed, and Observe did not report it gone in a minute", leader)
			}
			recv := time.Now()
			if ld.PID != 0 {
				t.Fatalf("after the leader %v was killed, Observe reported %v; want no leader", leader, ld)
			}
			// One sent after the session was gone must be the first ask
			// sent since (the candidates' digest changed as it went).
			if r := reportedBy(asks(k), gone, recv); r > sqllock.LeaderRetries {
				t.Fatalf("the killed leader %v reported gone by the ask %d sent since its session was gone, want by the first", leader, r+1)
			}
			t.Logf("killed leader %v: session gone after %v, reported gone after %v", leader,
				gone.Sub(killed).Round(time.Millisecond), recv.Sub(killed).Round(time.Millisecond))
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
// that is no candidate (its name does not change), is reported, as a
// leader without a value, by the first reading of the holder that
// Observe sends once it is taken, within the recheck Observe documents:
// at most a second's asks (one every 20 ms) after it; and so is its
// release. Counted in Observe's asks, not by a clock, which a loaded
// machine runs late.
func TestObserveHeldByHand(t *testing.T) {
	asks := observeAsks(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		n := int64(4245) // a key of each driver's own: asks are told by key
		if driverOf(db) == "pgx" {
			n++
		}
		k := sqllock.Int64(n)
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
		if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid() FROM pg_advisory_lock($1)", n).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		// Within the recheck: a reading every second, and an ask every
		// 20 ms at most, so at most 50 asks sent before the reading, which
		// reads again, at once, a holder whose session is not named yet
		// (this one's never is).
		const most = int(time.Second/(20*time.Millisecond)) + 1 + sqllock.LeaderRetries
		expect := func(what string, want sqllock.Leader, since time.Time) {
			t.Helper()
			select {
			case ld := <-changes:
				if ld.PID != want.PID || ld.Value != want.Value {
					t.Fatalf("%s: Observe = %v, want %v", what, ld, want)
				}
			case <-ctx.Done():
				t.Fatalf("%s: not reported in a minute (asks since: %d)", what, len(asksSince(asks(k), since)))
			}
			after := asksSince(asks(k), since)
			i := slices.IndexFunc(after, func(a observeAsk) bool { return a.read })
			if i < 0 {
				t.Fatalf("%s: reported with no reading of the holder sent since", what)
			}
			if after[i].holder != want.PID {
				t.Errorf("%s: the first reading sent since saw backend %d, want %d", what, after[i].holder, want.PID)
			}
			if i+1 > most {
				t.Errorf("%s: reported by the %dth ask sent since, want within %d (a second's)", what, i+1, most)
			}
			t.Logf("%s: reported by the ask %d sent since, %v after", what, i+1, after[i].answered.Sub(since).Round(time.Millisecond))
		}
		expect("taken by hand", sqllock.Leader{PID: pid}, time.Now())
		released := time.Now()
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", n); err != nil {
			t.Fatal(err)
		}
		expect("released", sqllock.Leader{}, released)
	})
}

// observeAsk is one of an election observer's answered asks (see
// sqllock.SetObserveAsked): when it was sent and answered, whether it
// counts as a reading of the key's holder, and that holder's backend (0:
// none).
type observeAsk struct {
	sent, answered time.Time
	read           bool
	holder         int
}

// observeAsks records the answered asks of every election observer, by
// key, until t ends; asks(k) returns those on k so far, in order.
func observeAsks(t *testing.T) (asks func(k sqllock.Key) []observeAsk) {
	var mu sync.Mutex
	m := map[string][]observeAsk{}
	t.Cleanup(sqllock.SetObserveAsked(func(key string, sent time.Time, read bool, holder int64) {
		a := observeAsk{sent: sent, answered: time.Now(), read: read, holder: int(holder)}
		mu.Lock()
		m[key] = append(m[key], a)
		mu.Unlock()
	}))
	return func(k sqllock.Key) []observeAsk {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(m[k.String()])
	}
}

// reportedBy returns the index, among the asks of as sent at or after
// since, of the reading that made a report received at recv: the last
// reading answered by then (-1: one sent before since).
func reportedBy(as []observeAsk, since, recv time.Time) int {
	r := -1
	for j, a := range asksSince(as, since) {
		if a.read && !a.answered.After(recv) {
			r = j
		}
	}
	return r
}

// asksSince returns the asks of as sent at or after since.
func asksSince(as []observeAsk, since time.Time) []observeAsk {
	i := slices.IndexFunc(as, func(a observeAsk) bool { return !a.sent.Before(since) })
	if i < 0 {
		return nil
	}
	return as[i:]
}
