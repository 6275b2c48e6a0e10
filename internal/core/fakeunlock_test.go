package core

import (
	"errors"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// TestFakeUnlockNotHeld: an unlock the server certainly answers "not
// held" touches that one lock: its Release reports it lost (ErrLockLost,
// told to the hooks), the session's other lock stays held and is
// released as usual, and the session takes no new lock (the next one
// goes to another) and ends once it holds nothing.
func TestFakeUnlockNotHeld(t *testing.T) {
	fs := newFakeServer()
	p, hooks := newFakePool(t, fs, Config{})
	h1 := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	h2 := mustAcquire(t, bg, p, Request{Key: k(2), Try: true})
	fs.steal(k(1))
	first, err := h1.Release()
	if !first {
		t.Error("Release of a lock found not held: first = false")
	}
	wantErr(t, "Release of a lock found not held", err, stmt.ErrLockLost)
	if lost := hooks.eventsOf(EventLost); len(lost) != 1 || lost[0].Key != k(1) || lost[0].Hold != h1 {
		t.Errorf("loss events %+v, want one, of 1", lost)
	}
	if h2.Err() != nil || fs.holder(k(2)) != h2.PID() {
		t.Fatalf("the other lock: %v, held by %d", h2.Err(), fs.holder(k(2)))
	}
	h3 := mustAcquire(t, bg, p, Request{Key: k(3), Try: true})
	if h3.PID() == h2.PID() {
		t.Errorf("a new lock on the retiring session (backend %d)", h3.PID())
	}
	if got := p.Stats(); got.Lost != 1 || got.Held != 2 || got.Discarded != 0 {
		t.Errorf("Stats() = %+v; want 1 lost, 2 held, none discarded", got)
	}
	retired := h2.PID()
	mustRelease(t, h2)
	fs.await(t, "the retired session's settings set back", func() bool { return fs.markOf(retired) == "" })
	mustRelease(t, h3)
}

// TestFakeUnlockUncertain: an unlock whose answer is uncertain ends its
// session: the Release returns the error, every other lock on the session
// is reported lost, and the server releases them as the session ends.
func TestFakeUnlockUncertain(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule *fakeRule
		lost bool // the release itself reports a loss
	}{
		{"failed", &fakeRule{kind: fUnlock, times: 1, err: sqlState("XX000")}, false},
		{"connection lost after the unlock ran", &fakeRule{kind: fUnlock, times: 1, drop: true, afterRun: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFakeServer()
			p, hooks := newFakePool(t, fs, Config{})
			h1 := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
			h2 := mustAcquire(t, bg, p, Request{Key: k(2), Try: true})
			fs.on(tc.rule)
			first, err := h1.Release()
			if !first || err == nil || errors.Is(err, stmt.ErrLockLost) != tc.lost {
				t.Fatalf("Release = %v, %v; want an error, a loss: %v", first, err, tc.lost)
			}
			recv(t, h2.Done())
			wantErr(t, "Err of the session's other lock", h2.Err(), stmt.ErrLockLost)
			if first, err := h2.Release(); first || !errors.Is(err, stmt.ErrLockLost) {
				t.Errorf("Release of the lost lock = %v, %v", first, err)
			}
			wantLost := 1
			if tc.lost {
				wantLost = 2
			}
			if lost := hooks.eventsOf(EventLost); len(lost) != wantLost {
				t.Errorf("%d loss events, want %d", len(lost), wantLost)
			}
			if got := p.Stats(); got.Discarded != 1 || got.Held != 0 || got.Lost != int64(wantLost) {
				t.Errorf("Stats() = %+v; want 1 discarded, none held, %d lost", got, wantLost)
			}
			fs.await(t, "the session's locks to go with it", func() bool { return fs.holder(k(2)) == 0 })
			// The Pool goes on, on another session.
			mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(2), Try: true}))
		})
	}
}

// TestFakeDedicatedRelease: a dedicated session's release sets its
// settings back with its unlock and gives the connection back; an unlock
// that finds the lock not held discards it all the same.
func TestFakeDedicatedRelease(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{Dedicated: true})
	h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	pid := h.PID()
	if p.Probe().Conn(h) == nil || fs.markOf(pid) == "" {
		t.Fatal("a dedicated lock has no connection of its own, or no settings applied")
	}
	n := len(fs.stmts())
	mustRelease(t, h)
	if got := kinds(fs.since(n)); !equalKinds(got, []fkind{fUnlock}) || fs.markOf(pid) != "" || !fs.alive(pid) {
		t.Errorf("release: %v, mark %q, alive %v; want one unlock that sets the settings back, the backend kept", got, fs.markOf(pid), fs.alive(pid))
	}
	h = mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	if h.PID() != pid {
		t.Errorf("the next lock on backend %d, want the pooled %d", h.PID(), pid)
	}
	fs.steal(k(1))
	_, err := h.Release()
	wantErr(t, "release of a lock found not held", err, stmt.ErrLockLost)
	if fs.alive(pid) || p.Stats().Discarded != 1 {
		t.Errorf("the session of a lock found not held was given back (discarded %d)", p.Stats().Discarded)
	}
}
