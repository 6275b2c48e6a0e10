package core

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// The Pool's flows on the fake server (fakedb_test.go): through its
// exported API (NewPool, Acquire, Hold.Release, Open, Owned, AcquireSlot,
// Close, Stats, Hooks), counting the statements each one sends.

// testHooks records what a Pool tells its owner.
type testHooks struct {
	mu     sync.Mutex
	events []Event
	logs   []string
}

func (h *testHooks) Name(k Key) string { return keyString(k) }

func (h *testHooks) Event(e Event) {
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

func (h *testHooks) Log(_ context.Context, level slog.Level, msg string, _ Key, _ bool, _ ...slog.Attr) {
	h.mu.Lock()
	h.logs = append(h.logs, level.String()+" "+msg)
	h.mu.Unlock()
}

// eventsOf returns the events of kind told so far.
func (h *testHooks) eventsOf(kind EventKind) []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Event
	for _, e := range h.events {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// logged reports whether a log record contains s.
func (h *testHooks) logged(s string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.logs {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// newFakePool returns a Pool on a new pool of fs's connections, closed
// (and checked for statements the fake did not know) when the test ends.
func newFakePool(t *testing.T, fs *fakeServer, cfg Config) (*Pool, *testHooks) {
	t.Helper()
	if cfg.UnlockTimeout == 0 {
		cfg.UnlockTimeout = 10 * time.Second
	}
	h := &testHooks{}
	p := NewPool(fs.db(t), cfg, h)
	t.Cleanup(func() {
		p.Close()
		fs.checkKnown(t)
	})
	return p, h
}

// fakeBound bounds every wait of the fake-driven tests: generous for a
// loaded machine, it only ends a test whose Pool never answers.
const fakeBound = 20 * time.Second

// recv receives from ch, or fails the test after fakeBound.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(fakeBound):
		t.Fatalf("no answer within %v", fakeBound)
	}
	panic("unreachable")
}

// waitAll waits for wg, or fails the test after fakeBound.
func waitAll(t testing.TB, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	recv(t, done)
}

// bg is a context that never ends; ctx one that the test cancels as it
// ends (a caller's that can be cancelled, which makes the Pool's calls
// take their cancellable paths).
var bg = context.Background()

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// k is the bigint key v.
func k(v int64) Key { return Key{V: v} }

// mustAcquire takes r on p, or fails the test.
func mustAcquire(t *testing.T, ctx context.Context, p *Pool, r Request) *Hold {
	t.Helper()
	h, err := p.Acquire(ctx, r)
	if err != nil {
		t.Fatalf("Acquire(%s) = %v", keyString(r.Key), err)
	}
	return h
}

// mustRelease releases h, or fails the test.
func mustRelease(t *testing.T, h *Hold) {
	t.Helper()
	if first, err := h.Release(); !first || err != nil {
		t.Fatalf("Release(%s) = %v, %v; want true, nil", keyString(h.Key()), first, err)
	}
}

// wantErr fails the test unless err matches every target.
func wantErr(t *testing.T, what string, err error, targets ...error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want one matching %v", what, targets)
	}
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Fatalf("%s = %v, want it to match %v", what, err, target)
		}
	}
}

// TestFakeTryOnShared: an exclusive try opens a shared session with the
// server check, the pooler probe (the Pool's first) and one try statement, which applies the
// lock session's settings; its release is one unlock, and the session,
// once it lingered, sets its settings back and goes back to the pool.
func TestFakeTryOnShared(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	if h.PID() == 0 || fs.holder(k(1)) != h.PID() {
		t.Fatalf("held by backend %d, the server says %d", h.PID(), fs.holder(k(1)))
	}
	c := fs.counts()
	if c[fVersion] != 1 || c[fTry] != 1 || c[fBackend] < 4 || len(c) != 3 {
		t.Errorf("statements %v: want 1 server check, the probe's (two connections, twice or more), and 1 try", c)
	}
	if fs.markOf(h.PID()) == "" {
		t.Error("the try did not apply the lock session's settings (its owner mark)")
	}
	if got := p.Stats(); got.Held != 1 || got.Acquired != 1 || got.SharedSessions != 1 {
		t.Errorf("Stats() = %+v, want 1 held, 1 acquired, 1 shared session", got)
	}
	n := len(fs.stmts())
	mustRelease(t, h)
	if got := kinds(fs.since(n)); len(got) != 1 || got[0] != fUnlock {
		t.Errorf("the release sent %v, want one unlock", got)
	}
	if fs.lockCount() != 0 {
		t.Errorf("%d locks still held on the server", fs.lockCount())
	}
	fs.await(t, "the shared session to end after its linger", func() bool { return p.Stats().SharedSessions == 0 })
	fs.await(t, "its settings set back", func() bool { return len(fs.liveMarked()) == 0 })
	if fs.count(fReset) != 1 {
		t.Errorf("%d resets, want 1", fs.count(fReset))
	}
}
