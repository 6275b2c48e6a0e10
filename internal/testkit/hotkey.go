package testkit

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock"
)

// A hot key: many goroutines, over a pool smaller than their number,
// contend for one key, each taking it, doing nothing, and releasing it, in
// a loop. The contenders run in phases of a fixed length, one contender
// per phase, in an order drawn at random for every round of phases (so
// each sees the same machine), and each is summed up by the median of its
// phases' rates.

// HotVariant is one contender: Lock takes the key (waiting as long as it
// takes) and returns the function that releases it.
type HotVariant struct {
	Name string
	Lock func(ctx context.Context) (unlock func() error, err error)
}

// HotResult sums up one contender.
type HotResult struct {
	Name      string
	Handoffs  int           // locks taken, all phases
	PerSec    float64       // median over phases of handoffs per second
	Rates     []float64     // each phase's handoffs per second
	P99Wait   time.Duration // from calling Lock to holding the key
	MaxWait   time.Duration // the longest any goroutine waited, phases' ends included
	ServerCPU time.Duration // server CPU per handoff (0: not measured)
}

// HotKey runs rounds × len(vs) phases of length phase, with goroutines
// workers per phase. serverCPU, if not nil, returns the server's
// cumulative CPU time; it is read around every phase.
func HotKey(ctx context.Context, vs []HotVariant, goroutines int, phase time.Duration, rounds int, serverCPU func() (time.Duration, error)) ([]HotResult, error) {
	res := make([]HotResult, len(vs))
	waits := make([][]time.Duration, len(vs))
	cpu := make([]time.Duration, len(vs))
	rng := rand.New(rand.NewPCG(3, 4))
	for range rounds {
		for _, i := range rng.Perm(len(vs)) {
			var c0, c1 time.Duration
			var err error
			if serverCPU != nil {
				if c0, err = serverCPU(); err != nil {
					return nil, err
				}
			}
			n, elapsed, w, err := hotPhase(ctx, vs[i], goroutines, phase)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", vs[i].Name, err)
			}
			if serverCPU != nil {
				if c1, err = serverCPU(); err != nil {
					return nil, err
				}
				cpu[i] += c1 - c0
			}
			res[i].Handoffs += n
			res[i].Rates = append(res[i].Rates, float64(n)/elapsed.Seconds())
			waits[i] = append(waits[i], w...)
		}
	}
	for i, v := range vs {
		r := &res[i]
		r.Name = v.Name
		r.PerSec = medianFloat(r.Rates)
		slices.Sort(waits[i])
		if n := len(waits[i]); n > 0 {
			r.P99Wait = waits[i][(n-1)*99/100]
			r.MaxWait = waits[i][n-1]
		}
		if serverCPU != nil && r.Handoffs > 0 {
			r.ServerCPU = cpu[i] / time.Duration(r.Handoffs)
		}
	}
	return res, nil
}

// hotPhase runs one phase: goroutines workers lock and unlock until the
// phase ends; a worker waiting when it ends finishes its wait (which is
// measured: a starved worker shows). It returns the locks taken, the time
// until every worker stopped, and every wait.
func hotPhase(ctx context.Context, v HotVariant, goroutines int, phase time.Duration) (int, time.Duration, []time.Duration, error) {
	var (
		stop  atomic.Bool
		n     atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		waits []time.Duration
		first error
	)
	start := time.Now()
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			defer func() {
				mu.Lock()
				waits = append(waits, mine...)
				mu.Unlock()
			}()
			for !stop.Load() {
				t := time.Now()
				unlock, err := v.Lock(ctx)
				if err == nil {
					mine = append(mine, time.Since(t))
					n.Add(1)
					err = unlock()
				}
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					stop.Store(true)
					return
				}
			}
		}()
	}
	time.Sleep(phase)
	stop.Store(true)
	wg.Wait()
	return int(n.Load()), time.Since(start), waits, first
}

func medianFloat(f []float64) float64 {
	if len(f) == 0 {
		return 0
	}
	s := slices.Clone(f)
	slices.Sort(s)
	return s[len(s)/2]
}

// ServerCPU returns a function reading the cumulative CPU time of the
// PostgreSQL server that db reaches, from /proc: the postmaster and its
// children (and the children it has reaped). It works only for a server
// in this machine's process namespace.
func ServerCPU(ctx context.Context, db *sql.DB) (func() (time.Duration, error), error) {
	var pid int
	if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return nil, err
	}
	st, err := procStat(pid)
	if err != nil || st.comm != "postgres" {
		return nil, fmt.Errorf("backend %d is not a process of this machine (%v)", pid, err)
	}
	master := st.ppid
	return func() (time.Duration, error) {
		m, err := procStat(master)
		if err != nil {
			return 0, err
		}
		total := m.cpu + m.childCPU
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			p, err := strconv.Atoi(filepath.Base(d))
			if err != nil {
				continue
			}
			if s, err := procStat(p); err == nil && s.ppid == master {
				// In nanoseconds where the kernel says (schedstat): a
				// backend's few milliseconds of a short phase on a loaded
				// machine may be charged no clock tick at all.
				if c, err := ProcessCPUOf(p); err == nil {
					total += c
				} else {
					total += s.cpu
				}
			}
		}
		return total, nil
	}, nil
}

// ProcessCPUOf returns the CPU time that process pid has used (a server
// backend's, for one that runs on this machine): from
// /proc/<pid>/schedstat, in nanoseconds, or else from /proc/<pid>/stat,
// in clock ticks.
func ProcessCPUOf(pid int) (time.Duration, error) {
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/schedstat"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns), nil
			}
		}
	}
	st, err := procStat(pid)
	return st.cpu, err
}

type stat struct {
	comm          string
	ppid          int
	cpu, childCPU time.Duration
}

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
// Linux).
const clockTick = 10 * time.Millisecond

func procStat(pid int) (stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return stat{}, err
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return stat{}, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[end+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return stat{}, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	num := func(i int) int64 { v, _ := strconv.ParseInt(f[i-3], 10, 64); return v }
	return stat{
		comm:     s[open+1 : end],
		ppid:     int(num(4)),
		cpu:      time.Duration(num(14)+num(15)) * clockTick,
		childCPU: time.Duration(num(16)+num(17)) * clockTick,
	}, nil
}

// HandLock is the hot-key contender written by hand: check a connection
// out of db's pool, pg_advisory_lock(key) on it, and pg_advisory_unlock(key)
// then return it.
func HandLock(db *sql.DB, key int64) HotVariant {
	return HotVariant{Name: "by hand", Lock: func(ctx context.Context) (func() error, error) {
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		var ok bool
		if err := conn.QueryRowContext(ctx, "SELECT true FROM pg_advisory_lock($1)", key).Scan(&ok); err != nil {
			conn.Close()
			return nil, err
		}
		return func() error {
			defer conn.Close()
			if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
				return fmt.Errorf("unlock: %v %v", ok, err)
			}
			return nil
		}, nil
	}}
}

// LockerLock is the hot-key contender that uses l.Lock and Lock.Unlock.
func LockerLock(l *sqllock.Locker, key int64) HotVariant {
	return HotVariant{Name: "sqllock", Lock: func(ctx context.Context) (func() error, error) {
		lk, err := l.Lock(ctx, sqllock.Int64(key))
		if err != nil {
			return nil, err
		}
		return func() error { return lk.Unlock(ctx) }, nil
	}}
}
