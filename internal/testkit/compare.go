package testkit

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The one method behind every comparison that the module's benchmarks and
// bench/ report: the variants run one call each, in an order that rotates
// from call to call, in one process, so that every variant sees the same
// machine; each call's wall time and process CPU time are recorded, and a
// variant is summed up by its median wall time and its mean CPU time (CPU
// adds up: a garbage collection counts against the call it lands in).
// Allocations are counted in a separate pass, because reading them costs
// more than a call.

// Variant is one contender of a comparison: Run performs one operation.
type Variant struct {
	Name string
	Run  func()
}

// Result sums up one variant.
type Result struct {
	Name   string
	N      int           // calls timed
	Wall   time.Duration // median wall time per call
	CPU    time.Duration // mean process CPU time (user + system) per call
	Allocs float64       // heap allocations per call
	Bytes  float64       // heap bytes per call
	Walls  []time.Duration
}

// OpsPerSec is the throughput of one call of median duration.
func (r Result) OpsPerSec() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(time.Second) / float64(r.Wall)
}

// Recorder times the calls of a comparison.
type Recorder struct {
	vs    []Variant
	walls [][]time.Duration
	cpus  []time.Duration
	n     int
	order []int
	rng   *rand.Rand
}

// NewRecorder returns a recorder for vs.
func NewRecorder(vs ...Variant) *Recorder {
	return &Recorder{rng: rand.New(rand.NewPCG(1, 2)), vs: vs, walls: make([][]time.Duration, len(vs)), cpus: make([]time.Duration, len(vs))}
}

// Round runs every variant once, in an order drawn at random (from a fixed
// seed), so that no variant always follows the same one.
func (r *Recorder) Round() {
	r.order = r.order[:0]
	for i := range r.vs {
		r.order = append(r.order, i)
	}
	r.rng.Shuffle(len(r.order), func(a, b int) { r.order[a], r.order[b] = r.order[b], r.order[a] })
	for _, i := range r.order {
		c0, t0 := ProcessCPU(), time.Now()
		r.vs[i].Run()
		t1 := time.Now()
		r.cpus[i] += ProcessCPU() - c0
		r.walls[i] = append(r.walls[i], t1.Sub(t0))
	}
	r.n++
}

// Results sums the rounds up, counting allocations over allocRuns more calls
// of each variant (none when allocRuns is 0).
func (r *Recorder) Results(allocRuns int) []Result {
	out := make([]Result, len(r.vs))
	for i, v := range r.vs {
		out[i] = Result{Name: v.Name, N: len(r.walls[i]), Wall: Median(r.walls[i]), Walls: r.walls[i]}
		if n := len(r.walls[i]); n > 0 {
			out[i].CPU = r.cpus[i] / time.Duration(n)
		}
		if allocRuns > 0 {
			out[i].Allocs, out[i].Bytes = allocs(allocRuns, v.Run)
		}
	}
	return out
}

func allocs(n int, f func()) (objects, bytes float64) {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	for range n {
		f()
	}
	runtime.ReadMemStats(&b)
	return float64(b.Mallocs-a.Mallocs) / float64(n), float64(b.TotalAlloc-a.TotalAlloc) / float64(n)
}

// ProcessCPU returns the CPU time (user + system) the process has used.
func ProcessCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Compare runs vs as a benchmark: one round per iteration of b.Loop, then
// 200 calls of each variant to count allocations. For each variant it
// reports "<name>-ns/op" (median wall), "<name>-cpu-ns/op" (mean CPU) and
// "<name>-allocs/op"; for each pair in ratios, "<ratio name>" as the
// throughput of the first ÷ the second (above 1: the first is faster).
func Compare(b *testing.B, vs []Variant, ratios ...Ratio) []Result {
	rec := NewRecorder(vs...)
	for b.Loop() {
		rec.Round()
	}
	b.StopTimer()
	res := rec.Results(200)
	byName := map[string]Result{}
	for _, r := range res {
		byName[r.Name] = r
		b.ReportMetric(float64(r.Wall.Nanoseconds()), r.Name+"-ns/op")
		b.ReportMetric(float64(r.CPU.Nanoseconds()), r.Name+"-cpu-ns/op")
		b.ReportMetric(r.Allocs, r.Name+"-allocs/op")
	}
	for _, q := range ratios {
		a, ok1 := byName[q.Of]
		c, ok2 := byName[q.Over]
		if !ok1 || !ok2 {
			b.Fatalf("ratio %s: no variant %q or %q", q.Name, q.Of, q.Over)
		}
		b.ReportMetric(a.OpsPerSec()/c.OpsPerSec(), q.Name)
	}
	return res
}

// Ratio names a throughput ratio between two variants: Of ÷ Over.
type Ratio struct{ Name, Of, Over string }

// Interleaved compares two variants (see Compare) and reports their
// throughput ratio (cand ÷ base) as "ratio". It returns the rounds run.
func Interleaved(b *testing.B, baseName string, base func(), candName string, cand func()) int {
	res := Compare(b, []Variant{{baseName, base}, {candName, cand}}, Ratio{"ratio", candName, baseName})
	return res[0].N
}

// Table renders results as a Markdown table, with each variant's
// throughput relative to the variant named base.
func Table(res []Result, base string) string {
	var ref Result
	for _, r := range res {
		if r.Name == base {
			ref = r
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "| variant | median µs/op | ops/s | vs %s | CPU µs/op | allocs/op |\n|---|---|---|---|---|---|\n", base)
	for _, r := range res {
		fmt.Fprintf(&sb, "| %s | %.1f | %.0f | %.3f× | %.1f | %.0f |\n", r.Name, us(r.Wall), r.OpsPerSec(), r.OpsPerSec()/ref.OpsPerSec(), us(r.CPU), r.Allocs)
	}
	return sb.String()
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// Median returns the median of d (0 for none).
func Median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
