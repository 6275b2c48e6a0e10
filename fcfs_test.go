package sqllock_test

// First come, first served across processes: waiters of separate OS
// processes (this test binary, re-executed) are served in the order they
// arrived by the server's clock (their tickets' order, which the trials
// read in the server), whatever their drivers, for Lock, an election's
// candidates and a semaphore's permits.

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// lineWaiter is one waiter process of a trial: when it called (arrived)
// and when it was granted, by this machine's clock.
type lineWaiter struct {
	i               int // its index among the trial's waiters
	called, granted time.Time
	cmd             *exec.Cmd
	lines           chan string
	exited          chan error
}

// lineTrial starts n waiter processes (role "line") of mode (lock, sem,
// campaign) on key (a semaphore's name for sem), which call at the given
// offsets from a moment a little ahead (each connects first), hold what
// they are granted for hold, then release it and exit.
type lineTrial struct {
	t       *testing.T
	waiters []*lineWaiter
	// line is the waiters' indexes in the order of their tickets in the
	// key's line (see inLine): the order they arrived by the server's
	// clock, which is the order the line promises. nil: not read; the
	// order they called by this machine's clock stands for it.
	line []int
}

// lineName is the application_name of waiter i's sessions: how the trial
// tells its tickets in the server apart.
func lineName(i int) string { return lineNamePrefix + strconv.Itoa(i) }

const lineNamePrefix = "sqllock-line-w"

func startLine(t *testing.T, drv, dsn, mode, key string, at []time.Duration, hold time.Duration, env ...string) *lineTrial {
	t.Helper()
	// The waiters call from a moment far enough ahead for every process
	// to start and connect, on a loaded machine too.
	base := time.Now().Add(1500 * time.Millisecond)
	tr := &lineTrial{t: t}
	for i, d := range at {
		w := &lineWaiter{i: i, lines: make(chan string, 8), exited: make(chan error, 1)}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=line", "HELPER_DRIVER="+drv, "HELPER_DSN="+withAppName(t, dsn, lineName(i)),
			"HELPER_MODE="+mode, "HELPER_KEY="+key, "HELPER_VALUE=w"+strconv.Itoa(i),
			"HELPER_AT="+strconv.FormatInt(base.Add(d).UnixNano(), 10), "HELPER_HOLD="+hold.String())
		cmd.Env = append(cmd.Env, env...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		w.cmd = cmd
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				w.lines <- sc.Text()
			}
			close(w.lines)
			w.exited <- waitHelper(cmd, helperCeiling)
		}()
		t.Cleanup(func() { cmd.Process.Kill() })
		tr.waiters = append(tr.waiters, w)
	}
	return tr
}

// expect reads w's next line, which must start with word, and returns the
// time it carries.
func (tr *lineTrial) expect(w *lineWaiter, word string, within time.Duration) time.Time {
	tr.t.Helper()
	select {
	case l, ok := <-w.lines:
		f := strings.Fields(l)
		if !ok || len(f) != 2 || f[0] != word {
			tr.t.Fatalf("waiter %d said %q (open %v), want %q and a time", w.i, l, ok, word)
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			tr.t.Fatal(err)
		}
		return time.Unix(0, ns)
	case <-time.After(within):
		tr.t.Fatalf("waiter %d did not say %q within %v", w.i, word, within)
	}
	return time.Time{}
}

// arrived waits until every waiter has called.
func (tr *lineTrial) arrived() {
	tr.t.Helper()
	for _, w := range tr.waiters {
		w.called = tr.expect(w, "called", 30*time.Second)
	}
}

// inLine reads, in the server (db, a session of the trial's database),
// the order of the waiters' tickets in k's line, once each waits: the
// order they arrived by the server's clock, which the line serves them
// in. A waiter's call reaches the server some time after it says
// "called": on a loaded machine, after a later caller's. Each waiter must
// hold one ticket.
func (tr *lineTrial) inLine(db *sql.DB, k sqllock.Key) {
	tr.t.Helper()
	names := testkit.LineOrder(tr.t, db, k)
	tr.line = nil
	seen := map[int]bool{}
	for _, n := range names {
		// A candidate names its session after its value (w and its
		// index) as it campaigns.
		digits, ok := strings.CutPrefix(n, lineNamePrefix)
		if !ok {
			digits, ok = strings.CutPrefix(n, "sqllock-election:w")
		}
		i, err := strconv.Atoi(digits)
		if !ok || err != nil || i < 0 || i >= len(tr.waiters) || seen[i] {
			tr.t.Fatalf("tickets in the line of %v held by %q: want one for each of the %d waiters", k, names, len(tr.waiters))
		}
		seen[i] = true
		tr.line = append(tr.line, i)
	}
	if len(tr.line) != len(tr.waiters) {
		tr.t.Fatalf("tickets in the line of %v held by %q: want one for each of the %d waiters", k, names, len(tr.waiters))
	}
}

// inPlace returns the waiter at place (from 0) in line (see inLine), else
// the one that called at that place.
func (tr *lineTrial) inPlace(place int) *lineWaiter {
	if tr.line != nil {
		return tr.waiters[tr.line[place]]
	}
	return tr.waiters[place]
}

// served waits until every waiter but those in skip was granted and
// exited, and returns the waiters' indexes in the order they arrived and
// in the order they were granted. The order they arrived is their order in
// line when inLine read it, else the order they called.
func (tr *lineTrial) served(skip ...int) (arrival, grants []int) {
	tr.t.Helper()
	var ws []*lineWaiter
	for _, w := range tr.waiters {
		if slices.Contains(skip, w.i) {
			continue
		}
		w.granted = tr.expect(w, "granted", time.Minute)
		if err := <-w.exited; err != nil {
			tr.t.Fatalf("waiter %d: %v", w.i, err)
		}
		ws = append(ws, w)
	}
	byCall := slices.Clone(ws)
	sort.Slice(byCall, func(a, b int) bool { return byCall[a].called.Before(byCall[b].called) })
	byGrant := slices.Clone(ws)
	sort.Slice(byGrant, func(a, b int) bool { return byGrant[a].granted.Before(byGrant[b].granted) })
	var called []int
	for _, w := range byCall {
		called = append(called, w.i)
	}
	arrival = called
	if tr.line != nil {
		arrival = nil
		for _, i := range tr.line {
			if !slices.Contains(skip, i) {
				arrival = append(arrival, i)
			}
		}
		if !slices.Equal(arrival, called) {
			tr.t.Logf("the waiters called in the order %v and took their places in line in the order %v", called, arrival)
		}
	}
	for _, w := range byGrant {
		grants = append(grants, w.i)
	}
	return arrival, grants
}

// outOfOrder returns how many pairs of grants are out of arrival order.
func outOfOrder(arrival, grants []int) int {
	rank := map[int]int{}
	for r, i := range arrival {
		rank[i] = r
	}
	n := 0
	for a := range grants {
		for b := a + 1; b < len(grants); b++ {
			if rank[grants[a]] > rank[grants[b]] {
				n++
			}
		}
	}
	return n
}

// helperLine is a waiter of a trial (see startLine): it connects, waits
// until HELPER_AT, says "called T", takes HELPER_KEY as HELPER_MODE says,
// says "granted T", holds it HELPER_HOLD, and releases it. With
// HELPER_TXPOOLER set, its Locker is made WithTransactionPooler.
func helperLine(db *sql.DB) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "line waiter:", err); return 2 }
	at, err := strconv.ParseInt(os.Getenv("HELPER_AT"), 10, 64)
	if err != nil {
		return fail(err)
	}
	hold, err := time.ParseDuration(os.Getenv("HELPER_HOLD"))
	if err != nil {
		return fail(err)
	}
	key := os.Getenv("HELPER_KEY")
	var opts []sqllock.Option
	if b := os.Getenv("HELPER_BOUND"); b != "" {
		d, err := time.ParseDuration(b)
		if err != nil {
			return fail(err)
		}
		opts = append(opts, sqllock.WithOrphanBound(d))
	}
	if os.Getenv("HELPER_TXPOOLER") != "" {
		opts = append(opts, sqllock.WithTransactionPooler())
	}
	l := sqllock.New(db, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Connected, and the server checked, before the call.
	if err := db.PingContext(ctx); err != nil {
		return fail(err)
	}
	warm, err := l.TryLock(ctx, sqllock.Hash("line warm-up "+strconv.Itoa(os.Getpid())))
	if err != nil {
		return fail(err)
	}
	warm.Unlock(ctx)
	time.Sleep(time.Until(time.Unix(0, at)))
	fmt.Println("called", time.Now().UnixNano())
	var release func() error
	switch os.Getenv("HELPER_MODE") {
	case "lock":
		lk, err := l.Lock(ctx, sqllock.Hash(key))
		if err != nil {
			return fail(err)
		}
		release = func() error { return lk.Unlock(ctx) }
	case "sem":
		lk, err := l.Semaphore(key, 2).Acquire(ctx)
		if err != nil {
			return fail(err)
		}
		release = func() error { return lk.Unlock(ctx) }
	case "campaign":
		lk, err := l.Election(sqllock.Hash(key)).Campaign(ctx, os.Getenv("HELPER_VALUE"))
		if err != nil {
			return fail(err)
		}
		release = func() error { return lk.Unlock(ctx) }
	default:
		return fail(fmt.Errorf("unknown mode %q", os.Getenv("HELPER_MODE")))
	}
	fmt.Println("granted", time.Now().UnixNano())
	time.Sleep(hold)
	if err := release(); err != nil {
		return fail(err)
	}
	return 0
}

// apart returns n offsets d apart.
func apart(n int, d time.Duration) []time.Duration {
	at := make([]time.Duration, n)
	for i := range at {
		at[i] = time.Duration(i) * d
	}
	return at
}

// TestLineLockArrivalOrder: five waiter processes arriving 300 ms apart on
// a key held by this process are served in arrival order (by the server's
// clock: their places in line; see inLine), every trial (4 per driver; 2
// in the quick run).
func TestLineLockArrivalOrder(t *testing.T) {
	long(t)
	trials := 4
	if testkit.Short() {
		trials = 2
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		holder := sqllock.New(db)
		for trial := range trials {
			key := fmt.Sprintf("line lock %d", trial)
			lk, err := holder.Lock(bg(), sqllock.Hash(key))
			if err != nil {
				t.Fatal(err)
			}
			tr := startLine(t, driverOf(db), dsn, "lock", key, apart(5, 300*time.Millisecond), 20*time.Millisecond)
			tr.arrived()
			testkit.WaitWaiters(t, db, sqllock.Hash(key), 5)
			tr.inLine(db, sqllock.Hash(key))
			time.Sleep(100 * time.Millisecond)
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			arrival, grants := tr.served()
			t.Logf("trial %d: arrived %v, served %v", trial, arrival, grants)
			if !slices.Equal(arrival, grants) {
				t.Errorf("trial %d: arrived %v, served %v", trial, arrival, grants)
			}
		}
	})
}

// TestLineRandomArrivals: six waiter processes arriving 50 to 250 ms apart
// (at random) are served in the order they arrived by the server's clock
// (their places in line), every trial: 5 per driver (2 in the quick run).
// On a loaded machine a process calls late, or its call reaches the
// server after a later one's: its place in line, not its clock, says
// when it arrived.
func TestLineRandomArrivals(t *testing.T) {
	long(t)
	trials := 5
	if testkit.Short() {
		trials = 2
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		holder := sqllock.New(db)
		r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 39))
		bad, pairs := 0, 0
		for trial := range trials {
			key := fmt.Sprintf("line random %d", trial)
			lk, err := holder.Lock(bg(), sqllock.Hash(key))
			if err != nil {
				t.Fatal(err)
			}
			at := make([]time.Duration, 6)
			for i := 1; i < len(at); i++ {
				at[i] = at[i-1] + time.Duration(50+r.IntN(201))*time.Millisecond
			}
			tr := startLine(t, driverOf(db), dsn, "lock", key, at, 20*time.Millisecond)
			tr.arrived()
			testkit.WaitWaiters(t, db, sqllock.Hash(key), 6)
			tr.inLine(db, sqllock.Hash(key))
			time.Sleep(time.Duration(r.IntN(300)) * time.Millisecond)
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			arrival, grants := tr.served()
			n := outOfOrder(arrival, grants)
			bad, pairs = bad+n, pairs+15
			t.Logf("trial %d: gaps %v; arrived %v, served %v: %d pairs out of order", trial, at, arrival, grants, n)
		}
		t.Logf("%d of %d pairs out of arrival order", bad, pairs)
		if bad > 0 {
			t.Errorf("%d of %d pairs out of arrival order, want none", bad, pairs)
		}
	})
}

// TestLineSemaphore: with a semaphore of 2 held by this process, six
// waiter processes arriving 300 ms apart are each granted within one
// place of their arrival rank, as the permits are given back one by one.
func TestLineSemaphore(t *testing.T) {
	long(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		const name = "line semaphore"
		sem := sqllock.New(db).Semaphore(name, 2)
		var held []*sqllock.Lock
		for range 2 {
			lk, err := sem.Acquire(bg())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, lk)
		}
		tr := startLine(t, driverOf(db), dsn, "sem", name, apart(6, 300*time.Millisecond), 100*time.Millisecond)
		tr.arrived()
		time.Sleep(200 * time.Millisecond)
		for _, lk := range held {
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(30 * time.Millisecond)
		}
		arrival, grants := tr.served()
		t.Logf("arrived %v, granted %v", arrival, grants)
		rank := map[int]int{}
		for r, i := range arrival {
			rank[i] = r
		}
		for place, i := range grants {
			if d := place - rank[i]; d < -1 || d > 1 {
				t.Errorf("waiter %d arrived %d-th and was granted %d-th (from 0)", i, rank[i], place)
			}
		}
	})
}

// TestLineElection: three candidate processes campaigning 300 ms apart
// while another leads are elected in campaign order (their places in
// line) after the leader
// resigns, and after its process is killed with -9: 3 of 3 trials each,
// per driver.
func TestLineElection(t *testing.T) {
	long(t)
	trials := 3
	if testkit.Short() {
		trials = 1
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		for _, how := range []string{"resigns", "is killed"} {
			for trial := range trials {
				key := fmt.Sprintf("line election %s %d", how, trial)
				var resign func()
				if how == "resigns" {
					term, err := sqllock.New(db).Election(sqllock.Hash(key)).Campaign(bg(), "leader")
					if err != nil {
						t.Fatal(err)
					}
					resign = func() {
						if err := term.Unlock(bg()); err != nil {
							t.Fatal(err)
						}
					}
				} else {
					resign = leaderProcess(t, driverOf(db), dsn, sqllock.Hash(key))
				}
				tr := startLine(t, driverOf(db), dsn, "campaign", key, apart(3, 300*time.Millisecond), 50*time.Millisecond)
				tr.arrived()
				testkit.WaitWaiters(t, db, sqllock.Hash(key), 3)
				tr.inLine(db, sqllock.Hash(key))
				time.Sleep(100 * time.Millisecond)
				resign()
				arrival, grants := tr.served()
				t.Logf("leader %s, trial %d: campaigned %v, elected %v", how, trial, arrival, grants)
				if !slices.Equal(arrival, grants) {
					t.Errorf("leader %s, trial %d: campaigned %v, elected %v", how, trial, arrival, grants)
				}
			}
		}
	})
}

// leaderProcess starts a process that leads the election of k (role
// leader), and returns the function that kills it with SIGKILL.
func leaderProcess(t *testing.T, drv, dsn string, k sqllock.Key) func() {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=leader", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn,
		"HELPER_KEY="+k.String(), "HELPER_VALUE=doomed")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	db, err := sql.Open(drv, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ld, err := sqllock.New(db).Election(k).Leader(bg())
		if err != nil {
			t.Fatal(err)
		}
		if ld.Value == "doomed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader process did not lead within 30 s")
		}
	}
	return func() { cmd.Process.Signal(syscall.SIGKILL) }
}

// TestLineKilledWaiter: the first of three waiter processes in line, killed
// with -9 while it waits, delays the others by less than the orphan bound:
// once the holder releases, the second in line is granted, then the third.
func TestLineKilledWaiter(t *testing.T) {
	long(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		key := "line killed waiter"
		k := sqllock.Hash(key)
		holder := sqllock.New(db)
		lk, err := holder.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		tr := startLine(t, driverOf(db), dsn, "lock", key, apart(3, 300*time.Millisecond), 20*time.Millisecond)
		tr.arrived()
		testkit.WaitWaiters(t, db, k, 3)
		tr.inLine(db, k)
		first := tr.inPlace(0)
		first.cmd.Process.Signal(syscall.SIGKILL)
		<-first.exited
		released := time.Now()
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		arrival, grants := tr.served(first.i)
		delay := tr.inPlace(1).granted.Sub(released)
		t.Logf("arrived %v, served %v; the second arrival granted %v after the release", arrival, grants, delay.Round(time.Millisecond))
		if !slices.Equal(arrival, grants) {
			t.Errorf("arrived %v, served %v", arrival, grants)
		}
		if bound := sqllock.DefaultOrphanBound; delay > bound {
			t.Errorf("the killed waiter delayed the next by %v, more than the orphan bound %v", delay, bound)
		}
	})
}

// TestLineReaders: readers are served together once the writers queued
// ahead of them are served, and a writer that arrived after readers waits
// for them: with a writer holding the key, readers A and B, writer C and
// reader D arrive in that order, each a Locker of its own (as processes);
// A and B hold the key together, C after both released, D after C.
func TestLineReaders(t *testing.T) {
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("line readers")
		hl, err := sqllock.New(db).Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		type event struct {
			who  string
			held bool // granted (true) or released
		}
		events := make(chan event, 16)
		var wg sync.WaitGroup
		for i, who := range []string{"A", "B", "C", "D"} {
			l := sqllock.New(pgtest.Open(t, driverOf(db), dsn))
			wg.Add(1)
			go func() {
				defer wg.Done()
				var lk *sqllock.Lock
				var err error
				if who == "C" {
					lk, err = l.Lock(bg(), k)
				} else {
					lk, err = l.RLock(bg(), k)
				}
				if err != nil {
					t.Error(who, err)
					return
				}
				events <- event{who, true}
				time.Sleep(100 * time.Millisecond)
				events <- event{who, false}
				if err := lk.Unlock(bg()); err != nil {
					t.Error(who, err)
				}
			}()
			testkit.WaitWaiters(t, db, k, i+1)
			time.Sleep(5 * time.Millisecond)
		}
		if err := hl.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		waitGroup(t, &wg, hangCeiling)
		close(events)
		var got []string
		for e := range events {
			if e.held {
				got = append(got, "+"+e.who)
			} else {
				got = append(got, "-"+e.who)
			}
		}
		t.Logf("events: %v", got)
		// A and B both granted before either released; C granted after
		// both released and before D was granted.
		pos := map[string]int{}
		for i, e := range got {
			pos[e] = i
		}
		if len(got) != 8 || max(pos["+A"], pos["+B"]) > min(pos["-A"], pos["-B"]) ||
			pos["+C"] < max(pos["-A"], pos["-B"]) || pos["+D"] < pos["-C"] {
			t.Errorf("events %v: want A and B together, then C, then D", got)
		}
	})
}

// TestLineFrozenWaiter: the first of two waiter processes in line, stopped
// (SIGSTOP: its kernel keeps its connection up), delays the second by
// about its orphan bound (3 s), not for ever: its waiting session carries
// the bound (idle_session_timeout, PostgreSQL 14 and later), and the
// server ends it, with its ticket and whatever it was granted meanwhile.
func TestLineFrozenWaiter(t *testing.T) {
	long(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		var v int
		if err := db.QueryRow("SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v < 140000 {
			t.Skip("PostgreSQL 14 or later: idle_session_timeout ends a frozen client's session")
		}
		key := "line frozen waiter"
		k := sqllock.Hash(key)
		lk, err := sqllock.New(db).Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		const bound = 3 * time.Second
		tr := startLine(t, driverOf(db), dsn, "lock", key, apart(2, 300*time.Millisecond), 20*time.Millisecond, "HELPER_BOUND="+bound.String())
		tr.arrived()
		testkit.WaitWaiters(t, db, k, 2)
		tr.inLine(db, k)
		first := tr.inPlace(0)
		if err := first.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		_, _ = tr.served(first.i)
		delay := tr.inPlace(1).granted.Sub(released)
		first.cmd.Process.Signal(syscall.SIGKILL)
		first.cmd.Process.Signal(syscall.SIGCONT)
		t.Logf("the second arrival granted %v after the release, the first frozen (orphan bound %v)", delay.Round(time.Millisecond), bound)
		if delay > bound+2*time.Second {
			t.Errorf("a frozen waiter delayed the next by %v, want about the orphan bound %v", delay, bound)
		}
	})
}
