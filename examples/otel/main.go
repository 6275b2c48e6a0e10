// Command otel shows sqllock's OpenTelemetry metrics and spans: three
// workers compete for one lock with TryDo, and the program prints what the
// in-process meter and tracer recorded. A real program gives otelsqllock.New
// its exporting providers (or none: the global ones).
//
//	cd examples/otel && go run .
//
// It uses the server in DATABASE_URL, or starts a throwaway PostgreSQL.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/otelsqllock"
	"github.com/sqllock/sqllock/pgtest"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	dsn, stop, err := pgtest.DatabaseURL(ctx, w)
	if err != nil {
		return err
	}
	defer stop()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()

	reader := sdkmetric.NewManualReader()
	spans := tracetest.NewSpanRecorder()
	obs, err := otelsqllock.New(
		otelsqllock.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otelsqllock.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))))
	if err != nil {
		return err
	}
	locker := sqllock.New(db, sqllock.WithObserver(obs))

	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			locker.TryDo(ctx, sqllock.Hash("cron:report"), func(context.Context) error {
				time.Sleep(100 * time.Millisecond)
				return nil
			})
		}()
	}
	wg.Wait()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s = %d", m.Name, attrs(p.Attributes), p.Value))
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s%s: %d samples", m.Name, attrs(p.Attributes), p.Count))
				}
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "spans: %d\n", len(spans.Ended()))
	return nil
}

// attrs formats a point's attributes as {key=value,...}.
func attrs(set attribute.Set) string {
	var kv []string
	for _, a := range set.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	return "{" + strings.Join(kv, ",") + "}"
}
