package core

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// TestFakeMixedBatchRefused: a mixed batch the server failed with a
// certain refusal (a full lock table) is settled as a batch of tries:
// the session is asked whether its unlocks ran (they did: the releases
// are confirmed), what the tries took is released, and the tries are
// refused; the session goes on. When its unlocks did not run, nothing is
// certain: the session ends, and its locks are lost.
func TestFakeMixedBatchRefused(t *testing.T) {
	for _, ran := range []bool{true, false} {
		name := "unlocks ran"
		if !ran {
			name = "unlocks did not run"
		}
		t.Run(name, func(t *testing.T) {
			fs := newFakeServer()
			p, _ := newFakePool(t, fs, Config{})
			h1 := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
			h2 := mustAcquire(t, bg, p, Request{Key: k(2), Try: true})
			h3 := mustAcquire(t, bg, p, Request{Key: k(3), Try: true})
			fs.on(&fakeRule{kind: fBatchMixed, times: 1, err: sqlState("53200"), afterRun: ran})
			stall := fs.stallNext(fUnlock)
			done := make(chan error, 1)
			go func() { _, err := h1.Release(); done <- err }()
			recv(t, stall.entered)
			var wg sync.WaitGroup
			var rerr error
			wg.Go(func() { _, rerr = h2.Release() })
			_, tries, twg := tryAll(t, bg, p, []Key{k(4)})
			fs.await(t, "a release and a try queued", func() bool { return queuedOps(p) == 2 })
			stall.release()
			if err := recv(t, done); err != nil {
				t.Fatal(err)
			}
			waitAll(t, &wg)
			waitAll(t, twg)
			wantErr(t, "the try of the failed batch", tries[k(4)], stmt.ErrLockTableFull)
			if fs.holder(k(4)) != 0 || fs.holder(k(2)) != 0 {
				t.Errorf("after the failed batch: 4 held by %d, 2 by %d", fs.holder(k(4)), fs.holder(k(2)))
			}
			if ran {
				if rerr != nil || h3.Err() != nil || fs.holder(k(3)) != h3.PID() || fs.count(fOwn) == 0 {
					t.Errorf("release %v, other lock %v: want the release confirmed, the session intact", rerr, h3.Err())
				}
				mustRelease(t, h3)
				return
			}
			if rerr == nil || errors.Is(rerr, stmt.ErrNotAcquired) {
				t.Errorf("release in the uncertain batch = %v, want its failure", rerr)
			}
			recv(t, h3.Done())
			wantErr(t, "the session's other lock", h3.Err(), stmt.ErrLockLost)
		})
	}
}

// TestFakeTriedLate: a dedicated session's try answered as its ctx ended
// (read within the grace the try gets) is not granted to the caller: a
// grant goes back before the call returns, and the session, intact, goes
// back to the pool. (An answer that comes after the grace leaves the
// session uncertain: it is discarded. Either way nothing stays held.)
func TestFakeTriedLate(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{Dedicated: true})
	mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(1), Try: true})) // the server check and the probe
	stall := fs.stallNext(fTry)
	ctx, cancel := context.WithCancel(bg)
	ch := acquireAsync(ctx, p, Request{Key: k(1), Try: true})
	recv(t, stall.entered)
	cancel()
	stall.release()
	a := recv(t, ch)
	wantErr(t, "try answered as its ctx ended", a.err, stmt.ErrNotAcquired, context.Canceled)
	fs.await(t, "the key free", func() bool { return fs.holder(k(1)) == 0 })
	if p.Stats().Discarded == 0 && fs.count(fUnlock) != 2 {
		t.Errorf("the session was kept, yet its grant was not unlocked (%d unlocks)", fs.count(fUnlock))
	}
	if p.Stats().Held != 0 {
		t.Errorf("Stats() = %+v, want nothing held", p.Stats())
	}
}

// TestFakeWaitedBefore: a waiting call on a connection that waited before
// (its backend known) goes straight to the line, with no try first.
func TestFakeWaitedBefore(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{Dedicated: true})
	other := fs.external()
	fs.lockAs(other, k(1), false)
	ch := acquireAsync(testCtx(t), p, Request{Key: k(1), Shared: true})
	fs.awaitCount(t, fSlice, 1)
	fs.unlockAs(other, k(1), false)
	a := recv(t, ch)
	if a.err != nil {
		t.Fatal(a.err)
	}
	pid := a.h.PID()
	mustRelease(t, a.h)
	n := len(fs.stmts())
	h := mustAcquire(t, testCtx(t), p, Request{Key: k(1), Shared: true})
	if got := kinds(fs.since(n)); h.PID() != pid || !equalKinds(got, []fkind{fRegister, fSlice}) {
		t.Errorf("on backend %d (waited on %d before): %v; want the line at once", h.PID(), pid, got)
	}
	if _, shared := fs.holders(k(1)); len(shared) != 1 || shared[0] != pid {
		t.Errorf("shared holders %v, want %d", shared, pid)
	}
	mustRelease(t, h)
}

// TestFakeServerCheck: the server check refuses servers that are not
// PostgreSQL, or too old, and tells a full lock table as such; a probe
// that fails with nothing learnt leaves the lock call to go on.
func TestFakeServerCheck(t *testing.T) {
	for _, tc := range []struct {
		version string
		code    string // the server check's error: "" none
		want    error
	}{
		{version: "PostgreSQL 11.22 on x86_64", want: stmt.ErrUnsupportedServer},
		{version: "MySQL 8.0", want: stmt.ErrUnsupportedServer},
		{version: "PostgreSQL 13.0 CockroachDB CCL v23.1", code: "42883", want: stmt.ErrUnsupportedServer},
		{version: "PostgreSQL 16.4", code: "53200", want: stmt.ErrLockTableFull},
	} {
		t.Run(tc.version, func(t *testing.T) {
			fs := newFakeServer()
			fs.version = tc.version
			if tc.code != "" {
				// Every check: a call whose shared session could not be
				// opened tries a session of its own, checked again.
				fs.failNext(fVersion, 0, tc.code)
			}
			p, _ := newFakePool(t, fs, Config{})
			_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
			wantErr(t, "lock", err, tc.want)
			if c := fs.counts(); c[fTry] != 0 {
				t.Errorf("statements %v: a lock statement was sent", c)
			}
		})
	}
	t.Run("probe failed", func(t *testing.T) {
		fs := newFakeServer()
		fs.failNext(fBackend, 1, "XX000")
		p, _ := newFakePool(t, fs, Config{})
		mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(1), Try: true}))
		if p.Pooled() != nil {
			t.Error("a failed probe statement was taken for a pooler")
		}
	})
}
