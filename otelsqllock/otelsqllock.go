// Package otelsqllock reports a sqllock Locker's locks as OpenTelemetry
// metrics and traces: sqllock's instrumentation, named as OpenTelemetry's
// own instrumentation packages are (otelhttp, otelsql), so that it and
// go.opentelemetry.io/otel are imported side by side without an alias.
// It is a module of its own, so that the sqllock package keeps to the
// standard library:
//
//	go get github.com/sqllock/sqllock/otelsqllock
//
//	obs, err := otelsqllock.New() // the global meter and tracer providers
//	if err != nil { ... }
//	locker := sqllock.New(db, sqllock.WithObserver(obs))
//
// Metrics (instrumentation scope [ScopeName]):
//
//	sqllock.locks.held             UpDownCounter  locks held now
//	sqllock.waiters                UpDownCounter  calls waiting for a lock now
//	sqllock.wait.duration          Histogram (s)  how long each lock call took, by outcome
//	sqllock.acquisitions           Counter        lock calls, by outcome: acquired, not_acquired, error
//	sqllock.locks.lost             Counter        held locks found lost
//	sqllock.connections.discarded  Counter        connections closed instead of returned to the pool
//	sqllock.keepalive.checks       Counter        keep-alive checks, by result: ok, failed
//
// Each lock call is a span, sqllock.acquire (sqllock.semaphore.acquire
// for a semaphore), with the key, its name, the mode and the outcome; a
// call that failed for another reason than contention has an error status.
package otelsqllock

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/sqllock/sqllock"
)

// ScopeName is the instrumentation scope of the Observer's meter and
// tracer: the package's import path.
const ScopeName = "github.com/sqllock/sqllock/otelsqllock"

// Observer is a sqllock.Observer that records metrics and spans. It is
// safe for concurrent use; give it to any number of Lockers.
type Observer struct {
	tracer trace.Tracer

	held, waiters        metric.Int64UpDownCounter
	wait                 metric.Float64Histogram
	acquisitions, lost   metric.Int64Counter
	discarded, keepAlive metric.Int64Counter
}

var _ sqllock.Observer = (*Observer)(nil)

// Option configures New.
type Option interface{ apply(*config) }

type config struct {
	mp metric.MeterProvider
	tp trace.TracerProvider
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithMeterProvider sets the meter provider (default: the global one).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithTracerProvider sets the tracer provider (default: the global one).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// New returns an Observer; it fails only when an instrument cannot be
// created.
func New(opts ...Option) (*Observer, error) {
	cfg := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for _, o := range opts {
		o.apply(&cfg)
	}
	m := cfg.mp.Meter(ScopeName)
	o := &Observer{tracer: cfg.tp.Tracer(ScopeName)}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	o.held, err = m.Int64UpDownCounter("sqllock.locks.held", metric.WithDescription("Locks held now."), metric.WithUnit("{lock}"))
	add(err)
	o.waiters, err = m.Int64UpDownCounter("sqllock.waiters", metric.WithDescription("Lock calls waiting now."), metric.WithUnit("{call}"))
	add(err)
	o.wait, err = m.Float64Histogram("sqllock.wait.duration", metric.WithDescription("How long each lock call took."), metric.WithUnit("s"))
	add(err)
	o.acquisitions, err = m.Int64Counter("sqllock.acquisitions", metric.WithDescription("Lock calls, by outcome."), metric.WithUnit("{call}"))
	add(err)
	o.lost, err = m.Int64Counter("sqllock.locks.lost", metric.WithDescription("Held locks found lost."), metric.WithUnit("{lock}"))
	add(err)
	o.discarded, err = m.Int64Counter("sqllock.connections.discarded", metric.WithDescription("Connections closed instead of returned to the pool."), metric.WithUnit("{connection}"))
	add(err)
	o.keepAlive, err = m.Int64Counter("sqllock.keepalive.checks", metric.WithDescription("Keep-alive checks, by result."), metric.WithUnit("{check}"))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// Outcomes of a lock call.
const (
	outcomeAcquired    = "acquired"
	outcomeNotAcquired = "not_acquired"
	outcomeError       = "error"
)

// AcquireStart implements sqllock.Observer: a span and, for a waiting
// call, a waiter, until the call ends.
func (o *Observer) AcquireStart(ctx context.Context, a sqllock.Acquisition) func(*sqllock.Lock, error) {
	name := "sqllock.acquire"
	attrs := []attribute.KeyValue{attribute.Bool("sqllock.wait", a.Wait), attribute.Bool("sqllock.shared", a.Shared)}
	if a.Key != (sqllock.Key{}) {
		attrs = append(attrs, attribute.String("sqllock.key", a.Key.String()))
	} else {
		name = "sqllock.semaphore.acquire"
	}
	if a.Name != "" {
		attrs = append(attrs, attribute.String("sqllock.name", a.Name))
	}
	_, span := o.tracer.Start(ctx, name, trace.WithAttributes(attrs...), trace.WithSpanKind(trace.SpanKindClient))
	if a.Wait {
		o.waiters.Add(ctx, 1)
	}
	start := time.Now()
	return func(lk *sqllock.Lock, err error) {
		outcome := outcomeAcquired
		switch {
		case errors.Is(err, sqllock.ErrNotAcquired):
			outcome = outcomeNotAcquired
		case err != nil:
			outcome = outcomeError
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		default:
			o.held.Add(ctx, 1)
		}
		set := metric.WithAttributes(attribute.String("sqllock.outcome", outcome))
		if a.Wait {
			o.waiters.Add(ctx, -1)
		}
		o.wait.Record(ctx, time.Since(start).Seconds(), set)
		o.acquisitions.Add(ctx, 1, set)
		span.SetAttributes(attribute.String("sqllock.outcome", outcome))
		span.End()
	}
}

// Event implements sqllock.Observer.
func (o *Observer) Event(ctx context.Context, e sqllock.Event) {
	switch e.Kind {
	case sqllock.EventReleased:
		o.held.Add(ctx, -1)
	case sqllock.EventLost:
		if e.Key != (sqllock.Key{}) {
			o.held.Add(ctx, -1)
		}
		o.lost.Add(ctx, 1)
	case sqllock.EventDiscarded:
		o.discarded.Add(ctx, 1)
	case sqllock.EventKeepAlive:
		result := "ok"
		if e.Err != nil {
			result = "failed"
		}
		o.keepAlive.Add(ctx, 1, metric.WithAttributes(attribute.String("sqllock.result", result)))
	}
}
