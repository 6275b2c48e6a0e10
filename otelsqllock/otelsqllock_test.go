package otelsqllock_test

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/otelsqllock"
	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestMetricsAndSpans: the numbers the in-memory reader and span recorder
// collect match what happened: two locks acquired, one refused, one lost
// (its backend terminated), connections discarded, keep-alive checks.
func TestMetricsAndSpans(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	obs, err := otelsqllock.New(
		otelsqllock.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otelsqllock.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))))
	if err != nil {
		t.Fatal(err)
	}
	l := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithObserver(obs), sqllock.WithKeepAlive(100*time.Millisecond))
	k := sqllock.Int64(1)
	lk, err := l.Lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(ctx, k); !errors.Is(err, sqllock.ErrNotAcquired) {
		t.Fatalf("TryLock of a held key = %v", err)
	}
	if got := sum(t, reader, "sqllock.locks.held", nil); got != 1 {
		t.Fatalf("sqllock.locks.held = %d while one lock is held", got)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A lost lock.
	lk, err = l.Lock(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec("SELECT pg_terminate_backend($1)", lk.PID()); err != nil {
		t.Fatal(err)
	}
	<-lk.Done()
	lk.Unlock(ctx)

	outcome := func(v string) *attribute.KeyValue { kv := attribute.String("sqllock.outcome", v); return &kv }
	for _, c := range []struct {
		name string
		attr *attribute.KeyValue
		want int64
	}{
		{"sqllock.locks.held", nil, 0},
		{"sqllock.waiters", nil, 0},
		{"sqllock.acquisitions", outcome("acquired"), 2},
		{"sqllock.acquisitions", outcome("not_acquired"), 1},
		{"sqllock.locks.lost", nil, 1},
	} {
		if got := sum(t, reader, c.name, c.attr); got != c.want {
			t.Errorf("%s %v = %d, want %d", c.name, c.attr, got, c.want)
		}
	}
	if got := sum(t, reader, "sqllock.connections.discarded", nil); got < 1 {
		t.Errorf("sqllock.connections.discarded = %d, want at least the lost lock's", got)
	}
	ok := attribute.String("sqllock.result", "ok")
	if got := sum(t, reader, "sqllock.keepalive.checks", &ok); got < 1 {
		t.Errorf("sqllock.keepalive.checks ok = %d", got)
	}
	if got := histogramCount(t, reader, "sqllock.wait.duration"); got != 3 {
		t.Errorf("sqllock.wait.duration has %d samples, want 3 (one per lock call)", got)
	}
	var acquired, refused int
	for _, s := range spans.Ended() {
		if s.Name() != "sqllock.acquire" {
			continue
		}
		for _, a := range s.Attributes() {
			if a.Key == "sqllock.outcome" {
				switch a.Value.AsString() {
				case "acquired":
					acquired++
				case "not_acquired":
					refused++
				}
			}
		}
	}
	if acquired != 2 || refused != 1 {
		t.Errorf("spans: %d acquired, %d not acquired; want 2 and 1", acquired, refused)
	}
}

// TestBesideOtel: the package is named as OpenTelemetry's instrumentation
// packages are, so it is imported beside go.opentelemetry.io/otel with no
// alias (this file does), its name is its import path's last element, and
// its scope is that import path: an Observer made with the global
// providers (otel.SetMeterProvider) records under it.
func TestBesideOtel(t *testing.T) {
	path := reflect.TypeFor[otelsqllock.Observer]().PkgPath()
	if otelsqllock.ScopeName != path || path[strings.LastIndex(path, "/")+1:] != "otelsqllock" {
		t.Fatalf("ScopeName = %q, import path %q: want the import path, ending in the package's name", otelsqllock.ScopeName, path)
	}
	reader := sdkmetric.NewManualReader()
	global := otel.GetMeterProvider()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer otel.SetMeterProvider(global)
	obs, err := otelsqllock.New()
	if err != nil {
		t.Fatal(err)
	}
	srv := pgtest.Start(t)
	l := sqllock.New(pgtest.Open(t, "pgx", srv.NewDatabase(t)), sqllock.WithObserver(obs), sqllock.WithKeepAlive(0))
	lk, err := l.TryLock(context.Background(), sqllock.Int64(2))
	if err != nil {
		t.Fatal(err)
	}
	lk.Unlock(context.Background())
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var scopes []string
	for _, sm := range rm.ScopeMetrics {
		scopes = append(scopes, sm.Scope.Name)
	}
	if len(scopes) != 1 || scopes[0] != otelsqllock.ScopeName {
		t.Errorf("metrics recorded under scopes %q, want [%s]", scopes, otelsqllock.ScopeName)
	}
}

// collect reads every metric of the reader.
func collect(t *testing.T, r *sdkmetric.ManualReader) []metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []metricdata.Metrics
	for _, sm := range rm.ScopeMetrics {
		out = append(out, sm.Metrics...)
	}
	return out
}

// sum returns the value of an integer sum metric, over the points that
// carry attr (all points when attr is nil).
func sum(t *testing.T, r *sdkmetric.ManualReader, name string, attr *attribute.KeyValue) int64 {
	t.Helper()
	var total int64
	for _, m := range collect(t, r) {
		if m.Name != name {
			continue
		}
		s, ok := m.Data.(metricdata.Sum[int64])
		if !ok {
			t.Fatalf("%s is %T", name, m.Data)
		}
		for _, p := range s.DataPoints {
			if attr != nil {
				if v, ok := p.Attributes.Value(attr.Key); !ok || v != attr.Value {
					continue
				}
			}
			total += p.Value
		}
	}
	return total
}

func histogramCount(t *testing.T, r *sdkmetric.ManualReader, name string) uint64 {
	t.Helper()
	var n uint64
	for _, m := range collect(t, r) {
		if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
			for _, p := range h.DataPoints {
				n += p.Count
			}
		}
	}
	return n
}
