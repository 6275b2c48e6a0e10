package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

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
	cycles, err := measureCycles(e, 1, 3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(cycles) != 11 {
		t.Fatalf("%d cycle variants, want 11 (9 Go, 2 pgbench)", len(cycles))
	}
	for _, c := range cycles {
		if c.median <= 0 {
			t.Errorf("%s: median %v", c.name, c.median)
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
	g, err := measureGuard(e, 1, 3)
	if err != nil || len(g) != 4 {
		t.Fatalf("guard %+v, %v", g, err)
	}
	dir := t.TempDir()
	r := report{cycles: cycles, rtt: time.Millisecond, hotRTT: time.Microsecond, handoffs: hs, session: s, guard: g,
		scale: []scaleResult{{goroutines: 1, sqllock: 10, raw: 11}}}
	if err := r.write(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"benchmarks.md", "cycle.png", "handoff.png", "scale.png", "session.png", "poolguard.png"} {
		if st, err := os.Stat(dir + "/" + f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// BenchmarkCycle runs a batch of 50 uncontended cycles of every variant
// per iteration, rotating their order, and reports each variant's median:
//
//	cd bench && go test -run '^$' -bench Cycle -benchtime 40x
func BenchmarkCycle(b *testing.B) {
	e := newEnv(b)
	bs, closeAll, err := cycleBatches(e)
	if err != nil {
		b.Fatal(err)
	}
	defer closeAll()
	perRound := map[string]sample{}
	i := 0
	for b.Loop() {
		i++
		for j := range bs {
			nb := bs[(i+j)%len(bs)]
			s, err := nb.run(50)
			if err != nil {
				b.Fatal(err)
			}
			perRound[nb.name] = append(perRound[nb.name], s.median())
		}
	}
	for _, nb := range bs {
		b.ReportMetric(us(perRound[nb.name].median()), strings.NewReplacer(" ", "_", ",", "", "'", "", "(", "", ")", "").Replace(nb.name)+"-µs")
	}
}
