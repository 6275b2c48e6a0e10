package main

import (
	"context"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(candidateEnv) != "" { // a candidate of TestElectionsAgainstEtcd
		os.Exit(candidateMain())
	}
	os.Exit(pgtest.Run(m))
}

func newEnv(tb testing.TB) *env {
	srv := pgtest.Start(tb)
	if !srv.Local() {
		pgtest.Unavailable(tb, "a local cluster (pgbench, socket)", nil)
	}
	dsn := srv.NewDatabase(tb)
	return &env{ctx: context.Background(), srv: srv, dsn: dsn, pq: pgtest.Open(tb, "postgres", dsn), pgx: pgtest.Open(tb, "pgx", dsn)}
}

// TestEveryMeasurementRuns runs each measurement briefly, so that a change
// in a peer library or in sqllock that breaks the benchmark fails CI, and
// checks the report's invariants.
func TestEveryMeasurementRuns(t *testing.T) {
	e := newEnv(t)
	cycles, err := measureCycles(e, 3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(cycles) != 15 {
		t.Fatalf("%d cycle variants, want 15 (13 Go, 2 pgbench)", len(cycles))
	}
	for _, c := range cycles {
		if c.Wall <= 0 || !c.external && (c.CPU <= 0 || c.Allocs <= 0) {
			t.Errorf("%s: %+v", c.Name, c.Result)
		}
	}
	hot, err := measureHotKey(e, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hot {
		for _, x := range h.res {
			if x.Handoffs == 0 || x.PerSec <= 0 || x.MaxWait <= 0 || x.ServerCPU <= 0 {
				t.Errorf("hot key %s %s: %+v", h.driver, x.Name, x)
			}
		}
	}
	hs, err := measureHandoffs(e, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 5 || hs[0].p50 <= 0 || hs[3].p50 < time.Second {
		t.Fatalf("handoffs %+v (goose's default polls every 5 s)", hs)
	}
	s, err := measureSession(e)
	// The keep-alive checks every 100 ms, each check a round trip for
	// 5,000 locks: within the second measured, at least one, and never
	// more than one per interval (a loaded machine makes each check
	// slower, and fewer of them fit).
	if err != nil || s.locks != 5000 || s.roundTrips != 1 || s.keepAliveChecks < 1 || s.keepAliveChecks > 12 {
		t.Fatalf("session %+v, %v", s, err)
	}
	g, err := measureGuard(e, 3)
	if err != nil || len(g) != 4 {
		t.Fatalf("guard %+v, %v", g, err)
	}
	durable, stop, err := startFsyncServer(e.ctx, e.srv.BinDir())
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	toks, err := measureTokens(e.ctx, e.dsn, durable, 3)
	if err != nil || len(toks) != 4 {
		t.Fatalf("tokens %+v, %v", toks, err)
	}
	for _, r := range toks {
		if r.Wall <= 0 || r.N != 3 {
			t.Errorf("tokens %s %s: %+v", r.server, r.statement, r.Result)
		}
	}
	var tb strings.Builder
	writeTokens(&tb, toks)
	if n := strings.Count(tb.String(), "\n"); n != 6 {
		t.Errorf("token table has %d lines, want 6:\n%s", n, tb.String())
	}
	dir := t.TempDir()
	r := report{cycles: cycles, hot: hot, rtt: time.Millisecond, hotRTT: time.Microsecond, handoffs: hs, session: s, guard: g,
		scale: []scaleResult{{goroutines: 1, sqllock: 10, raw: 11}}}
	if err := r.write(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"benchmarks.md", "cycle.png", "handoff.png", "scale.png", "session.png", "poolguard.png"} {
		if st, err := os.Stat(dir + "/" + f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// A second run replaces the generated tables only: the hand-written
	// text around them stays.
	doc := "# Benchmarks\n\nSUMMARY\n\n" + startMarker + "\n\nOLD TABLES\n\n" + keepMarker + "\nLAB NOTES\n"
	if err := os.WriteFile(dir+"/benchmarks.md", []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.write(dir); err != nil {
		t.Fatal(err)
	}
	out, err := os.ReadFile(dir + "/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	if o := string(out); !strings.HasPrefix(o, "# Benchmarks\n\nSUMMARY\n\n"+startMarker) || !strings.HasSuffix(o, keepMarker+"\nLAB NOTES\n") ||
		strings.Contains(o, "OLD TABLES") || !strings.Contains(o, "### Goals") {
		t.Errorf("benchmarks.md after a second run:\n%s", o)
	}
}

// BenchmarkCycle runs every variant of the uncontended cycle once per
// iteration, in a random order, as bench/ does, and reports each one's
// median wall time (see testkit.Compare):
//
//	cd bench && go test -run '^$' -bench Cycle -benchtime 2000x
func BenchmarkCycle(b *testing.B) {
	e := newEnv(b)
	vs, ers, closeAll, err := cycleVariants(e)
	if err != nil {
		b.Fatal(err)
	}
	defer closeAll()
	r := strings.NewReplacer(" ", "_", ",", "", "'", "", "(", "", ")", "")
	for i := range vs {
		vs[i].Name = r.Replace(vs[i].Name)
	}
	testkit.Compare(b, vs, testkit.Ratio{Name: "pgx-ratio", Of: "sqllock-pgx", Over: "raw-pgx"}, testkit.Ratio{Name: "pq-ratio", Of: "sqllock-pq", Over: "raw-pq"})
	if ers.first != nil {
		b.Fatal(ers.first)
	}
}

// TestElectionsAgainstEtcd runs every trial of the -etcd comparison once,
// at 3 s bounds (etcd's session TTL, sqllock's orphan bound), and checks
// that each fault elects the next leader within its bound.
func TestElectionsAgainstEtcd(t *testing.T) {
	e := newEnv(t)
	var v int
	if err := e.pgx.QueryRowContext(e.ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v < 140000 {
		pgtest.Unavailable(t, "PostgreSQL 14 or later (idle_session_timeout frees a stopped holder's lock)", nil)
	}
	etcd := pgtest.StartEtcd(t)
	at, err := dsnAt(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(e.dsn)
	s := electionServers{etcd: etcd.Addr(), pg: u.Host, dsn: at}
	const bound = 3 * time.Second // sqllock's least orphan bound
	cfgs := electionConfigs(bound, 1, 1)
	cfgs = []electionConfig{cfgs[1], cfgs[3]} // the short bounds
	var log strings.Builder
	rs, err := measureElections(s, cfgs, 1, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	for _, r := range rs {
		for _, f := range faults {
			if len(r.times[f]) != 1 {
				t.Fatalf("%s, %s: %d trials, want 1", r.cfg.name, f, len(r.times[f]))
			}
			d, most := r.times[f][0], bound+2*time.Second
			switch {
			case f == faultResign || f == faultKill && r.cfg.system == "sqllock":
				most = 2 * time.Second // nothing to wait for
			case r.cfg.system == "etcd":
				// etcd revokes an expired lease through its log, and
				// retries a revoke not yet applied every 3 s (its
				// lessor's expired-lease retry interval): on a machine
				// loaded by the race-enabled tests beside it, a stopped
				// leader's lease went 9.6 s after the fault. Two retries.
				most += 2 * 3 * time.Second
			}
			if d <= 0 || d > most {
				t.Errorf("%s, %s: next leader after %v, want within %v", r.cfg.name, f, d, most)
			}
		}
		// Both serve waiting candidates first come, first served.
		for _, f := range fairnessFaults {
			if r.fairness[f] != 1 || r.firstWins[f] != 1 {
				t.Errorf("%s: the first leader %s: the first waiting candidate elected %d of %d times", r.cfg.name, f, r.firstWins[f], r.fairness[f])
			}
		}
	}
	var tb strings.Builder
	writeElections(&tb, rs)
	if n := strings.Count(tb.String(), "\n"); n != 8 {
		t.Errorf("election table has %d lines, want 8:\n%s", n, tb.String())
	}
}
