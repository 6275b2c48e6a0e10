package sqllock_test

// Processes behind PgBouncer in transaction mode: a holder killed with
// SIGKILL or stopped with SIGSTOP frees its keys, and waiters of several
// processes are served in the order they arrived (see
// txpooler_invariants_test.go for the set-up).

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
)

// txHolderKeys are the keys a tx-holder process takes.
var txHolderKeys = []sqllock.Key{sqllock.Int64(7801), sqllock.Int64(7802), sqllock.Int64(7803)}

// helperTxHolder takes txHolderKeys with a Locker WithTransactionPooler
// (and WithOrphanBound(HELPER_BOUND) when set), says "locked" and the
// backend of each, and waits for a line on stdin (the test kills or stops
// it meanwhile). Then it waits up to 5 s for each lock's Done, and says
// "resumed: told N of M: ERR" where N locks had Done closed and Err
// matching ErrLockLost, and ERR is the first Err.
func helperTxHolder(db *sql.DB) int {
	opts := []sqllock.Option{sqllock.WithTransactionPooler()}
	if b := os.Getenv("HELPER_BOUND"); b != "" {
		d, err := time.ParseDuration(b)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		opts = append(opts, sqllock.WithOrphanBound(d))
	}
	l := sqllock.New(db, opts...)
	var held []*sqllock.Lock
	var pids []string
	for _, k := range txHolderKeys {
		lk, err := l.Lock(context.Background(), k)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tx-holder:", err)
			return 2
		}
		held = append(held, lk)
		pids = append(pids, strconv.Itoa(lk.PID()))
	}
	fmt.Println("locked", strings.Join(pids, ","))
	var line string
	fmt.Scanln(&line)
	told := 0
	var first error
	deadline := time.After(5 * time.Second)
	for _, lk := range held {
		select {
		case <-lk.Done():
		case <-deadline:
		}
		err := lk.Err()
		if first == nil {
			first = err
		}
		select {
		case <-lk.Done():
			if errors.Is(err, sqllock.ErrLockLost) {
				told++
			}
		default:
		}
	}
	fmt.Printf("resumed: told %d of %d: %v\n", told, len(held), first)
	return 0
}

// startTxHolder starts a tx-holder process of drv on p's bouncer, with
// env, and returns it, its stdin, its lines and the backends of its locks
// once it holds them.
func startTxHolder(t *testing.T, p *txPooled, drv string, env ...string) (*exec.Cmd, *os.File, *bufio.Scanner, []int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=tx-holder", "HELPER_DRIVER="+drv, "HELPER_DSN="+p.bdsn)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = r
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
		w.Close()
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatal("the holder process said nothing")
	}
	f := strings.Fields(lines.Text())
	if len(f) != 2 || f[0] != "locked" {
		t.Fatalf("the holder process said %q", lines.Text())
	}
	var pids []int
	for _, s := range strings.Split(f[1], ",") {
		pid, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	for i, k := range txHolderKeys {
		if h := holders(t, p.observer, k); !slices.Equal(h, []int{pids[i]}) {
			t.Fatalf("holders of %v = %v, want the holder process's backend [%d]", k, h, pids[i])
		}
	}
	return cmd, w, lines, pids
}

// waitKeysFree waits until no backend holds any of keys, and returns how
// long it took, or fails t after d.
func (p *txPooled) waitKeysFree(t *testing.T, keys []sqllock.Key, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		free := true
		for _, k := range keys {
			if len(holders(t, p.observer, k)) != 0 {
				free = false
				break
			}
		}
		if free {
			return time.Since(start)
		}
		if time.Since(start) > d {
			for _, k := range keys {
				t.Logf("%v held by %v", k, holders(t, p.observer, k))
			}
			t.Fatalf("the keys still held %v after the fault", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// uniq returns pids without repeats.
func uniq(pids []int) []int {
	out := slices.Clone(pids)
	slices.Sort(out)
	return slices.Compact(out)
}

// TestTxPoolerHolderKilled: a process holding three keys through the
// bouncer (WithTransactionPooler) is killed with SIGKILL: its keys are
// free within 5 s (PgBouncer closes the server connections of the client
// connections its kernel closed in their transactions), its backends are
// gone, no advisory lock is left, and another Locker takes the keys. The
// times are reported.
func TestTxPoolerHolderKilled(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		other := p.locker(t, drv)
		cmd, _, _, pids := startTxHolder(t, p, drv)
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		free := p.waitKeysFree(t, txHolderKeys, 5*time.Second)
		var worst time.Duration
		for _, pid := range uniq(pids) {
			if _, gone := p.backendGone(t, pid, 5*time.Second); !gone {
				t.Fatalf("backend %d of the killed holder still there 5 s after", pid)
			}
			worst = time.Since(killed)
		}
		p.waitNoStrays(t, time.Second)
		for _, k := range txHolderKeys {
			lk, err := other.TryLock(bg(), k)
			if err != nil {
				t.Fatalf("another Locker's TryLock(%v) after the kill = %v", k, err)
			}
			lk.Unlock(bg())
		}
		t.Logf("holder killed (SIGKILL): its 3 keys free after %v, its %d backends gone after %v", free.Round(time.Millisecond), len(uniq(pids)), worst.Round(time.Millisecond))
	})
}

// txStopBound is the orphan bound of the stopped holder.
const txStopBound = 5 * time.Second

// TestTxPoolerHolderStopped: a process holding three keys through the
// bouncer (WithTransactionPooler, WithOrphanBound 5 s, the keep-alive
// adapted to it) is stopped with SIGSTOP: its keys are free within the
// orphan bound plus 5 s (the transactions' idle_in_transaction_session_timeout
// ends its server sessions), its backends are gone, no advisory lock is
// left, and another Locker takes the keys. Resumed, the holder is told:
// every lock's Done is closed and its Err matches ErrLockLost. The times
// are reported.
func TestTxPoolerHolderStopped(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		other := p.locker(t, drv)
		cmd, stdin, lines, pids := startTxHolder(t, p, drv, "HELPER_BOUND="+txStopBound.String())
		if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		free := p.waitKeysFree(t, txHolderKeys, txStopBound+5*time.Second)
		for _, pid := range uniq(pids) {
			if _, gone := p.backendGone(t, pid, 5*time.Second); !gone {
				t.Fatalf("backend %d of the stopped holder still there", pid)
			}
		}
		gone := time.Since(stopped)
		p.waitNoStrays(t, time.Second)
		for _, k := range txHolderKeys {
			lk, err := other.TryLock(bg(), k)
			if err != nil {
				t.Fatalf("another Locker's TryLock(%v) while the holder is stopped = %v", k, err)
			}
			lk.Unlock(bg())
		}
		if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(stdin, "go")
		if !lines.Scan() {
			t.Fatal("the holder said nothing once resumed")
		}
		said := lines.Text()
		t.Logf("holder stopped (SIGSTOP, orphan bound %v): its 3 keys free after %v, its backends gone after %v; resumed, it said %q",
			txStopBound, free.Round(time.Millisecond), gone.Round(time.Millisecond), said)
		if !strings.HasPrefix(said, "resumed: told 3 of 3: sqllock: lock lost") {
			t.Fatalf("resumed holder: %q; want every lock told lost (Done closed, Err matching ErrLockLost)", said)
		}
		if err := waitHelper(cmd, helperCeiling); err != nil {
			t.Fatal(err)
		}
	})
}

// TestTxPoolerArrivalOrder: five waiter processes, each with a Locker
// WithTransactionPooler, arriving 600 ms apart on a key held by this
// process through the bouncer, are served in the order they arrived in
// the key's line (their tickets, two trials per driver), with a pool of 8: every waiter finds a server
// connection and joins the key's line in the server as it arrives. With
// a pool of 4, the holder and three waiters take every server
// connection, and the others wait in the bouncer's queue for one before
// they can join the line: every waiter is served, in the order the line
// and the bouncer's queue give, which is reported.
func TestTxPoolerArrivalOrder(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		holder := p.locker(t, drv)
		for trial := range 2 {
			key := fmt.Sprintf("tx line %d", trial)
			lk, err := holder.Lock(bg(), sqllock.Hash(key))
			if err != nil {
				t.Fatal(err)
			}
			// 600 ms apart: behind the bouncer a waiter's call takes a
			// client connection, a server connection and its transaction
			// before it joins the line, which a loaded machine (CI, with
			// other modules' tests beside) stretched past 300 ms once.
			tr := startLine(t, drv, p.bdsn, "lock", key, apart(5, 600*time.Millisecond), 20*time.Millisecond, "HELPER_TXPOOLER=1")
			tr.arrived()
			// The server connections the holder leaves (the traffic takes
			// one at times).
			testkit.WaitWaiters(t, p.observer, sqllock.Hash(key), min(5, p.pool-2))
			if p.pool >= 6 {
				// All wait in the line: the order of their tickets is the
				// order they arrived, by the server's clock (a process's
				// call reaches the bouncer a while after it says so, and
				// on a loaded machine after a later process's).
				tr.inLine(p.observer, sqllock.Hash(key))
			}
			time.Sleep(200 * time.Millisecond)
			if err := lk.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			arrival, grants := tr.served() // each was granted, and exited
			t.Logf("trial %d: arrived %v, served %v (%d pairs out of order)", trial, arrival, grants, outOfOrder(arrival, grants))
			if p.pool >= 6 && !slices.Equal(arrival, grants) {
				t.Errorf("trial %d: arrived %v, served %v", trial, arrival, grants)
			}
		}
		p.waitNoStrays(t, 5*time.Second)
	})
}
