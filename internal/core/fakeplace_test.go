package core

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// ticketHolders returns the tickets of ticket class class held on the
// server, and their holders.
func (fs *fakeServer) ticketHolders(class int32) map[int32]int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	m := map[int32]int64{}
	for t, l := range fs.locks {
		if t.sub != 2 || t.c != uint32(class) || t.o == 0 {
			continue
		}
		for pid, n := range l.excl {
			if n > 0 {
				m[int32(t.o)] = pid
			}
		}
		for pid, n := range l.shared {
			if n > 0 {
				m[int32(t.o)] = pid
			}
		}
	}
	return m
}

// TestFakePlaceOrder: a caller queued behind its queue's head takes its
// place in the key's line as it queues (a ticket on a shared session: no
// session of its own), so that a waiter of another process that arrives
// later is served after it; once served, it gives its place back, and
// nothing of the line is left on the server.
func TestFakePlaceOrder(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	p2, _ := newFakePool(t, fs, Config{}) // another process
	ctx := testCtx(t)
	class := sqltext.TicketClass(k(1))
	other := fs.external()
	fs.lockAs(other, k(1), false)
	a0 := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "a0 in line", func() bool { return len(fs.ticketHolders(class)) == 1 })
	a1 := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "a1 in line", func() bool { return len(fs.ticketHolders(class)) == 2 })
	if c := fs.count(fRegister); c != 1 {
		t.Errorf("%d registrations, want the head's only", c)
	}
	b0 := acquireAsync(ctx, p2, Request{Key: k(1)})
	fs.await(t, "b0 in line", func() bool { return len(fs.ticketHolders(class)) == 3 })
	fs.unlockAs(other, k(1), false)
	for _, want := range []string{"a0", "a1", "b0"} {
		var who string
		var got acquired
		select {
		case got = <-a0:
			who = "a0"
		case got = <-a1:
			who = "a1"
		case got = <-b0:
			who = "b0"
		case <-time.After(time.Minute):
			t.Fatalf("no one served in a minute, want %s", want)
		}
		if got.err != nil {
			t.Fatalf("%s: %v", who, got.err)
		}
		if who != want {
			t.Errorf("%s served, want %s", who, want)
		}
		mustRelease(t, got.h)
	}
	fs.await(t, "no ticket left", func() bool { return len(fs.ticketHolders(class)) == 0 })
	if n := fs.count(fPlaceBack); n != fs.count(fPlace) || n == 0 {
		t.Errorf("%d places taken, %d given back", fs.count(fPlace), n)
	}
}

// TestFakePlaceLeave: a queued caller whose ctx ends gives its place back
// before it returns.
func TestFakePlaceLeave(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	class := sqltext.TicketClass(k(1))
	a := mustAcquire(t, testCtx(t), p, Request{Key: k(1)})
	ctx, cancel := context.WithCancel(bg)
	ch := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "the caller in line", func() bool { return len(fs.ticketHolders(class)) == 1 })
	cancel()
	wantErr(t, "queued caller whose ctx ended", recv(t, ch).err, stmt.ErrNotAcquired, context.Canceled)
	if got := fs.ticketHolders(class); len(got) != 0 || fs.count(fPlaceBack) != 1 {
		t.Errorf("after the caller left: tickets %v, %d given back; want none left, one given back", got, fs.count(fPlaceBack))
	}
	mustRelease(t, a)
}

// TestFakePlaceSessionLost: the shared session that holds a queued
// caller's place ends (its ticket goes with it); the caller is served
// all the same, and nothing is left.
func TestFakePlaceSessionLost(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	class := sqltext.TicketClass(k(1))
	other := fs.external()
	fs.lockAs(other, k(1), false)
	a0 := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "a0 in line", func() bool { return len(fs.ticketHolders(class)) == 1 })
	a1 := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "a1 in line", func() bool { return len(fs.ticketHolders(class)) == 2 })
	var placed int64
	for id, pid := range fs.ticketHolders(class) {
		if id > 1 {
			placed = pid
		}
	}
	fs.terminate(placed)
	fs.unlockAs(other, k(1), false)
	for _, ch := range []<-chan acquired{a0, a1} {
		got := recv(t, ch)
		if got.err != nil {
			t.Fatal(got.err)
		}
		mustRelease(t, got.h)
	}
	fs.await(t, "no ticket left", func() bool { return len(fs.ticketHolders(class)) == 0 && fs.holder(k(1)) == 0 })
}

// TestFakePlacesFollowQueue: tickets come from the server's clock, and run
// ahead of it when waiters come faster than one a millisecond; one given
// back then leaves a free ticket earlier than tickets taken before it. A
// caller queued behind the head takes a ticket after the head's all the
// same, so that the head never waits in line for the ticket of a caller
// queued behind it, which waits for the head: both are served, in queue
// order. Tickets are the clock modulo 2^32 as a signed int4: negative for
// half of the time, and wrapping around from the largest to the
// smallest; the line works alike, and no session is discarded for it.
func TestFakePlacesFollowQueue(t *testing.T) {
	for _, clock := range []int32{100, -100_000, math.MaxInt32 - 1} {
		t.Run(fmt.Sprint(clock), func(t *testing.T) {
			placesFollowQueue(t, clock)
		})
	}
}

// placesFollowQueue is TestFakePlacesFollowQueue with the clock standing
// still at clock.
func placesFollowQueue(t *testing.T, clock int32) {
	fs := newFakeServer()
	fs.ticketClock = func() int32 { return clock } // the clock stands still: tickets run ahead of it
	p, _ := newFakePool(t, fs, Config{})
	p2, _ := newFakePool(t, fs, Config{}) // another process
	ctx := testCtx(t)
	class := sqltext.TicketClass(k(1))
	other := fs.external()
	fs.lockAs(other, k(1), false)
	xctx, leave := context.WithCancel(ctx)
	x := acquireAsync(xctx, p2, Request{Key: k(1)})
	fs.await(t, "the other process's waiter in line", func() bool { return fs.ticketHolders(class)[clock] != 0 })
	a := acquireAsync(ctx, p, Request{Key: k(1)})
	fs.await(t, "a in line", func() bool { return fs.ticketHolders(class)[clock+1] != 0 })
	leave() // the clock's ticket is free again: earlier than a's
	wantErr(t, "the waiter that left", recv(t, x).err, stmt.ErrNotAcquired, context.Canceled)
	fs.await(t, "the clock's ticket given back", func() bool { return fs.ticketHolders(class)[clock] == 0 })
	c := acquireAsync(ctx, p, Request{Key: k(1)}) // queued behind a, with a place
	fs.await(t, "c in line", func() bool { return len(fs.ticketHolders(class)) == 2 })
	b := acquireAsync(ctx, p, Request{Key: k(1)}) // behind c
	fs.await(t, "b in line", func() bool { return len(fs.ticketHolders(class)) == 3 })
	if tickets := fs.ticketHolders(class); tickets[clock] != 0 || tickets[clock+2] == 0 || tickets[clock+3] == 0 {
		t.Errorf("tickets %v: want a's %d, then c's %d and b's %d, after a's", tickets, clock+1, clock+2, clock+3)
	}
	// a looks at the line again (a new slice) before the key is free.
	slices := fs.count(fSlice)
	fs.await(t, "a's next slice", func() bool { return fs.count(fSlice) > slices })
	fs.unlockAs(other, k(1), false)
	for _, w := range []struct {
		name string
		ch   <-chan acquired
	}{{"a", a}, {"c", c}, {"b", b}} {
		got := recv(t, w.ch)
		if got.err != nil {
			t.Fatalf("%s: %v", w.name, got.err)
		}
		mustRelease(t, got.h)
	}
	fs.await(t, "no ticket left", func() bool { return len(fs.ticketHolders(class)) == 0 })
	if n := p.Stats().Discarded; n != 0 {
		t.Errorf("%d sessions discarded, want none", n)
	}
	if n, back := fs.count(fPlace), fs.count(fPlaceBack); n != 2 || back != n {
		t.Errorf("%d places taken, %d given back; want c's and b's, each given back", n, back)
	}
}
