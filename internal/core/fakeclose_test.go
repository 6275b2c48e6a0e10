package core

import (
	"errors"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// TestFakeClose: Close makes the callers that wait leave (in the server's
// line, and in the Pool's queue) with ErrNotAcquired and ErrClosed,
// releases every lock the Pool holds (Holds on shared and dedicated
// sessions, an Owned's keys), confirming each unlock, and gives every
// session back as it came; later calls are refused with no statement.
func TestFakeClose(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	h1 := mustAcquire(t, ctx, p, Request{Key: k(1), Try: true})
	h2 := mustAcquire(t, ctx, p, Request{Key: k(2), Shared: true})
	o, err := p.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := o.TryLock(ctx, []Key{k(3), k(4)}); err != nil || len(got) != 2 {
		t.Fatalf("TryLock = %v, %v", got, err)
	}
	other := fs.external()
	fs.lockAs(other, k(9), false)
	head := acquireAsync(ctx, p, Request{Key: k(9)})
	queued := acquireAsync(ctx, p, Request{Key: k(9)})
	fs.await(t, "a caller in the server's line, one queued behind it", func() bool {
		return p.Probe().Queued(k(9)) == 2 && fs.count(fSlice) > 0
	})
	if err := p.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	for _, ch := range []<-chan acquired{head, queued} {
		a := recv(t, ch)
		wantErr(t, "a waiting call as the Pool closes", a.err, stmt.ErrNotAcquired, ErrClosed)
	}
	for _, h := range []*Hold{h1, h2} {
		wantErr(t, "Err of a lock Close released", h.Err(), stmt.ErrReleased, ErrClosed)
		if first, err := h.Release(); first || !errors.Is(err, stmt.ErrReleased) || !errors.Is(err, ErrClosed) {
			t.Errorf("Release after Close = %v, %v", first, err)
		}
	}
	wantErr(t, "Err of an Owned Close closed", o.Err(), stmt.ErrReleased, ErrClosed)
	if excl, _ := fs.holders(k(9)); fs.lockCount() != 1 || len(excl) != 1 || excl[0] != other {
		t.Errorf("%d locks left on the server; want only the other session's", fs.lockCount())
	}
	if pids := fs.liveMarked(); len(pids) != 0 || liveSessionCount(p) != 0 {
		t.Errorf("sessions %v still marked, %d live: want every one given back as it came", pids, liveSessionCount(p))
	}
	// (The head's wait, cancelled in the server as the Pool closed, is
	// uncertain: its session may be discarded.)
	if got := p.Stats(); got.Held != 0 || got.Lost != 0 || got.Discarded > 1 {
		t.Errorf("Stats() = %+v; want nothing held or lost, no session discarded but the head's", got)
	}
	n := len(fs.stmts())
	_, err = p.Acquire(ctx, Request{Key: k(5), Try: true})
	wantErr(t, "Acquire on a closed Pool", err, stmt.ErrNotAcquired, ErrClosed)
	_, err = p.AcquireSlot(ctx, NewSlots(7, 2, "sem"), true)
	wantErr(t, "AcquireSlot on a closed Pool", err, stmt.ErrNotAcquired, ErrClosed)
	if _, err := p.Open(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Open on a closed Pool = %v", err)
	}
	if len(fs.since(n)) != 0 {
		t.Errorf("calls on a closed Pool sent %v", kinds(fs.since(n)))
	}
}

// TestFakeCloseUnconfirmed: Close returns the error of an unlock that was
// not confirmed (the server releases the lock as the session ends).
func TestFakeCloseUnconfirmed(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	fs.steal(k(1))
	err := p.Close()
	wantErr(t, "Close with a lock found not held", err, stmt.ErrLockLost)
	wantErr(t, "Err of that lock", h.Err(), stmt.ErrLockLost)
}

// TestFakeSharedLinger: a shared session that holds nothing stays for the
// next lock (no round trip to open one); idle for its linger, it sets its
// settings back and goes back to the pool, and the next lock on that
// connection applies them again (with no new server check).
func TestFakeSharedLinger(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	pid := h.PID()
	mustRelease(t, h)
	h = mustAcquire(t, bg, p, Request{Key: k(2), Try: true})
	if h.PID() != pid || p.Stats().SharedSessions != 1 {
		t.Fatalf("the next lock on backend %d, want the lingering %d", h.PID(), pid)
	}
	mustRelease(t, h)
	fs.await(t, "the shared session to end", func() bool { return p.Stats().SharedSessions == 0 && fs.markOf(pid) == "" })
	if !fs.alive(pid) || fs.count(fReset) != 1 {
		t.Fatalf("backend %d alive %v, %d resets: want it reset and back in the pool", pid, fs.alive(pid), fs.count(fReset))
	}
	n := len(fs.stmts())
	h = mustAcquire(t, bg, p, Request{Key: k(3), Try: true})
	if got := kinds(fs.since(n)); h.PID() != pid || !equalKinds(got, []fkind{fTry}) || fs.markOf(pid) == "" {
		t.Errorf("a lock on the pooled connection: backend %d, statements %v; want one try on %d that applies the settings", h.PID(), got, pid)
	}
	mustRelease(t, h)
}

// TestFakeNoHandOver: a waiting call whose try ran on a shared session
// that carries another lock waits on a session of its own, and the
// shared session stays shared.
func TestFakeNoHandOver(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	h1 := mustAcquire(t, ctx, p, Request{Key: k(1)})
	other := fs.external()
	fs.lockAs(other, k(2), false)
	ch := acquireAsync(ctx, p, Request{Key: k(2)})
	fs.awaitCount(t, fSlice, 1)
	fs.unlockAs(other, k(2), false)
	a := recv(t, ch)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.h.PID() == h1.PID() || p.Probe().Conn(a.h) == nil || p.Stats().SharedSessions != 1 {
		t.Errorf("waited on backend %d (the shared one is %d, %d shared sessions): want a session of its own", a.h.PID(), h1.PID(), p.Stats().SharedSessions)
	}
	if fs.count(fVersion) != 2 {
		t.Errorf("%d server checks, want 2 (the shared session's, the waiter's)", fs.count(fVersion))
	}
	mustRelease(t, a.h)
	mustRelease(t, h1)
}
