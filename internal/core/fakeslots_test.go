package core

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// TestFakeSlots: a semaphore's try takes the first free slot in one
// statement, each permit on a session of its own; with every slot held a
// try is refused, and a waiting call waits in the semaphore's line until
// a permit is released, then takes the slot freed.
func TestFakeSlots(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	sl := NewSlots(77, 2, "sem")
	var permits []*Hold
	for want := range int32(2) {
		h, err := p.AcquireSlot(ctx, sl, true)
		if err != nil {
			t.Fatal(err)
		}
		if h.Key() != (Key{Pair: true, Class: 77, ID: want}) || fs.holder(h.Key()) != h.PID() {
			t.Fatalf("permit %v on %d, want slot %d held there", h.Key(), h.PID(), want)
		}
		permits = append(permits, h)
	}
	if permits[0].PID() == permits[1].PID() {
		t.Error("two permits on one session")
	}
	_, err := p.AcquireSlot(ctx, sl, true)
	wantErr(t, "try with every slot held", err, stmt.ErrNotAcquired)
	if !strings.Contains(err.Error(), "all 2 slots of sem are held") {
		t.Errorf("error %q does not say every slot is held", err)
	}
	done := make(chan acquired, 1)
	go func() {
		h, err := p.AcquireSlot(ctx, sl, false)
		done <- acquired{h, err}
	}()
	fs.awaitCount(t, fSlotSlice, 2)
	freed := permits[1].Key()
	mustRelease(t, permits[1])
	a := recv(t, done)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.h.Key() != freed || fs.holder(freed) != a.h.PID() {
		t.Errorf("waited for permit %v on %d, want %v there", a.h.Key(), a.h.PID(), freed)
	}
	if got := fs.heldBy(a.h.PID()); len(got) != 1 {
		t.Errorf("the waiter's backend holds %v, want its slot only (no ticket, no doorbell)", got)
	}
	if c := fs.counts(); c[fSlotTry] != 4 || c[fRegister] != 1 {
		t.Errorf("statements %v: want 4 slot tries (3 at once, 1 polite) and one registration", c)
	}
	mustRelease(t, a.h)
	mustRelease(t, permits[0])
	if fs.lockCount() != 0 || len(fs.liveMarked()) != 0 {
		t.Errorf("%d locks left, sessions %v marked", fs.lockCount(), fs.liveMarked())
	}
}

// TestFakeSlotsLeave: a call that waits for a permit leaves the line
// when its ctx's deadline comes, its session intact.
func TestFakeSlotsLeave(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	sl := NewSlots(77, 1, "sem")
	h, err := p.AcquireSlot(testCtx(t), sl, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, err = p.AcquireSlot(ctx, sl, false)
	wantErr(t, "wait for a permit past its deadline", err, stmt.ErrNotAcquired, context.DeadlineExceeded)
	if c := fs.counts(); c[fSlotGiveUp] != 1 {
		t.Errorf("statements %v: want the line given up", c)
	}
	if got := p.Stats(); got.TimedOut != 1 || got.Discarded != 0 {
		t.Errorf("Stats() = %+v; want 1 timed out, none discarded", got)
	}
	mustRelease(t, h)
}
