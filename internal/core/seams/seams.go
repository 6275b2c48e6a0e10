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
	sets  []*Hooks   // what each Set still in force set, in order
)

// Set adds the hooks h sets (its non-nil ones) to those set before, and
// returns the func that takes them away again: tests that run in parallel
// may set the same hook, and each of their funcs runs, in the order they
// were set, until its own test restores.
func Set(h Hooks) (restore func()) {
	mu.Lock()
	defer mu.Unlock()
	mine := &h
	sets = append(sets, mine)
	hooks.Store(compose(sets))
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			for i, s := range sets {
				if s == mine {
					sets = append(sets[:i:i], sets[i+1:]...)
					break
				}
			}
			hooks.Store(compose(sets))
		})
	}
}

// compose returns the hooks that run every hook of sets in order (nil:
// none is set).
func compose(sets []*Hooks) *Hooks {
	if len(sets) == 0 {
		return nil
	}
	var blind []func(context.Context, error, func() bool)
	var slot []func(int32)
	var none []func()
	var asked []func(string, time.Time, bool, int64)
	for _, h := range sets {
		if h.AfterBlindStatement != nil {
			blind = append(blind, h.AfterBlindStatement)
		}
		if h.AfterSlotTry != nil {
			slot = append(slot, h.AfterSlotTry)
		}
		if h.MonitorFoundNone != nil {
			none = append(none, h.MonitorFoundNone)
		}
		if h.ObserveAsked != nil {
			asked = append(asked, h.ObserveAsked)
		}
	}
	var c Hooks
	if len(blind) > 0 {
		c.AfterBlindStatement = func(ctx context.Context, err error, left func() bool) {
			for _, f := range blind {
				f(ctx, err, left)
			}
		}
	}
	if len(slot) > 0 {
		c.AfterSlotTry = func(class int32) {
			for _, f := range slot {
				f(class)
			}
		}
	}
	if len(none) > 0 {
		c.MonitorFoundNone = func() {
			for _, f := range none {
				f()
			}
		}
	}
	if len(asked) > 0 {
		c.ObserveAsked = func(key string, sent time.Time, read bool, holder int64) {
			for _, f := range asked {
				f(key, sent, read, holder)
			}
		}
	}
	return &c
}

// Get returns the hooks set (nil: none).
func Get() *Hooks { return hooks.Load() }
