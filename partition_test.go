package sqllock_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// The fault trials: a holder's link to the server is broken at the kernel
// level (pgtest.Isolated), and each trial reports t_client (when the holder
// was told: Done closed) and t_server (when another session, watching over
// the server's Unix socket, was first granted the lock), both from the
// moment of the fault. The safety rule: the holder is told first.

// Scaled-down settings for the trials: an orphan bound of a few seconds and
// a keep-alive that tells a cut-off holder well within it.
const (
	trialBound     = 4 * time.Second
	trialKeepAlive = 200 * time.Millisecond
	trials         = 10
)

// trial is one holder of one key.
type trial struct {
	key              sqllock.Key
	lk               *sqllock.Lock
	tClient, tServer time.Duration // -1: did not happen
}

// startTrials takes one lock per trial, each through a Locker of its own on
// drv over TCP, and an observer that watches the keys over the Unix socket.
func startTrials(t *testing.T, srv *pgtest.Isolated, drv, dsn string, n int, opts ...sqllock.Option) ([]*trial, *sql.DB) {
	t.Helper()
	observer := pgtest.Open(t, "pgx", srv.SocketDSN(pgtest.DatabaseOf(dsn)))
	var ts []*trial
	for i := 0; i < n; i++ {
		db := pgtest.Open(t, drv, dsn)
		l := sqllock.New(db, append([]sqllock.Option{sqllock.WithKeepAlive(trialKeepAlive), sqllock.WithOrphanBound(trialBound)}, opts...)...)
		k := sqllock.Pair(900, int32(i))
		lk, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, &trial{key: k, lk: lk, tClient: -1, tServer: -1})
	}
	return ts, observer
}

// watch records, from start, when each trial's holder is told and when the
// observer is first granted its key, until both happened or limit passed.
func watch(t *testing.T, ts []*trial, observer *sql.DB, start time.Time, limit time.Duration) {
	t.Helper()
	ol := sqllock.New(observer, sqllock.WithKeepAlive(0), sqllock.WithOrphanBound(0))
	var wg sync.WaitGroup
	for _, tr := range ts {
		wg.Add(2)
		go func() {
			defer wg.Done()
			select {
			case <-tr.lk.Done():
				tr.tClient = time.Since(start)
			case <-time.After(limit):
			}
		}()
		go func() {
			defer wg.Done()
			for time.Since(start) < limit {
				lk, err := ol.TryLock(bg(), tr.key)
				if err == nil {
					tr.tServer = time.Since(start)
					lk.Unlock(bg())
					return
				}
				if !errors.Is(err, sqllock.ErrNotAcquired) {
					t.Errorf("observer: %v", err)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	waitGroup(t, &wg, hangCeiling)
}

// report logs every trial and returns how many broke the rule (the server
// freed the lock no later than the holder was told).
func report(t *testing.T, name string, ts []*trial) (violations int) {
	t.Helper()
	var lines []string
	for i, tr := range ts {
		v := ""
		if tr.tServer >= 0 && (tr.tClient < 0 || tr.tServer <= tr.tClient) {
			violations++
			v = "  VIOLATION"
		}
		lines = append(lines, fmt.Sprintf("  trial %2d: t_client %v  t_server %v%s", i, round(tr.tClient), round(tr.tServer), v))
	}
	sort.Strings(lines)
	t.Logf("%s (keep-alive %v):\n%s", name, trialKeepAlive, strings.Join(lines, "\n"))
	return violations
}

func round(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}

// TestFullPartition: the holder's host is cut off from the server (every
// connection, keep-alive included). The server must free the lock within
// the orphan bound (+5 s), and the holder must be told first, in every
// trial, on both drivers.
func TestFullPartition(t *testing.T) {
	long(t)
	srv := pgtest.StartIsolated(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			ts, observer := startTrials(t, srv, drv, dsn, trials)
			start := time.Now()
			if err := srv.Cut(); err != nil {
				t.Fatal(err)
			}
			watch(t, ts, observer, start, trialBound+10*time.Second)
			if err := srv.Restore(); err != nil {
				t.Fatal(err)
			}
			if v := report(t, fmt.Sprintf("full partition (orphan bound %v)", trialBound), ts); v != 0 {
				t.Errorf("%d of %d trials: the server freed the lock before the holder was told", v, len(ts))
			}
			for i, tr := range ts {
				if tr.tServer < 0 || tr.tServer > trialBound+5*time.Second {
					t.Errorf("trial %d: lock freed after %v, want within the bound %v + 5s", i, round(tr.tServer), trialBound)
				}
				if !errors.Is(tr.lk.Err(), sqllock.ErrLockLost) {
					t.Errorf("trial %d: Err() = %v, want ErrLockLost", i, tr.lk.Err())
				}
				tr.lk.Unlock(bg())
			}
		})
	}
}

// faultCase is one kind of fault, caused on srv for the trials ts.
type faultCase struct {
	name   string
	bound  time.Duration // the orphan bound of the holders
	cause  func(t *testing.T, srv *pgtest.Isolated, ts []*trial, observer *sql.DB) error
	healAt func(ts []*trial) bool // when true, the fault is healed (nil: at the end)
	check  func(t *testing.T, ts []*trial)
}

// TestNetworkFaults runs each fault over several trials per driver:
// connections reset, one lock connection blackholed (a middlebox dropping
// one flow), and a partition that heals after the holder was told.
func TestNetworkFaults(t *testing.T) {
	long(t)
	srv := pgtest.StartIsolated(t)
	cases := []faultCase{{
		name:  "connections reset",
		bound: trialBound,
		cause: func(t *testing.T, srv *pgtest.Isolated, _ []*trial, _ *sql.DB) error { return srv.Reject() },
		check: func(t *testing.T, ts []*trial) {
			// A reset ends the lock's session on the server at once, as a
			// terminated backend does: no rule can tell the holder first.
			// The keep-alive tells it within an interval and a check.
			window(t, "connections reset", ts)
		},
	}, {
		name:  "one lock connection blackholed",
		bound: trialBound,
		cause: func(t *testing.T, srv *pgtest.Isolated, ts []*trial, observer *sql.DB) error {
			for _, tr := range ts {
				var port int
				if err := observer.QueryRow("SELECT client_port FROM pg_stat_activity WHERE pid = $1", tr.lk.PID()).Scan(&port); err != nil {
					return err
				}
				if err := srv.DropFlow(port); err != nil {
					return err
				}
			}
			return nil
		},
		check: func(t *testing.T, ts []*trial) {
			// The keep-alive, on another connection, sees the lock held
			// until the server ends the blackholed session at the bound:
			// the holder is told up to one keep-alive interval (plus the
			// check) after the server freed the lock. Documented; measured.
			window(t, "one lock connection blackholed", ts)
		},
	}, {
		name:   "partition heals after the holder was told",
		bound:  DefaultOrphanBoundForTest,
		cause:  func(t *testing.T, srv *pgtest.Isolated, _ []*trial, _ *sql.DB) error { return srv.Cut() },
		healAt: func(ts []*trial) bool { return allTold(ts) },
		check: func(t *testing.T, ts []*trial) {
			if v := report(t, "partition heals after the holder was told (bound 30s)", ts); v != 0 {
				t.Errorf("%d violations", v)
			}
			for i, tr := range ts {
				// No ghost holder: with a 30 s bound, only the end of the
				// old session (its connection was discarded when the
				// holder was told) frees the lock this soon.
				if tr.tServer < 0 || tr.tServer > tr.tClient+10*time.Second {
					t.Errorf("trial %d: the old session still held the lock %v after the heal", i, round(tr.tServer-tr.tClient))
				}
			}
		},
	}}
	for _, fc := range cases {
		for _, drv := range drivers {
			t.Run(fc.name+"/"+drv, func(t *testing.T) {
				dsn := srv.NewDatabase(t)
				ts, observer := startTrials(t, srv, drv, dsn, trials, sqllock.WithOrphanBound(fc.bound))
				start := time.Now()
				if err := fc.cause(t, srv, ts, observer); err != nil {
					t.Fatal(err)
				}
				if fc.healAt != nil {
					go func() {
						for !fc.healAt(ts) && time.Since(start) < 20*time.Second {
							time.Sleep(10 * time.Millisecond)
						}
						srv.Restore()
					}()
				}
				watch(t, ts, observer, start, fc.bound+10*time.Second)
				if err := srv.Restore(); err != nil {
					t.Fatal(err)
				}
				fc.check(t, ts)
				for _, tr := range ts {
					tr.lk.Unlock(bg())
				}
				// A new lock works once the network is back.
				l := sqllock.New(pgtest.Open(t, drv, dsn))
				lk, err := l.Lock(bg(), ts[0].key)
				if err != nil {
					t.Fatalf("Lock after the fault: %v", err)
				}
				lk.Unlock(bg())
			})
		}
	}
}

// window reports the trials of a fault that the server answers by ending
// the lock's session itself, and fails t when a holder was told more than
// one keep-alive interval plus a check after the server freed its lock.
func window(t *testing.T, name string, ts []*trial) {
	t.Helper()
	v := report(t, name, ts)
	worst := time.Duration(0)
	for i, tr := range ts {
		if tr.tClient < 0 || tr.tServer < 0 {
			t.Errorf("trial %d: t_client %v, t_server %v: both must happen", i, round(tr.tClient), round(tr.tServer))
			continue
		}
		worst = max(worst, tr.tClient-tr.tServer)
	}
	t.Logf("%s: %d of %d trials told after the server freed the lock; worst window %v (keep-alive interval %v)",
		name, v, len(ts), worst.Round(time.Millisecond), trialKeepAlive)
	if worst > trialKeepAlive+time.Second {
		t.Errorf("%s: window %v, want under one keep-alive interval plus a check", name, worst)
	}
}

// DefaultOrphanBoundForTest is sqllock's default bound, used where a
// trial must show that something other than the bound freed the lock.
const DefaultOrphanBoundForTest = sqllock.DefaultOrphanBound

func allTold(ts []*trial) bool {
	for _, tr := range ts {
		select {
		case <-tr.lk.Done():
		default:
			return false
		}
	}
	return true
}

// TestFrozenHolder: a holder process stopped (SIGSTOP) keeps its TCP
// connection (its kernel still answers), yet loses its lock within the
// orphan bound: its lease (idle_session_timeout on the holding session,
// kept from firing by a statement each third of the bound) runs out, the
// server ends the session, and another holder takes the key and writes
// with its token. Resumed, the stopped holder's first question, Err, says
// the lock is lost; a write with its old token would be refused anyway.
// Both drivers, on a shared session and on a session of its own.
func TestFrozenHolder(t *testing.T) {
	long(t)
	srv := pgtest.StartIsolated(t)
	for _, drv := range drivers {
		for _, dedicated := range []bool{false, true} {
			name := drv + "/shared"
			if dedicated {
				name = drv + "/dedicated"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				dsn := srv.NewDatabase(t)
				db := pgtest.Open(t, "pgx", srv.SocketDSN(pgtest.DatabaseOf(dsn)))
				if _, err := db.Exec(`CREATE TABLE fenced (id int PRIMARY KEY, fence bigint NOT NULL, v int NOT NULL);
					INSERT INTO fenced VALUES (1, 0, 0)`); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=frozen", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn)
				if dedicated {
					cmd.Env = append(cmd.Env, "HELPER_DEDICATED=1")
				}
				stdin, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				out, err := cmd.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				cmd.Stderr = os.Stderr
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer cmd.Process.Kill()
				lines := bufio.NewScanner(out)
				var old int64
				if !lines.Scan() {
					t.Fatal("helper said nothing")
				}
				if _, err := fmt.Sscanf(lines.Text(), "locked %d", &old); err != nil {
					t.Fatalf("helper said %q", lines.Text())
				}
				other := sqllock.New(db, sqllock.WithKeepAlive(0))
				cmd.Process.Signal(syscall.SIGSTOP)
				start := time.Now()
				var lk *sqllock.Lock
				for time.Since(start) < trialBound+5*time.Second {
					if lk, err = other.TryLock(bg(), sqllock.Int64(77)); err == nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				took := time.Since(start)
				if lk == nil {
					cmd.Process.Signal(syscall.SIGCONT)
					t.Fatalf("the stopped holder still held its lock %v after it was stopped (orphan bound %v)", took, trialBound)
				}
				token, err := lk.Token(bg())
				if err != nil {
					t.Fatal(err)
				}
				if res, err := db.Exec(`UPDATE fenced SET fence = $1, v = v + 1 WHERE id = 1 AND fence <= $1`, token); err != nil {
					t.Fatal(err)
				} else if n, _ := res.RowsAffected(); n != 1 || token <= old {
					t.Fatalf("the new holder's fenced write (token %d after %d) updated %d rows", token, old, n)
				}
				cmd.Process.Signal(syscall.SIGCONT)
				fmt.Fprintln(stdin, "go")
				if !lines.Scan() {
					t.Fatal("helper said nothing after the pause")
				}
				said := lines.Text()
				t.Logf("holder stopped: another session got the lock after %v (orphan bound %v); the holder, resumed: %s", took.Round(time.Millisecond), trialBound, said)
				if took > trialBound+time.Second {
					t.Errorf("the lock was freed %v after the holder stopped, past the orphan bound %v", took, trialBound)
				}
				if !strings.HasPrefix(said, "resumed: Err sqllock: lock lost") || !strings.HasSuffix(said, "wrote 0") {
					t.Fatalf("resumed holder: %q; want its first Err to say the lock is lost, and its fenced write refused (0 rows)", said)
				}
				lk.Unlock(bg())
				if err := waitHelper(cmd, helperCeiling); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestFailover: the streaming standby is promoted and the old primary
// stopped while locks are held on it. Every holder is told its lock is
// lost, the new primary takes new locks, and nothing is left held there.
func TestFailover(t *testing.T) {
	long(t)
	primary := pgtest.Private(t)
	standby := pgtest.StartStandby(t, primary)
	// Before the switch, the standby refuses locks.
	for _, drv := range drivers {
		newL := sqllock.New(pgtest.Open(t, drv, standby.DSN()))
		if _, err := newL.TryLock(bg(), sqllock.Pair(910, 0)); !errors.Is(err, sqllock.ErrStandby) {
			t.Fatalf("%s: TryLock on the standby = %v, want ErrStandby", drv, err)
		}
	}
	// The switch: promote the standby, stop the old primary.
	var holders []*sqllock.Lock
	for i := 0; i < 5; i++ {
		l := sqllock.New(pgtest.Open(t, "pgx", primary.DSN()), sqllock.WithKeepAlive(trialKeepAlive), sqllock.WithOrphanBound(trialBound))
		lk, err := l.Lock(bg(), sqllock.Pair(911, int32(i)))
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, lk)
	}
	pq := sqllock.New(pgtest.Open(t, "postgres", primary.DSN()), sqllock.WithKeepAlive(trialKeepAlive), sqllock.WithOrphanBound(trialBound))
	for i := 5; i < 10; i++ {
		lk, err := pq.Lock(bg(), sqllock.Pair(911, int32(i)))
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, lk)
	}
	admin, err := sql.Open("pgx", standby.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	start := time.Now()
	var promoted bool
	if err := admin.QueryRow("SELECT pg_promote(true, 30)").Scan(&promoted); err != nil || !promoted {
		t.Fatalf("pg_promote = %v, %v", promoted, err)
	}
	if err := primary.Close(); err != nil {
		t.Fatal(err)
	}
	for i, lk := range holders {
		select {
		case <-lk.Done():
		case <-time.After(15 * time.Second):
			t.Fatalf("holder %d not told within 15 s of the switch", i)
		}
		if !errors.Is(lk.Err(), sqllock.ErrLockLost) {
			t.Errorf("holder %d: Err() = %v", i, lk.Err())
		}
	}
	t.Logf("failover: all %d holders (pgx and lib/pq) told %v after the promotion began", len(holders), time.Since(start).Round(time.Millisecond))
	for _, drv := range drivers {
		l := sqllock.New(pgtest.Open(t, drv, standby.DSN()))
		lk, err := l.Lock(bg(), sqllock.Pair(911, 0))
		if err != nil {
			t.Fatalf("%s: Lock on the new primary: %v", drv, err)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
	}
	for _, lk := range holders {
		lk.Unlock(bg())
	}
	newPrimary := pgtest.Open(t, "pgx", standby.DSN())
	waitNoLocks(t, newPrimary, 5*time.Second)
}

// TestUnlockBoundedUnderPartition: Unlock returns within its bound even
// when the network is cut and the driver does not give up a read when its
// context ends (lib/pq); the connection is discarded once the read returns,
// and the server frees the lock within the orphan bound.
func TestUnlockBoundedUnderPartition(t *testing.T) {
	long(t)
	srv := pgtest.StartIsolated(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			l := sqllock.New(pgtest.Open(t, drv, dsn), sqllock.WithKeepAlive(0), sqllock.WithOrphanBound(trialBound),
				sqllock.WithUnlockTimeout(time.Second))
			k := sqllock.Int64(920)
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			if tl, err := l.TryLock(bg(), sqllock.Int64(921)); err == nil { // an idle connection in the pool
				tl.Unlock(bg())
			}
			// A wait under way when the link is cut ends by its deadline too.
			observerDB := pgtest.Open(t, "pgx", srv.SocketDSN(pgtest.DatabaseOf(dsn)))
			other, err := sqllock.New(observerDB).Lock(bg(), sqllock.Int64(923))
			if err != nil {
				t.Fatal(err)
			}
			defer other.Unlock(bg())
			waited := make(chan error, 1)
			waitStart := time.Now()
			go func() {
				ctx, cancel := context.WithTimeout(bg(), 1500*time.Millisecond)
				defer cancel()
				_, err := l.Lock(ctx, sqllock.Int64(923))
				waited <- err
			}()
			testkit.WaitWaiters(t, observerDB, sqllock.Int64(923), 1)
			if err := srv.Cut(); err != nil {
				t.Fatal(err)
			}
			defer srv.Restore()
			select {
			case err := <-waited:
				t.Logf("a wait cut off: %v after %v", err, time.Since(waitStart).Round(time.Millisecond))
				if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("the cut-off wait = %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("a wait cut off by the partition did not end by its deadline")
			}
			// A lock call with a deadline returns by it (plus a grace).
			ctx, cancel := context.WithTimeout(bg(), time.Second)
			start := time.Now()
			_, err = l.Lock(ctx, sqllock.Int64(922))
			cancel()
			t.Logf("Lock with a 1 s deadline under a partition: %v after %v", err, time.Since(start).Round(time.Millisecond))
			if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
				t.Fatalf("Lock = %v after %v; want ErrNotAcquired and DeadlineExceeded by the deadline", err, time.Since(start))
			}
			start = time.Now()
			err = lk.Unlock(bg())
			took := time.Since(start)
			t.Logf("Unlock under a partition: %v after %v", err, took.Round(time.Millisecond))
			if err == nil || took > 2*time.Second {
				t.Fatalf("Unlock = %v after %v; want an error within the unlock bound (1-1.25 s)", err, took)
			}
		})
	}
}
