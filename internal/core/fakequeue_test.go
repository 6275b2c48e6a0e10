package core

import (
	"context"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// TestFakeQueueHandOff: a release with a caller queued for its key hands
// the key to that caller without a lock statement (the lock stays on its
// session, the release confirmed by one sign of life, and the caller
// gives back its place in line), when a check of the key's line found no
// one waiting in the server before the caller, within a short run after
// the server's grant; otherwise the
// release goes to the server, and the caller acquires from it. The run's
// bound is wall-clock time: attempts repeat until one hands off.
func TestFakeQueueHandOff(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	handed := false
	for attempt := 0; attempt < 100 && !handed; attempt++ {
		a := mustAcquire(t, ctx, p, Request{Key: k(1)})
		handoffs := p.Probe().HandOffs()
		bells := fs.count(fDoorbell)
		ch := acquireAsync(ctx, p, Request{Key: k(1)})
		fs.await(t, "the caller queued, and the doorbell checked", func() bool {
			return p.Probe().Queued(k(1)) == 1 && fs.count(fDoorbell) > bells
		})
		n := len(fs.stmts())
		mustRelease(t, a)
		b := recv(t, ch)
		if b.err != nil {
			t.Fatal(b.err)
		}
		sent := fs.since(n)
		if p.Probe().HandOffs() == handoffs+1 {
			handed = true
			if b.h.PID() != a.PID() || fs.holder(k(1)) != a.PID() {
				t.Errorf("handed on backend %d, the server says %d; want %d", b.h.PID(), fs.holder(k(1)), a.PID())
			}
			for _, st := range sent {
				// (The caller takes its place in line as it queues, which
				// may come after the doorbell was checked.)
				if st.kind != fDoorbell && st.kind != fAlive && st.kind != fPlace && st.kind != fPlaceBack {
					t.Errorf("the hand-off sent %v, want only signs of life and the caller's place taken and given back", kinds(sent))
					break
				}
			}
			if len(sent) == 0 {
				t.Error("the release that handed the key on was not confirmed by a statement")
			}
		} else if countIn(sent, fUnlock) != 1 || countIn(sent, fPolite)+countIn(sent, fTry) != 1 {
			t.Errorf("a release that did not hand the key on sent %v: want an unlock, then the caller's try", kinds(sent))
		}
		mustRelease(t, b.h)
	}
	if !handed {
		t.Fatal("no release handed its key on in 100 attempts")
	}
	if got := p.Stats(); got.Held != 0 {
		t.Errorf("Stats() = %+v; want nothing held", got)
	}
}

// TestFakeQueueNoHandOff: a caller that wants the key shared is never
// handed an exclusive one: the release goes to the server.
func TestFakeQueueNoHandOff(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	a := mustAcquire(t, ctx, p, Request{Key: k(1)})
	ch := acquireAsync(ctx, p, Request{Key: k(1), Shared: true})
	fs.await(t, "the reader queued", func() bool { return p.Probe().Queued(k(1)) == 1 })
	mustRelease(t, a)
	b := recv(t, ch)
	if b.err != nil {
		t.Fatal(b.err)
	}
	if _, shared := fs.holders(k(1)); p.Probe().HandOffs() != 0 || !b.h.Shared() || len(shared) != 1 {
		t.Errorf("%d hand-offs, shared %v (holders %v): want the reader served by the server", p.Probe().HandOffs(), b.h.Shared(), shared)
	}
	mustRelease(t, b.h)
}

// TestFakeQueueLeave: a caller whose ctx ends while it is queued leaves
// at once with ErrNotAcquired; the release then goes to the server.
func TestFakeQueueLeave(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	a := mustAcquire(t, testCtx(t), p, Request{Key: k(1)})
	ctx, cancel := context.WithCancel(bg)
	ch := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "the caller queued", func() bool { return p.Probe().Queued(k(1)) == 1 })
	cancel()
	b := recv(t, ch)
	wantErr(t, "queued caller whose ctx ended", b.err, stmt.ErrNotAcquired, context.Canceled)
	if p.Probe().Queued(k(1)) != 0 {
		t.Errorf("Queued = %d after the caller left, want 0", p.Probe().Queued(k(1)))
	}
	n := len(fs.stmts())
	mustRelease(t, a)
	if got := kinds(fs.since(n)); countIn(fs.since(n), fUnlock) != 1 || p.Probe().HandOffs() != 0 {
		t.Errorf("the release sent %v with %d hand-offs: want an unlock", got, p.Probe().HandOffs())
	}
}

// TestFakeQueueHandedAsCtxEnds: a caller handed the key as its ctx ends
// gives it back (to the next caller, or the server): it returns
// ErrNotAcquired, and nothing stays held. Which of the two races wins is
// the scheduler's: every attempt checks the outcome.
func TestFakeQueueHandedAsCtxEnds(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	for range 20 {
		a := mustAcquire(t, testCtx(t), p, Request{Key: k(1)})
		bells := fs.count(fDoorbell)
		ctx, cancel := context.WithCancel(bg)
		ch := acquireAsync(ctx, p, Request{Key: k(1)})
		fs.await(t, "the caller queued, and the doorbell checked", func() bool {
			return p.Probe().Queued(k(1)) == 1 && fs.count(fDoorbell) > bells
		})
		cancel()
		mustRelease(t, a)
		b := recv(t, ch)
		wantErr(t, "caller whose ctx ended", b.err, stmt.ErrNotAcquired, context.Canceled)
		fs.await(t, "the key free", func() bool { return fs.holder(k(1)) == 0 && p.Stats().Held == 0 && p.Probe().Queued(k(1)) == 0 })
	}
	t.Logf("%d of 20 callers were handed the key as their ctx ended", p.Probe().HandOffs())
}

// TestFakeQueueOneWaiter: callers of one Pool that wait for one key hold
// no session: only the queue's head waits in the server (one
// registration); a try of the key is refused at once, with no statement,
// while they wait; each gets the key in turn.
func TestFakeQueueOneWaiter(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	other := fs.external()
	fs.lockAs(other, k(1), false)
	ctx := testCtx(t)
	var chs []<-chan acquired
	for range 5 {
		chs = append(chs, acquireAsync(ctx, p, Request{Key: k(1)}))
	}
	fs.await(t, "5 callers queued", func() bool { return p.Probe().Queued(k(1)) == 5 })
	fs.awaitCount(t, fSlice, 1)
	n := len(fs.stmts())
	_, err := p.Acquire(ctx, Request{Key: k(1), Try: true})
	wantErr(t, "try of a key the Pool's callers wait for", err, stmt.ErrNotAcquired)
	if c := fs.counts(); c[fRegister] != 1 || c[fPolite] != 1 || countIn(fs.since(n), fTry) != 0 {
		t.Errorf("statements %v: want one caller in the server's line, and no statement for the try", c)
	}
	fs.unlockAs(other, k(1), false)
	for i := range 5 {
		// Whoever gets the key releases it; the next one gets it then.
		var got acquired
		select {
		case got = <-chs[0]:
		case got = <-chs[1]:
		case got = <-chs[2]:
		case got = <-chs[3]:
		case got = <-chs[4]:
		}
		if got.err != nil {
			t.Fatalf("caller %d: %v", i, got.err)
		}
		if fs.holder(k(1)) != got.h.PID() {
			t.Fatalf("granted on %d, the server says %d", got.h.PID(), fs.holder(k(1)))
		}
		mustRelease(t, got.h)
	}
	if got := p.Stats(); got.Acquired != 5 || got.Held != 0 {
		t.Errorf("Stats() = %+v; want 5 acquired, none held", got)
	}
}

// TestFakeQueueHolderLost: a holder whose session dies is found lost by
// the doorbell check a queued caller triggers; the caller, next in line,
// acquires from the server.
func TestFakeQueueHolderLost(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	a := mustAcquire(t, ctx, p, Request{Key: k(1)})
	fs.terminate(a.PID())
	b := recv(t, acquireAsync(ctx, p, Request{Key: k(1)}))
	if b.err != nil {
		t.Fatal(b.err)
	}
	wantErr(t, "the holder whose session died", a.Err(), stmt.ErrLockLost)
	if b.h.PID() == a.PID() || fs.holder(k(1)) != b.h.PID() {
		t.Errorf("granted on %d (the server says %d), want another backend than %d", b.h.PID(), fs.holder(k(1)), a.PID())
	}
	mustRelease(t, b.h)
}

// TestFakeQueueNoPassing: a release never hands its key past a waiter of
// another process: with someone in the key's line in the server (its
// doorbell rings), the release goes to the server, where that waiter,
// first in line, is served before the Pool's next caller.
func TestFakeQueueNoPassing(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	p2, _ := newFakePool(t, fs, Config{}) // another process
	ctx := testCtx(t)
	a := mustAcquire(t, ctx, p, Request{Key: k(1)})
	elsewhere := acquireAsync(ctx, p2, Request{Key: k(1)})
	fs.awaitCount(t, fSlice, 1) // in the line: its doorbell rings
	bells := fs.count(fDoorbell)
	mine := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "the caller queued, and the doorbell checked", func() bool {
		return p.Probe().Queued(k(1)) == 1 && fs.count(fDoorbell) > bells
	})
	mustRelease(t, a)
	if p.Probe().HandOffs() != 0 {
		t.Fatalf("%d hand-offs past a waiter of another process", p.Probe().HandOffs())
	}
	var e acquired
	select {
	case e = <-elsewhere:
	case m := <-mine:
		t.Fatalf("the Pool's next caller was served (%v) before the other process's waiter, first in line", m.err)
	}
	if e.err != nil {
		t.Fatal(e.err)
	}
	mustRelease(t, e.h)
	m := recv(t, mine)
	if m.err != nil {
		t.Fatal(m.err)
	}
	mustRelease(t, m.h)
}
