package core

import (
	"testing"
	"time"
)

// TestMonitorAddHeld: a Hold released or found lost before the
// keep-alive was told about it (a key handed on to a caller whose ctx
// ended at that moment: its Release removed nothing) is not watched; a
// held one is, until removed.
func TestMonitorAddHeld(t *testing.T) {
	p := &Pool{cfg: Config{KeepAlive: time.Hour}}
	m := newMonitor(p)
	watchedNow := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.watched)
	}
	for _, st := range []holdState{holdReleasing, holdReleased, holdLost} {
		m.addHeld(&Hold{state: st})
		if n := watchedNow(); n != 0 {
			t.Errorf("a Hold in state %d: %d watched, want 0", st, n)
		}
	}
	h := &Hold{state: holdHeld}
	m.addHeld(h)
	if n := watchedNow(); n != 1 {
		t.Fatalf("a held Hold: %d watched, want 1", n)
	}
	m.remove(h)
	if n := watchedNow(); n != 0 {
		t.Errorf("after remove: %d watched, want 0", n)
	}
}
