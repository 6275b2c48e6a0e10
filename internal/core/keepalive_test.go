package core

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/seams"
)

// TestMonitorAddHeld: a Hold released or found lost before the
// keep-alive was told about it (a key handed on to a caller whose ctx
// ended at that moment: its Release removed nothing) is not watched; a
// held one is, until removed.
func TestMonitorAddHeld(t *testing.T) {
	p := (&Pool{cfg: Config{KeepAlive: time.Hour}}).link()
	m := newMonitor(p)
	watchedNow := func() int { return len(m.watchedNow()) }
	for _, st := range []holdState{holdReleasing, holdReleased, holdLost} {
		m.addHeld(&Hold{lifecycle: lifecycle{state: st}})
		if n := watchedNow(); n != 0 {
			t.Errorf("a Hold in state %d: %d watched, want 0", st, n)
		}
	}
	h := &Hold{lifecycle: lifecycle{state: holdHeld}}
	m.addHeld(h)
	if n := watchedNow(); n != 1 {
		t.Fatalf("a held Hold: %d watched, want 1", n)
	}
	m.remove(h)
	if n := watchedNow(); n != 0 {
		t.Errorf("after remove: %d watched, want 0", n)
	}
}

// seen is a watched thing the keep-alive only looks at: it holds no key.
type seen struct{ looks atomic.Int64 }

func (w *seen) heldKeys(buf []heldKey) []heldKey { return buf }
func (w *seen) lose(error)                       {}
func (w *seen) loseKey(Key, error)               {}
func (w *seen) leaseOf() *lease                  { w.looks.Add(1); return nil }
func (w *seen) touch(context.Context) error      { return nil }

// TestMonitorLoopNeverLost: the keep-alive's loop stops when nothing is
// watched and starts again when something is, whatever the interleaving
// with adds and removes from many goroutines: everything watched is
// looked at.
func TestMonitorLoopNeverLost(t *testing.T) {
	p := (&Pool{cfg: Config{KeepAlive: 20 * time.Microsecond}}).link()
	m := newMonitor(p)
	var wg sync.WaitGroup
	var looked atomic.Int64
	stop := time.Now().Add(300 * time.Millisecond)
	for g := range 2 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				w := &seen{}
				m.add(w)
				deadline := time.Now().Add(time.Second)
				for w.looks.Load() == 0 {
					if time.Now().After(deadline) {
						t.Errorf("goroutine %d, item %d: watched and not looked at in 1 s (running %v)", g, i, m.running.Load())
						return
					}
					runtime.Gosched()
				}
				m.remove(w)
				looked.Add(1)
				if i%3 == g%3 {
					time.Sleep(time.Duration(i%7) * 10 * time.Microsecond)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d things watched and looked at", looked.Load())

	// Added just as the loop found nothing, and before it stops: still
	// looked at.
	late := &seen{}
	var once sync.Once
	f := func() { once.Do(func() { m.add(late) }) }
	restore := seams.Set(seams.Hooks{MonitorFoundNone: f})
	defer restore()
	kick := &seen{}
	m.add(kick) // the loop runs again, if it had stopped
	m.remove(kick)
	deadline := time.Now().Add(2 * time.Second)
	for late.looks.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("added as the loop found nothing: not looked at in 2 s (running %v)", m.running.Load())
		}
		time.Sleep(100 * time.Microsecond)
	}
	m.remove(late)
	restore()
	deadline = time.Now().Add(2 * time.Second)
	for m.running.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the loop still runs 2 s after the last thing watched was removed")
		}
		time.Sleep(time.Millisecond)
	}
}
