// Package seams holds the core's test hooks: functions a test may set to
// run at a named point of the core's work, the moment a race it tests
// turns on. They are the only test hooks in the core; what a test may
// read of a Pool, a Hold or an Owned, or make them do, is the core's
// Probe. Unset, a hook costs one atomic load where it would run.
package seams

import (
	"context"
	"sync/atomic"
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
}

var hooks atomic.Pointer[Hooks]

// Set makes h the hooks, and returns the func that sets back the ones it
// replaced.
func Set(h Hooks) (restore func()) {
	old := hooks.Swap(&h)
	return func() { hooks.Store(old) }
}

// Get returns the hooks set (nil: none).
func Get() *Hooks { return hooks.Load() }
