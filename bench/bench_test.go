package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

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
	if err != nil || s.locks != 5000 || s.roundTrips != 1 || s.keepAliveChecks < 5 || s.keepAliveChecks > 12 {
		t.Fatalf("session %+v, %v", s, err)
	}
	g, err := measureGuard(e, 3)
	if err != nil || len(g) != 4 {
		t.Fatalf("guard %+v, %v", g, err)
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
