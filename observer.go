package sqllock

import (
	"context"
	"time"
)

// Observer receives a Locker's events: the hook that metrics and tracing
// (the module github.com/sqllock/sqllock/otelsqllock), or a program's own code,
// plug into; the logger of [WithLogger] is one too. Its methods are called
// synchronously, on the lock path: keep them fast, never block in them, and
// make them safe for concurrent use.
//
// A panic in an Observer (or in the logger's handler) is recovered: it is
// logged at Error level with its stack, counted in [Stats].ObserverPanics,
// and the lock call or release goes on as if the Observer had returned, so
// a lock is never left held or its handle in a false state because of
// it. [Stats] are updated before the observers are told.
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
	// EventReleased: a held lock was released (Held says for how long),
	// confirmed by the server, or by discarding its session when the
	// unlock statement failed (Err says why).
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
	Name     string // the key's registry name ("name[i]" for slot i of a registered semaphore)
	PID      int    // the backend of the lock or connection, when known
	Held     time.Duration
	Duration time.Duration
	// Err: why, for EventLost and EventDiscarded; the failed check for
	// EventKeepAlive; for EventReleased, nil when the server confirmed the
	// unlock, else why it could not (the connection was then discarded, and
	// the server releases the lock as the session ends).
	Err error
}

// WithObserver sends the Locker's events to o, as well as to its logger.
// It may be given several times.
func WithObserver(o Observer) Option {
	return optionFunc(func(c *config) { c.observers = append(c.observers, o) })
}
