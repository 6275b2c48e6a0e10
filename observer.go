package sqllock

import (
	"context"
	"time"
)

// Observer receives a Locker's events: the hook that metrics and tracing
// (the module github.com/sqllock/sqllock/otel), or a program's own code,
// plug into, beside the logger of [WithLogger]. Its methods are called
// synchronously, on the lock path: keep them fast, never block in them, and
// make them safe for concurrent use.
type Observer interface {
	// AcquireStart is called as a lock call (Lock, TryLock, RLock,
	// TryRLock, Do, TryDo, a Semaphore's Acquire and TryAcquire) begins.
	// It returns the function called once as the call ends, with the Lock
	// when it was acquired and the error otherwise (one matching
	// ErrNotAcquired when the lock was held elsewhere or ctx ended).
	AcquireStart(ctx context.Context, a Acquisition) (end func(lk *Lock, err error))
	// Event is called for what happens after: a release, a loss, a
	// discarded connection, a keep-alive check.
	Event(ctx context.Context, e Event)
}

// Acquisition describes a lock call for [Observer.AcquireStart].
type Acquisition struct {
	Key    Key    // the key (a Semaphore's: the zero Key)
	Name   string // the key's registry name, or the Semaphore's name
	Wait   bool   // the call waits (Lock, RLock, Do, Acquire); false: a try
	Shared bool
}

// EventKind says what an [Event] reports.
type EventKind uint8

// The kinds of [Event].
const (
	// EventReleased: a held lock was released (Held says for how long).
	EventReleased EventKind = iota + 1
	// EventLost: a held lock was found lost (Err says why).
	EventLost
	// EventDiscarded: a connection was closed instead of going back to
	// the pool (Err says why).
	EventDiscarded
	// EventKeepAlive: one keep-alive check ran (Duration; Err when it got
	// no answer). A check skipped for a full pool is not reported.
	EventKeepAlive
)

// Event is something that happened to a Locker's locks or connections.
type Event struct {
	Kind     EventKind
	Key      Key    // EventReleased, EventLost, EventDiscarded (the zero Key for a Session's)
	Name     string // the key's registry name
	Held     time.Duration
	Duration time.Duration
	Err      error
}

// WithObserver sends the Locker's events to o, as well as to its logger.
// It may be given several times.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) { c.observers = append(c.observers, o) })
}

// observeAcquire tells the observers that a lock call begins, and returns
// the function to call as it ends (nil when there are none, so the lock
// path pays nothing).
func (l *Locker) observeAcquire(ctx context.Context, a Acquisition) func(*Lock, error) {
	switch len(l.cfg.observers) {
	case 0:
		return nil
	case 1:
		return l.cfg.observers[0].AcquireStart(ctx, a)
	}
	ends := make([]func(*Lock, error), 0, len(l.cfg.observers))
	for _, o := range l.cfg.observers {
		if end := o.AcquireStart(ctx, a); end != nil {
			ends = append(ends, end)
		}
	}
	return func(lk *Lock, err error) {
		for _, end := range ends {
			end(lk, err)
		}
	}
}

// observe sends e to the observers.
func (l *Locker) observe(ctx context.Context, e Event) {
	for _, o := range l.cfg.observers {
		o.Event(ctx, e)
	}
}
