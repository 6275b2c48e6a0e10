package core

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// acquireAsync runs Acquire in a goroutine; its outcome comes on the
// channel.
type acquired struct {
	h   *Hold
	err error
}

func acquireAsync(ctx context.Context, p *Pool, r Request) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		h, err := p.Acquire(ctx, r)
		ch <- acquired{h, err}
	}()
	return ch
}

// TestFakeWaitGranted: a call that finds its key held waits in the key's
// line on the shared session it tried on (handed over to it: it held
// nothing else), slice after slice (each ended by the server's
// lock_timeout), until the holder releases the key; granted, it holds no
// ticket of the line.
func TestFakeWaitGranted(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	other := fs.external()
	fs.lockAs(other, k(1), false)
	ch := acquireAsync(testCtx(t), p, Request{Key: k(1)})
	fs.awaitCount(t, fSlice, 3) // two slices ended, a third under way
	fs.unlockAs(other, k(1), false)
	a := recv(t, ch)
	if a.err != nil {
		t.Fatal(a.err)
	}
	c := fs.counts()
	if c[fPolite] != 1 || c[fWaitSlice] != 1 || c[fRegister] != 1 || c[fVersion] != 1 || c[fTry] != 0 {
		t.Errorf("statements %v: want one polite try, the slice asked, one registration, one server check", c)
	}
	polite := fs.stmts()
	for _, st := range polite {
		if st.kind == fPolite && st.pid != a.h.PID() {
			t.Errorf("waited on backend %d, tried on %d: want the shared session handed over", a.h.PID(), st.pid)
		}
	}
	if got := fs.heldBy(a.h.PID()); len(got) != 1 || got[0] != keyTag(k(1)) {
		t.Errorf("backend %d holds %v, want the key only (no ticket, no doorbell)", a.h.PID(), got)
	}
	if p.Probe().Conn(a.h) == nil || p.Stats().SharedSessions != 0 {
		t.Errorf("the lock is not on a session of its own (%d shared sessions)", p.Stats().SharedSessions)
	}
	mustRelease(t, a.h)
	if fs.markOf(a.h.PID()) != "" || !fs.alive(a.h.PID()) {
		t.Error("the session did not go back to the pool as it came")
	}
}

// TestFakeWaitLateGrant: a slice whose lock_timeout fires as the lock is
// granted fails, yet the session holds the key: the next slice finds it
// held and grants it.
func TestFakeWaitLateGrant(t *testing.T) {
	fs := newFakeServer()
	p, hooks := newFakePool(t, fs, Config{})
	other := fs.external()
	fs.lockAs(other, k(1), false)
	ch := acquireAsync(testCtx(t), p, Request{Key: k(1)})
	fs.awaitCount(t, fSlice, 1)
	fs.on(&fakeRule{kind: fSlice, times: 1, err: sqlState("55P03"), afterRun: true, when: func(*fakeStmt) bool {
		fs.unlockLocked(other, keyTag(k(1)), false) // freed as the slice starts: it is granted
		return true
	}})
	a := recv(t, ch)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if fs.holder(k(1)) != a.h.PID() || !hooks.logged(wait.LateGrant) {
		t.Errorf("held by %d, want %d; the late grant logged: %v", fs.holder(k(1)), a.h.PID(), hooks.logged(wait.LateGrant))
	}
	mustRelease(t, a.h)
}

// TestFakeWaitDeadline: a wait whose ctx has a deadline asks the server
// to end it just before: not granted, for sure (ErrNotAcquired and
// context.DeadlineExceeded), the line left and the session given back as
// it came.
func TestFakeWaitDeadline(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{Dedicated: true})
	fs.lockAs(fs.external(), k(1), false)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, err := p.Acquire(ctx, Request{Key: k(1)})
	wantErr(t, "wait past its deadline", err, stmt.ErrNotAcquired, context.DeadlineExceeded)
	if c := fs.counts(); c[fGiveUp] != 1 {
		t.Errorf("statements %v: want the line given up once", c)
	}
	if got := p.Stats(); got.TimedOut != 1 || got.Discarded != 0 {
		t.Errorf("Stats() = %+v; want 1 timed out, none discarded", got)
	}
	if len(fs.liveMarked()) != 0 || fs.lockCount() != 1 {
		t.Errorf("sessions %v marked, %d locks: want the line left (only the holder's lock)", fs.liveMarked(), fs.lockCount())
	}
}

// TestFakeWaitCancelled: a wait cancelled during a slice leaves its
// backend's wait (stopWait, from another connection) and the session
// is discarded (what it holds is unknown); a call cancelled as its
// registration answered leaves the line, its session intact.
func TestFakeWaitCancelled(t *testing.T) {
	for _, closes := range []bool{false, true} {
		name := "in a slice"
		if closes {
			name += ", the driver closing its connection"
		}
		t.Run(name, func(t *testing.T) {
			fs := newFakeServer()
			fs.cancelCloses = closes
			p, _ := newFakePool(t, fs, Config{Dedicated: true})
			fs.lockAs(fs.external(), k(1), false)
			ctx, cancel := context.WithCancel(bg)
			ch := acquireAsync(ctx, p, Request{Key: k(1)})
			fs.awaitCount(t, fSlice, 2)
			cancel()
			a := recv(t, ch)
			wantErr(t, "wait cancelled", a.err, stmt.ErrNotAcquired, context.Canceled)
			if c := fs.counts(); c[fCancelWait] == 0 || c[fTerminate] != 1 {
				t.Errorf("statements %v: want the backend's wait cancelled, and its grant checked", c)
			}
			if got := p.Stats(); got.Discarded != 1 || got.TimedOut != 0 {
				t.Errorf("Stats() = %+v; want the session discarded", got)
			}
			fs.await(t, "only the holder's lock left", func() bool { return fs.lockCount() == 1 })
		})
	}
	t.Run("as it registers", func(t *testing.T) {
		fs := newFakeServer()
		p, _ := newFakePool(t, fs, Config{})
		fs.lockAs(fs.external(), k(1), false)
		stall := fs.on(&fakeRule{kind: fRegister, times: 1, stall: make(chan struct{}), ignoreCtx: true})
		ctx, cancel := context.WithCancel(bg)
		ch := acquireAsync(ctx, p, Request{Key: k(1), Shared: true})
		recv(t, stall.entered)
		cancel()
		stall.release()
		a := recv(t, ch)
		wantErr(t, "wait cancelled", a.err, stmt.ErrNotAcquired, context.Canceled)
		if c := fs.counts(); c[fGiveUp] != 1 || c[fSlice] != 0 {
			t.Errorf("statements %v: want the line given up, no slice", c)
		}
		if got := p.Stats(); got.Discarded != 0 {
			t.Errorf("Stats() = %+v; want nothing discarded", got)
		}
		if len(fs.liveMarked()) != 0 || fs.lockCount() != 1 {
			t.Errorf("sessions %v marked, %d locks: want the line left", fs.liveMarked(), fs.lockCount())
		}
	})
}

// TestFakeWaitSliceErrors: a slice reported a deadlock (a holder's CREATE
// INDEX CONCURRENTLY waited for its snapshot) reads the slice's length
// again and waits on, counted in SnapshotWaits; a stray cancel is a slice
// that ended; any other failure ends the wait, uncertain.
func TestFakeWaitSliceErrors(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{Dedicated: true})
	other := fs.external()
	fs.lockAs(other, k(1), false)
	fs.failNext(fSlice, 1, "40P01")
	fs.failNext(fSlice, 1, "57014")
	ch := acquireAsync(testCtx(t), p, Request{Key: k(1)})
	fs.awaitCount(t, fSlice, 4)
	fs.unlockAs(other, k(1), false)
	a := recv(t, ch)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if got := p.Stats(); got.SnapshotWaits != 1 || fs.count(fWaitSlice) != 2 {
		t.Errorf("Stats() = %+v, %d reads of the slice; want 1 snapshot wait, the slice read again", got, fs.count(fWaitSlice))
	}
	mustRelease(t, a.h)

	fs.lockAs(other, k(1), false)
	fs.failNext(fSlice, 1, "XX000")
	_, err := p.Acquire(testCtx(t), Request{Key: k(1)})
	if err == nil || errors.Is(err, stmt.ErrNotAcquired) {
		t.Errorf("a wait whose slice failed: %v; want the failure", err)
	}
	if got := p.Stats(); got.Discarded != 1 {
		t.Errorf("Stats() = %+v; want the session discarded", got)
	}
}

// TestFakeLineOrder: waiters of two processes (two Pools) are served in
// the order they registered: the first waits for the key, the second for
// the first's ticket, then for the key, which the first is granted first.
func TestFakeLineOrder(t *testing.T) {
	fs := newFakeServer()
	p1, _ := newFakePool(t, fs, Config{})
	p2, _ := newFakePool(t, fs, Config{})
	other := fs.external()
	fs.lockAs(other, k(1), false)
	first := acquireAsync(testCtx(t), p1, Request{Key: k(1)})
	fs.awaitCount(t, fSlice, 1) // registered: its ticket taken
	second := acquireAsync(testCtx(t), p2, Request{Key: k(1)})
	fs.awaitCount(t, fRegister, 2)
	var pids []int64
	for _, st := range fs.stmts() {
		if st.kind == fRegister {
			pids = append(pids, st.pid)
		}
	}
	class := uint32(sqltext.TicketClass(k(1)))
	fs.await(t, "the first waiting for the key, the second for the first's ticket", func() bool {
		w1, ok1 := fs.waitingOn(pids[0])
		w2, ok2 := fs.waitingOn(pids[1])
		return ok1 && w1 == keyTag(k(1)) && ok2 && w2.sub == 2 && w2.c == class && w2.o != 0
	})
	fs.unlockAs(other, k(1), false)
	a := recv(t, first)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.h.PID() != pids[0] {
		t.Fatalf("granted to backend %d, want the first waiter's %d", a.h.PID(), pids[0])
	}
	fs.await(t, "the second waiting for the key", func() bool {
		w2, ok2 := fs.waitingOn(pids[1])
		return ok2 && w2 == keyTag(k(1))
	})
	mustRelease(t, a.h)
	b := recv(t, second)
	if b.err != nil || b.h.PID() != pids[1] {
		t.Fatalf("the second waiter: %v on backend %d, want %d", b.err, b.h.PID(), pids[1])
	}
	mustRelease(t, b.h)
}

// TestFakeWaitSliceAnsweredLate: a slice shorter than what is left of
// ctx ends on the server before the deadline; a loaded machine can read
// its answer a little past it. That answer is read, certain: the call is
// refused at its deadline and its session goes back to the pool, rather
// than cut at the deadline and discarded (every candidate that gave up on
// a loaded machine cost its session).
func TestFakeWaitSliceAnsweredLate(t *testing.T) {
	fs := newFakeServer()
	fs.sliceMS = 100
	p, _ := newFakePool(t, fs, Config{Dedicated: true})
	fs.lockAs(fs.external(), k(1), false)
	ctx, cancel := context.WithTimeout(bg, time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	// The first slice (100 ms, sent with most of the second left) starts
	// on the server once the deadline has passed, and is answered about
	// 120 ms past it.
	slice := fs.on(&fakeRule{kind: fSlice, times: 1, stall: make(chan struct{}), entered: make(chan *fakeStmt, 1)})
	go func() {
		<-slice.entered
		time.Sleep(time.Until(dl.Add(20 * time.Millisecond)))
		slice.release()
	}()
	_, err := p.Acquire(ctx, Request{Key: k(1)})
	wantErr(t, "wait whose slice answered past the deadline", err, stmt.ErrNotAcquired, context.DeadlineExceeded)
	if got := p.Stats(); got.Discarded != 0 {
		t.Errorf("Stats() = %+v; want none discarded", got)
	}
	if len(fs.liveMarked()) != 0 || fs.lockCount() != 1 {
		t.Errorf("sessions %v marked, %d locks: want the line left (only the holder's lock)", fs.liveMarked(), fs.lockCount())
	}
}
