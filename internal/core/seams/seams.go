// Package seams holds the core's test hooks: functions a test may set to
// run at a named point of the core's work, the moment a race it tests
// turns on. They are the only test hooks in the core; what a test may
// read of a Pool, a Hold or an Owned, or make them do, is the core's
// Probe. Unset, a hook costs one atomic load where it would run.
package seams

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Hooks are the core's test hooks; a nil one does not run.
type Hooks struct {
	// AfterBlindStatement runs after a statement on a blind driver
	// (lib/pq) returned and before its result is handed over: the moment
	// its caller may leave (see stmt.BoundedRaw). left reports whether
	// it did.
	AfterBlindStatement func(ctx context.Context, err error, left func() bool)
	// AfterSlotTry runs once a semaphore's try of its slots has been
	// answered and its caller's ctx read, with the slots' class.
	AfterSlotTry func(class int32)
	// MonitorFoundNone runs as a keep-alive loop finds nothing to watch,
	// before it stops.
	MonitorFoundNone func()
	// ObserveAsked runs after each of an election observer's asks on key
	// (its text) is answered: sent is when it was sent; read says whether
	// the answer counts as a reading of the key's holder, and holder is
	// then its backend pid (0: none).
	ObserveAsked func(key string, sent time.Time, read bool, holder int64)
}

var (
	hooks atomic.Pointer[Hooks]
	mu    sync.Mutex // serializes Set and its restores
)

// Set makes the hooks h sets (its non-nil ones) the hooks, beside those
// set before, and returns the func that sets back, of those, the ones it
// replaced: tests that run in parallel set hooks of their own.
func Set(h Hooks) (restore func()) {
	mu.Lock()
	defer mu.Unlock()
	var cur Hooks
	if p := hooks.Load(); p != nil {
		cur = *p
	}
	old := cur
	merge(&cur, h, h)
	hooks.Store(&cur)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		c := *hooks.Load()
		merge(&c, old, h)
		hooks.Store(&c)
	}
}

// merge sets in dst the hooks of from that which sets.
func merge(dst *Hooks, from, which Hooks) {
	if which.AfterBlindStatement != nil {
		dst.AfterBlindStatement = from.AfterBlindStatement
	}
	if which.AfterSlotTry != nil {
		dst.AfterSlotTry = from.AfterSlotTry
	}
	if which.MonitorFoundNone != nil {
		dst.MonitorFoundNone = from.MonitorFoundNone
	}
	if which.ObserveAsked != nil {
		dst.ObserveAsked = from.ObserveAsked
	}
}

// Get returns the hooks set (nil: none).
func Get() *Hooks { return hooks.Load() }
