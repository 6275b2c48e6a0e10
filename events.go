package sqllock

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// One event path: every lock call and every event goes through tell and
// startAcquire, the core having updated Stats first, to the observers, the
// logger being one of them (logObserver). User code (an Observer, a
// slog.Handler) runs under recover: a panic in it is reported to the
// logger at Error level and never reaches the lock path, so a lock is
// never left held, and Stats never disagree with what observers were told.

// tell sends e, counted already, to the observers.
func (l *Locker) tell(ctx context.Context, e Event) {
	if len(l.observers) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for _, o := range l.observers {
		l.safely(func() { o.Event(ctx, e) })
	}
}

// startAcquire tells the observers that a lock call begins, and returns
// the function to call as it ends (nil when there are none, so the lock
// path pays nothing).
func (l *Locker) startAcquire(ctx context.Context, a Acquisition) func(*Lock, error) {
	if len(l.observers) == 0 {
		return nil
	}
	ends := make([]func(*Lock, error), 0, len(l.observers))
	for _, o := range l.observers {
		var end func(*Lock, error)
		l.safely(func() { end = o.AcquireStart(ctx, a) })
		if end != nil {
			ends = append(ends, end)
		}
	}
	return func(lk *Lock, err error) {
		for _, end := range ends {
			l.safely(func() { end(lk, err) })
		}
	}
}

// safely runs f, user code, and reports a panic in it to the logger
// instead of letting it unwind the lock path.
func (l *Locker) safely(f func()) {
	defer func() {
		if r := recover(); r != nil {
			l.stats.observerPanics.Add(1)
			l.logPanic(r)
		}
	}()
	f()
}

// logPanic reports a recovered panic of user code, unless the logger is
// what panicked.
func (l *Locker) logPanic(r any) {
	defer func() { _ = recover() }()
	l.cfg.logger.LogAttrs(context.Background(), slog.LevelError, "sqllock: an observer or log handler panicked; the lock path went on",
		slog.String("panic", fmt.Sprint(r)), slog.String("stack", string(debug.Stack())))
}

// log sends an event about key k (the zero Key: none) to the logger, if it
// takes events of that level. A panicking handler is recovered.
func (l *Locker) log(ctx context.Context, level slog.Level, msg string, k Key, attrs ...slog.Attr) {
	defer func() {
		if r := recover(); r != nil {
			l.stats.observerPanics.Add(1)
		}
	}()
	if !l.cfg.logger.Enabled(ctx, level) {
		return
	}
	if k.valid() == nil {
		attrs = append([]slog.Attr{slog.String("key", l.name(k))}, attrs...)
	}
	l.cfg.logger.LogAttrs(ctx, level, msg, attrs...)
}

// logObserver is the logger as an Observer: acquired (with the wait) and
// released (with the hold) at Debug level; lost locks, failed unlocks and
// discarded connections at Warn level.
type logObserver struct{ l *Locker }

func (o logObserver) AcquireStart(ctx context.Context, a Acquisition) func(*Lock, error) {
	if !o.l.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		return nil
	}
	start := time.Now()
	return func(lk *Lock, err error) {
		if lk == nil {
			return
		}
		o.l.log(ctx, slog.LevelDebug, "sqllock: acquired", lk.key,
			slog.Bool("shared", lk.h.Shared()), slog.Int64("pid", lk.h.PID()), slog.Duration("wait", time.Since(start)))
	}
}

func (o logObserver) Event(ctx context.Context, e Event) {
	switch {
	case e.Kind == EventReleased && e.Err == nil:
		o.l.log(ctx, slog.LevelDebug, "sqllock: released", e.Key, slog.Int("pid", e.PID), slog.Duration("held", e.Held))
	case e.Kind == EventReleased:
		o.l.log(ctx, slog.LevelWarn, "sqllock: unlock failed", e.Key, slog.Int("pid", e.PID), slog.Any("error", e.Err))
	case e.Kind == EventLost && e.Key == (Key{}):
		o.l.log(ctx, slog.LevelWarn, "sqllock: session lost", e.Key, slog.Int("pid", e.PID), slog.Any("error", e.Err))
	case e.Kind == EventLost:
		o.l.log(ctx, slog.LevelWarn, "sqllock: lock lost", e.Key, slog.Int("pid", e.PID), slog.Any("error", e.Err))
	case e.Kind == EventDiscarded:
		o.l.log(ctx, slog.LevelWarn, "sqllock: connection discarded", e.Key, slog.String("reason", e.Err.Error()))
	}
}
