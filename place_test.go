package sqllock_test

// Every queued caller has its place in the line from the moment it
// calls: two waiters of one Locker in one process, then two of another
// process, are served in the order they called, for Lock, a semaphore's
// permits and an election's candidates. The order of arrival is made by
// events (each call is in its Locker's queue, and holds its place in the
// server's line, before the next is made), and the order of service is
// read one grant at a time (each grant frees nothing until the test says
// so).

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/internal/testkit"
)

// placesProc is a waiter process of TestLinePlaces (role "places"): it
// reads commands on its stdin and says what happened on its stdout.
type placesProc struct {
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startPlaces starts a "places" process of mode on key, with n waiters.
func startPlaces(t *testing.T, name, drv, dsn, mode, key string, n int, events chan<- string) *placesProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=places", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn,
		"HELPER_MODE="+mode, "HELPER_KEY="+key, "HELPER_N="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pr := &placesProc{name: name, cmd: cmd, in: in, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "granted ") {
				events <- name + strings.TrimPrefix(l, "granted ")
			} else {
				pr.lines <- l
			}
		}
		close(pr.lines)
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return pr
}

// say sends pr a command.
func (pr *placesProc) say(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(pr.in, cmd); err != nil {
		t.Fatalf("process %s: %v", pr.name, err)
	}
}

// expect waits for pr's next line, which must be want.
func (pr *placesProc) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case l, ok := <-pr.lines:
		if !ok || l != want {
			t.Fatalf("process %s said %q (open %v), want %q", pr.name, l, ok, want)
		}
	case <-time.After(time.Minute):
		t.Fatalf("process %s did not say %q within a minute", pr.name, want)
	}
}

// ticketsIn returns how many tickets of ticket class class the server
// shows granted in db's database (the other driver's trials use the same
// keys in a database of their own).
func ticketsIn(t *testing.T, db *sql.DB, class int32) int {
	t.Helper()
	var n int
	err := db.QueryRowContext(bg(), `SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted
 AND classid::int8 = ($1::int8 & 4294967295) AND objsubid = 2 AND objid <> 0
 AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())`, int64(class)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLinePlaces: a0 and a1, two waiters of one Locker in process A, call
// in turn, then b0 and b1 of process B, while the test holds the key (all
// the semaphore's permits; the leadership): they are served a0, a1, b0,
// b1, every trial (5 per driver and mode; 1 in the quick run). Each call
// is made once the one before it is queued in its Locker and the server's
// line shows it (a waiter with no place in it after 5 s is logged, and
// the next call is made all the same).
func TestLinePlaces(t *testing.T) {
	trials := 5
	if testkit.Short() {
		trials = 1
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		for _, mode := range []string{"lock", "sem", "campaign"} {
			for trial := range trials {
				key := fmt.Sprintf("places %s %d", mode, trial)
				got := placesTrial(t, db, dsn, mode, key)
				t.Logf("%s, trial %d: called a0 a1 b0 b1, served %v", mode, trial, got)
				if want := []string{"a0", "a1", "b0", "b1"}; !slices.Equal(got, want) {
					t.Errorf("%s, trial %d: served %v, want %v", mode, trial, got, want)
				}
			}
		}
	})
}

// placesTrial runs one trial of TestLinePlaces, and returns the order in
// which the waiters were served.
func placesTrial(t *testing.T, db *sql.DB, dsn, mode, key string) []string {
	t.Helper()
	// What the test holds, how it gives it up one grant at a time, and
	// the line's ticket class.
	var free []func()
	var class int32
	l := sqllock.New(db)
	switch mode {
	case "lock", "campaign":
		k := sqllock.Hash(key)
		var lk *sqllock.Lock
		var err error
		if mode == "lock" {
			lk, err = l.Lock(bg(), k)
		} else {
			lk, err = l.Election(k).Campaign(bg(), "leader")
		}
		if err != nil {
			t.Fatal(err)
		}
		free = append(free, func() { lk.Unlock(bg()) })
		c, i, pair := k.Pair()
		v, _ := k.Int64()
		class = sqltext.TicketClass(sqltext.Key{Pair: pair, V: v, Class: c, ID: i})
	case "sem":
		sem := l.Semaphore(key, 2)
		for range 2 {
			lk, err := sem.Acquire(bg())
			if err != nil {
				t.Fatal(err)
			}
			free = append(free, func() { lk.Unlock(bg()) })
		}
		c, _, _ := sqllock.SemaphoreSlots(key, 2)[0].Pair()
		class = sqltext.SemaphoreTicketClass(c)
	}
	events := make(chan string, 8)
	procs := map[string]*placesProc{}
	for _, name := range []string{"a", "b"} {
		procs[name] = startPlaces(t, name, driverOf(db), dsn, mode, key, 2, events)
	}
	for _, pr := range procs {
		pr.expect(t, "ready")
	}
	for n, w := range []string{"a0", "a1", "b0", "b1"} {
		pr := procs[w[:1]]
		pr.say(t, "call "+w[1:])
		pr.expect(t, "queued "+w[1:])
		deadline := time.Now().Add(5 * time.Second)
		for ticketsIn(t, db, class) < n+1 {
			if time.Now().After(deadline) {
				t.Logf("%s: %s holds no place in line 5 s after it queued", mode, w)
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Each step frees one grant, so that one waiter at a time can be
	// granted: the test's, then those of the waiters, in the order they
	// were granted.
	var served []string
	next := func() {
		select {
		case w := <-events:
			served = append(served, w)
		case <-time.After(time.Minute):
			t.Fatalf("%s: served %v, then no one for a minute", mode, served)
		}
	}
	for _, f := range free {
		f()
		next()
	}
	for i := 0; len(served) < 4; i++ {
		procs[served[i][:1]].say(t, "release "+served[i][1:])
		next()
	}
	for _, pr := range procs {
		pr.say(t, "exit")
	}
	for _, pr := range procs {
		if err := pr.cmd.Wait(); err != nil {
			t.Fatalf("process %s: %v", pr.name, err)
		}
	}
	return served
}

// helperPlaces is a waiter process of TestLinePlaces: its HELPER_N
// waiters, on one Locker, take HELPER_KEY as HELPER_MODE says. It says
// "ready" once connected; on "call i", waiter i calls, and it says
// "queued i" once the call is in its Locker's queue; a waiter says
// "granted i" when granted, and releases on "release i"; "exit" releases
// whatever is held and ends it.
func helperPlaces(db *sql.DB) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "places waiter:", err); return 2 }
	n, err := strconv.Atoi(os.Getenv("HELPER_N"))
	if err != nil {
		return fail(err)
	}
	key, mode := os.Getenv("HELPER_KEY"), os.Getenv("HELPER_MODE")
	l := sqllock.New(db)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	warm, err := l.TryLock(ctx, sqllock.Hash("places warm-up "+strconv.Itoa(os.Getpid())))
	if err != nil {
		return fail(err)
	}
	warm.Unlock(ctx)
	sem := l.Semaphore(key, 2)
	queued := func() int {
		if mode == "sem" {
			return sqllock.SemaphoreQueued(sem)
		}
		return sqllock.Queued(l, sqllock.Hash(key))
	}
	var out sync.Mutex
	say := func(s string) {
		out.Lock()
		defer out.Unlock()
		fmt.Println(s)
	}
	release := make([]chan struct{}, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	calls := 0
	say("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 1 && f[0] == "exit" {
			break
		}
		if len(f) != 2 {
			return fail(fmt.Errorf("command %q", sc.Text()))
		}
		i, err := strconv.Atoi(f[1])
		if err != nil || i < 0 || i >= n {
			return fail(fmt.Errorf("command %q", sc.Text()))
		}
		switch f[0] {
		case "call":
			release[i] = make(chan struct{})
			before := queued()
			wg.Add(1)
			go func() {
				defer wg.Done()
				var lk *sqllock.Lock
				var err error
				switch mode {
				case "lock":
					lk, err = l.Lock(ctx, sqllock.Hash(key))
				case "sem":
					lk, err = sem.Acquire(ctx)
				case "campaign":
					lk, err = l.Election(sqllock.Hash(key)).Campaign(ctx, "w"+strconv.Itoa(i))
				}
				if err != nil {
					errs <- err
					return
				}
				say("granted " + strconv.Itoa(i))
				<-release[i]
				if err := lk.Unlock(ctx); err != nil {
					errs <- err
				}
			}()
			calls++
			for queued() <= before {
				if ctx.Err() != nil {
					return fail(ctx.Err())
				}
				time.Sleep(100 * time.Microsecond)
			}
			say("queued " + strconv.Itoa(i))
		case "release":
			close(release[i])
		default:
			return fail(fmt.Errorf("command %q", sc.Text()))
		}
	}
	for _, ch := range release {
		if ch != nil {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	}
	wg.Wait()
	close(errs)
	if err, ok := <-errs; ok {
		return fail(err)
	}
	return 0
}
