package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// Election.Observe: what its statements cost the server (the candidates'
// digest, which every ask reads; the key's holder, read when the digest
// changed; the Inspect that Leader ran before; a bare round trip), by the
// number of advisory locks held in the server, since reading pg_locks
// copies the whole lock table; what an observer costs the server at rest,
// against the same loop at other intervals, without the digest, and a
// bare round trip at its interval; what observers cost a concurrent lock
// workload; and how soon Observe reports a change: terms of 100 ms (their
// start and their resignation) and a leader killed with SIGKILL, a
// process of its own.

// observeKey is the election's key; observeClass is the class of the
// pair keys held to fill the lock table.
const (
	observeKey   = 4244
	observeClass = 77
)

// observeSizes are the numbers of other advisory locks held in the server.
var observeSizes = []int{0, 1000, 10000}

// runObserve is the -observe mode: its tables to w.
func runObserve(ctx context.Context, srv *pgtest.Server, calls, terms, kills int, phase time.Duration, rounds int, w io.Writer) error {
	dsn := srv.DSN()
	admin := open("pgx", dsn)
	defer admin.Close()
	fmt.Fprintf(w, "%s, %d cores, %s, %s\n\n", time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), serverVersion(&env{ctx: ctx, pgx: admin}))
	step := func(name string) func() {
		t := time.Now()
		fmt.Fprintf(os.Stderr, "%s...", name)
		return func() { fmt.Fprintf(os.Stderr, " %v\n", time.Since(t).Round(time.Millisecond)) }
	}
	done := step("the cost of an ask")
	if err := measureAsk(ctx, dsn, calls, w); err != nil {
		return err
	}
	done()
	done = step("observers at rest")
	if err := measureObserversAtRest(ctx, dsn, phase, rounds, w); err != nil {
		return err
	}
	done()
	done = step("observers and a lock workload")
	if err := measureObserversUnderLoad(ctx, dsn, phase, rounds, w); err != nil {
		return err
	}
	done()
	done = step("delays")
	if err := measureObserveDelays(ctx, srv, terms, kills, w); err != nil {
		return err
	}
	done()
	return nil
}

// fillLockTable holds n advisory locks (pair keys of observeClass) on a
// connection of db until the returned func is called.
func fillLockTable(ctx context.Context, db *sql.DB, n int) (func(), error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if n > 0 {
		if _, err := conn.ExecContext(ctx, "SELECT count(pg_advisory_lock($1::int4, g)) FROM generate_series(1, $2::int4) AS g", observeClass, n); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return func() {
		conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock_all()")
		conn.Close()
	}, nil
}

// onePool returns a pool of one connection to dsn through driver, and
// its backend.
func onePool(ctx context.Context, driver, dsn string) (*sql.DB, int, error) {
	db := open(driver, dsn)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	var pid int
	if err := db.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		db.Close()
		return nil, 0, err
	}
	return db, pid, nil
}

// measureAsk times Election.Leader (Observe's ask), Inspect of the key
// (what Leader ran before) and SELECT 1, each on a pool of one connection
// of its own, in interleaved rounds, with a leader and 0 to 10,000 other
// locks held; the server's CPU per call is that of each one's backend.
func measureAsk(ctx context.Context, dsn string, calls int, w io.Writer) error {
	db := open("pgx", dsn)
	defer db.Close()
	key := sqllock.Int64(observeKey)
	term, err := sqllock.New(db).Election(key).Campaign(ctx, "bench")
	if err != nil {
		return err
	}
	defer term.Unlock(context.Background())
	fmt.Fprintln(w, "| other locks held in the server | statement | median µs per call | server CPU µs per call |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, size := range observeSizes {
		release, err := fillLockTable(ctx, db, size)
		if err != nil {
			return err
		}
		type contender struct {
			name string
			run  func(db *sql.DB) error
		}
		cs := []contender{
			{"the candidates' digest (every ask of Observe)", func(db *sql.DB) error {
				var d int64
				return db.QueryRowContext(ctx, sqltext.CandidatesSQL).Scan(&d)
			}},
			{"one ask of Observe, the digest unchanged (ObserveSQL)", func(db *sql.DB) error {
				var d int64
				if err := db.QueryRowContext(ctx, sqltext.CandidatesSQL).Scan(&d); err != nil {
					return err
				}
				q, args := sqltext.Bind.ObserveArgs(0, observeKey, 1, d, false)
				var read bool
				var pid int
				var name, addr, since string
				if err := db.QueryRowContext(ctx, q, args...).Scan(&d, &read, &pid, &name, &addr, &since); err != nil {
					return err
				}
				if read || pid != 0 {
					return fmt.Errorf("ObserveSQL read the holder (%v, pid %d) with the digest unchanged", read, pid)
				}
				return nil
			}},
			{"the key's holder (Election.Leader; Observe's ask when the digest changed)", func(db *sql.DB) error {
				ld, err := sqllock.New(db).Election(key).Leader(ctx)
				if err == nil && ld.Value != "bench" {
					err = fmt.Errorf("leader %v, want bench", ld)
				}
				return err
			}},
			{"Inspect of the key (Election.Leader before)", func(db *sql.DB) error {
				hs, err := sqllock.Inspect(ctx, db, nil, key)
				if err == nil && len(hs) != 1 {
					err = fmt.Errorf("%d locks, want 1", len(hs))
				}
				return err
			}},
			{"SELECT 1 (a round trip)", func(db *sql.DB) error {
				var one int
				return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
			}},
		}
		var first errs
		var vs []testkit.Variant
		pids := make([]int, len(cs))
		for i, c := range cs {
			p, pid, err := onePool(ctx, "pgx", dsn)
			if err != nil {
				release()
				return err
			}
			defer p.Close()
			pids[i] = pid
			run := c.run
			vs = append(vs, testkit.Variant{Name: c.name, Run: first.do(func() error { return run(p) })})
			for range 20 { // warm up: pgx prepares its statements
				run(p)
			}
		}
		n := calls
		if size >= 10000 {
			n = max(calls/10, 100)
		}
		cpu0 := make([]time.Duration, len(pids))
		for i, pid := range pids {
			if cpu0[i], err = testkit.ProcessCPUOf(pid); err != nil {
				release()
				return err
			}
		}
		rec := testkit.NewRecorder(vs...)
		for range n {
			rec.Round()
		}
		release()
		if first.first != nil {
			return first.first
		}
		for i, r := range rec.Results(0) {
			cpu1, err := testkit.ProcessCPUOf(pids[i])
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "| %d | %s | %.0f | %.0f |\n", size, r.Name, us(r.Wall), us(cpu1-cpu0[i])/float64(r.N))
		}
	}
	fmt.Fprintln(w)
	return nil
}

// asker asks who leads an election, in one way, until ctx ends, through
// a pool of driver (pgx when empty).
type asker struct {
	name, driver string
	run          func(ctx context.Context, db *sql.DB)
}

// observing is Election.Observe itself, through driver.
func observing(key sqllock.Key, driver string) asker {
	return asker{"Observe (every 20 ms), " + driverNames[driver], driver, func(ctx context.Context, db *sql.DB) {
		for range sqllock.New(db).Election(key).Observe(ctx) {
		}
	}}
}

// driverNames names the drivers in tables.
var driverNames = map[string]string{"pgx": "pgx", "postgres": "lib/pq"}

// every runs ask every d until ctx ends.
func every(ctx context.Context, d time.Duration, ask func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		ask()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// gatedEvery is Observe's loop written by hand, every d: one statement
// (ObserveSQL), which reads the candidates' digest, and the key's holder
// when it changed, and every second.
func gatedEvery(d time.Duration) asker {
	return asker{fmt.Sprintf("Observe's loop every %v, pgx", d), "", func(ctx context.Context, db *sql.DB) {
		var digest int64
		var read time.Time
		every(ctx, d, func() {
			q, args := sqltext.Bind.ObserveArgs(0, observeKey, 1, digest, time.Since(read) >= time.Second)
			var dg int64
			var wasRead bool
			var pid int
			var name, addr, since string
			if db.QueryRowContext(ctx, q, args...).Scan(&dg, &wasRead, &pid, &name, &addr, &since) == nil && wasRead {
				digest, read = dg, time.Now()
			}
		})
	}}
}

// holderEvery reads the key's holder every d: the loop without the gate.
func holderEvery(d time.Duration) asker {
	return asker{fmt.Sprintf("the key's holder every %v (no digest), pgx", d), "", func(ctx context.Context, db *sql.DB) {
		every(ctx, d, func() { readHolder(ctx, db) })
	}}
}

// roundTripEvery runs SELECT 1 every d: the floor of any poll.
func roundTripEvery(d time.Duration) asker {
	return asker{fmt.Sprintf("SELECT 1 every %v (the floor), pgx", d), "", func(ctx context.Context, db *sql.DB) {
		every(ctx, d, func() {
			var one int
			db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		})
	}}
}

// readHolder runs LeaderSQL for observeKey.
func readHolder(ctx context.Context, db *sql.DB) error {
	q, args := sqltext.Bind.TagArgs(sqltext.LeaderSQL, 0, observeKey, 1)
	var pid int
	var name, addr, since string
	err := db.QueryRowContext(ctx, q, args...).Scan(&pid, &name, &addr, &since)
	if errors.Is(err, sql.ErrNoRows) {
		err = nil
	}
	return err
}

// measureObserversAtRest runs, in alternating phases, each asker alone
// on a connection of its own, with a leader in place and 0 to 10,000
// other locks held, and reports its backend's CPU time per second.
func measureObserversAtRest(ctx context.Context, dsn string, phase time.Duration, rounds int, w io.Writer) error {
	db := open("pgx", dsn)
	defer db.Close()
	key := sqllock.Int64(observeKey)
	term, err := sqllock.New(db).Election(key).Campaign(ctx, "bench")
	if err != nil {
		return err
	}
	defer term.Unlock(context.Background())
	askers := []asker{observing(key, "pgx"), observing(key, "postgres"), gatedEvery(10 * time.Millisecond), gatedEvery(50 * time.Millisecond),
		holderEvery(20 * time.Millisecond), roundTripEvery(20 * time.Millisecond)}
	fmt.Fprintln(w, "| other locks held in the server | one observer | its backend's CPU, ms per second (median) |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, size := range observeSizes {
		release, err := fillLockTable(ctx, db, size)
		if err != nil {
			return err
		}
		rates := make([][]float64, len(askers))
		for range rounds {
			for _, i := range permutation(len(askers)) {
				p, pid, err := onePool(ctx, cmp.Or(askers[i].driver, "pgx"), dsn)
				if err != nil {
					release()
					return err
				}
				pctx, cancel := context.WithTimeout(ctx, phase)
				c0, err := testkit.ProcessCPUOf(pid)
				t0 := time.Now()
				if err == nil {
					askers[i].run(pctx, p)
				}
				<-pctx.Done()
				c1, err2 := testkit.ProcessCPUOf(pid)
				took := time.Since(t0)
				cancel()
				p.Close()
				if err = cmp.Or(err, err2); err != nil {
					release()
					return err
				}
				rates[i] = append(rates[i], float64(c1-c0)/float64(time.Millisecond)/took.Seconds())
			}
		}
		release()
		for i, a := range askers {
			fmt.Fprintf(w, "| %d | %s | %.2f |\n", size, a.name, median(rates[i]))
		}
	}
	fmt.Fprintln(w)
	return nil
}

// measureObserversUnderLoad runs a lock workload (16 goroutines taking
// and releasing distinct free keys by hand, testkit's raw load) alone,
// with 1 and 10 observers, and with 10 askers that read the holder every
// 20 ms, in alternating phases, with 0 and 10,000 other locks held, and
// reports its locks per second.
func measureObserversUnderLoad(ctx context.Context, dsn string, phase time.Duration, rounds int, w io.Writer) error {
	const goroutines = 16
	db := open("pgx", dsn)
	defer db.Close()
	serverCPU, err := testkit.ServerCPU(ctx, db)
	if err != nil {
		return err
	}
	key := sqllock.Int64(observeKey)
	term, err := sqllock.New(db).Election(key).Campaign(ctx, "bench")
	if err != nil {
		return err
	}
	defer term.Unlock(context.Background())
	raw := open("pgx", dsn)
	defer raw.Close()
	raw.SetMaxOpenConns(64)
	raw.SetMaxIdleConns(64)
	pool := open("pgx", dsn)
	defer pool.Close()
	pool.SetMaxIdleConns(20)
	type with struct {
		name string
		a    asker
		n    int
	}
	withs := []with{{"none", asker{}, 0}, {"1 observer", observing(key, "pgx"), 1}, {"10 observers", observing(key, "pgx"), 10},
		{"10 readers of the key's holder every 20 ms (no digest)", holderEvery(20 * time.Millisecond), 10}}
	fmt.Fprintf(w, "| other locks held in the server | alongside | locks/s, %d goroutines (median) | ÷ alone | server CPU µs per lock |\n", goroutines)
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, size := range []int{0, 10000} {
		release, err := fillLockTable(ctx, db, size)
		if err != nil {
			return err
		}
		var loads []testkit.Load
		for _, wi := range withs {
			loads = append(loads, testkit.Load{Name: wi.name, Run: func(ctx context.Context, g int) (int64, error) {
				for range wi.n {
					go wi.a.run(ctx, pool)
				}
				return testkit.PerGoroutine(ctx, g, 8_000_000, func(k int64) error { return testkit.RawTryUnlock(raw, k) })
			}})
		}
		res, err := testkit.Throughput(loads, goroutines, phase, rounds, serverCPU)
		release()
		if err != nil {
			return err
		}
		for _, r := range res {
			fmt.Fprintf(w, "| %d | %s | %.0f | %.2f | %.1f |\n", size, r.Name, r.LocksPerSec, r.LocksPerSec/res[0].LocksPerSec, r.ServerUS)
		}
	}
	fmt.Fprintln(w)
	return nil
}

// measureObserveDelays measures how soon an observer (a default Locker:
// keep-alive 5 s) reports a change: terms of 100 ms, 200 ms apart (each
// change put off by a random part of Observe's interval), of a candidate
// in this process (from Campaign's return to the report of its value,
// and from its Unlock's return to the report of no leader), and leaders
// killed with SIGKILL, each a candidate process of its own (from the
// signal to the report of no leader).
func measureObserveDelays(ctx context.Context, srv *pgtest.Server, terms, kills int, w io.Writer) error {
	dsn := srv.DSN()
	key := sqllock.Int64(observeKey + 1)
	obsDB, candDB := open("pgx", dsn), open("pgx", dsn)
	defer obsDB.Close()
	defer candDB.Close()
	octx, stop := context.WithCancel(ctx)
	defer stop()
	type report struct {
		ld sqllock.Leader
		at time.Time
	}
	reports := make(chan report, 4*terms+4*kills+16)
	changes := sqllock.New(obsDB).Election(key).Observe(octx)
	if first := <-changes; first.PID != 0 {
		return fmt.Errorf("bench: observe: %v leads already", first)
	}
	go func() {
		for ld := range changes {
			reports <- report{ld, time.Now()}
		}
		close(reports)
	}()
	// Terms, then what the observer reported of them.
	candidate := sqllock.New(candDB).Election(key)
	type span struct {
		value             string
		granted, resigned time.Time
	}
	var spans []span
	for i := range terms {
		value := "term-" + strconv.Itoa(i)
		ld, err := candidate.Campaign(ctx, value)
		if err != nil {
			return err
		}
		granted := time.Now()
		time.Sleep(100*time.Millisecond + dephase())
		if err := ld.Unlock(ctx); err != nil {
			return err
		}
		spans = append(spans, span{value, granted, time.Now()})
		time.Sleep(200*time.Millisecond + dephase())
	}
	var got []report
	for len(reports) > 0 {
		got = append(got, <-reports)
	}
	var start, end sample
	for _, sp := range spans {
		for j, r := range got {
			if r.ld.Value != sp.value {
				continue
			}
			start = append(start, r.at.Sub(sp.granted))
			if j+1 < len(got) && got[j+1].ld.PID == 0 {
				end = append(end, got[j+1].at.Sub(sp.resigned))
			}
			break
		}
	}
	// Leaders killed.
	at, err := dsnAt(dsn)
	if err != nil {
		return err
	}
	await := func(want func(sqllock.Leader) bool, timeout time.Duration) (report, error) {
		t := time.NewTimer(timeout)
		defer t.Stop()
		for {
			select {
			case r := <-reports:
				if want(r.ld) {
					return r, nil
				}
			case <-t.C:
				return report{}, fmt.Errorf("bench: observe: not reported within %v", timeout)
			}
		}
	}
	var killed sample
	for i := range kills {
		value := "killed-" + strconv.Itoa(i)
		c, err := startCandidate("sqllock", value, srv.Addr(), at, strconv.Itoa(observeKey+1), 0)
		if err != nil {
			return err
		}
		if _, err := await(func(l sqllock.Leader) bool { return l.Value == value }, 30*time.Second); err != nil {
			c.kill()
			return err
		}
		time.Sleep(100*time.Millisecond + dephase())
		t0 := time.Now()
		c.cmd.Process.Signal(syscall.SIGKILL)
		r, err := await(func(l sqllock.Leader) bool { return l.PID == 0 }, 10*time.Second)
		c.kill()
		if err != nil {
			return err
		}
		killed = append(killed, r.at.Sub(t0))
	}
	stop()
	fmt.Fprintln(w, "| change | reported | delay: median | 90th percentile | max |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	row := func(what string, s sample, of int) {
		if len(s) == 0 {
			fmt.Fprintf(w, "| %s | 0 of %d | | | |\n", what, of)
			return
		}
		fmt.Fprintf(w, "| %s | %d of %d | %v | %v | %v |\n", what, len(s), of, round(s.median()), round(s.quantile(0.9)), round(slices.Max(s)))
	}
	row("a term of 100 ms begins (from Campaign's return)", start, terms)
	row("it resigns (from Unlock's return; no leader for 200 ms after)", end, terms)
	row("a leader process killed with SIGKILL (from the signal)", killed, kills)
	fmt.Fprintln(w)
	return nil
}

// dephase returns a random time within Observe's interval (20 ms), by
// which a change is put off, so that changes do not keep one phase of
// the observer's asks (a change made a whole number of intervals after a
// report comes just after an ask).
func dephase() time.Duration { return rand.N(20 * time.Millisecond) }

// round rounds d for a table: to 10 µs below 10 ms, else to 0.1 ms.
func round(d time.Duration) time.Duration {
	if d < 10*time.Millisecond && d > -10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(100 * time.Microsecond)
}

// permutation returns 0..n-1 in a random order.
func permutation(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	rand.Shuffle(n, func(a, b int) { p[a], p[b] = p[b], p[a] })
	return p
}

// median returns the median of f.
func median(f []float64) float64 {
	if len(f) == 0 {
		return 0
	}
	c := slices.Clone(f)
	slices.Sort(c)
	return c[len(c)/2]
}
