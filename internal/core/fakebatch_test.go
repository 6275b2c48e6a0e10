package core

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// tryAll tries keys at once from a goroutine each, and returns their
// outcomes by key.
func tryAll(t *testing.T, ctx context.Context, p *Pool, keys []Key) (map[Key]*Hold, map[Key]error, *sync.WaitGroup) {
	t.Helper()
	var mu sync.Mutex
	holds, errs := map[Key]*Hold{}, map[Key]error{}
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			h, err := p.Acquire(ctx, Request{Key: key, Try: true})
			mu.Lock()
			holds[key], errs[key] = h, err
			mu.Unlock()
		})
	}
	return holds, errs, &wg
}

// TestFakeBatchedTries: tries of many goroutines that arrive while a
// shared session's statement runs meet in one batch statement: one round
// trip for them all, its answer read by position (the keys held elsewhere
// refused, the others granted, on the shared session's backend).
func TestFakeBatchedTries(t *testing.T) {
	for _, cancellable := range []bool{false, true} {
		name := "background"
		if cancellable {
			name = "cancellable" // the queue runs aside, on the session's runner goroutine
		}
		t.Run(name, func(t *testing.T) {
			fs := newFakeServer()
			p, _ := newFakePool(t, fs, Config{})
			ctx := bg
			if cancellable {
				ctx = testCtx(t)
			}
			first := mustAcquire(t, ctx, p, Request{Key: k(1), Try: true})
			other := fs.external()
			held := []Key{k(105), k(110)}
			for _, key := range held {
				fs.lockAs(other, key, false)
			}
			stall := fs.stallNext(fTry)
			var second *Hold
			done := make(chan error, 1)
			go func() {
				var err error
				second, err = p.Acquire(ctx, Request{Key: k(2), Try: true})
				done <- err
			}()
			recv(t, stall.entered)
			n := len(fs.stmts())
			var keys []Key
			for i := range 20 {
				keys = append(keys, k(100+int64(i)))
			}
			holds, errs, wg := tryAll(t, ctx, p, keys)
			fs.await(t, "20 tries queued behind the stalled one", func() bool { return queuedOps(p) == 20 })
			stall.release()
			if err := recv(t, done); err != nil {
				t.Fatalf("the stalled try: %v", err)
			}
			waitAll(t, wg)
			sent := fs.since(n)
			if got := kinds(sent); !slices.Equal(got, []fkind{fBatchTry}) || sent[0].keys != 20 || sent[0].pid != first.PID() {
				t.Fatalf("after the stalled try: %v (%d keys, backend %d); want one batch of 20 tries on backend %d", got, sent[0].keys, sent[0].pid, first.PID())
			}
			for _, key := range keys {
				refused := slices.Contains(held, key)
				switch h, err := holds[key], errs[key]; {
				case refused && (h != nil || !errors.Is(err, stmt.ErrNotAcquired)):
					t.Errorf("try of %s, held elsewhere: %v, %v; want ErrNotAcquired", keyString(key), h, err)
				case !refused && (err != nil || h.PID() != first.PID() || fs.holder(key) != first.PID()):
					t.Errorf("try of %s: %v; want it granted on backend %d (the server says %d)", keyString(key), err, first.PID(), fs.holder(key))
				}
			}
			if got := p.Stats(); got.Held != 20 || got.Contended != 2 || got.SharedSessions != 1 {
				t.Errorf("Stats() = %+v; want 20 held (1, 2 and 18 of the batch), 2 contended, 1 shared session", got)
			}
			if second.PID() != first.PID() {
				t.Errorf("the stalled try was granted on backend %d, want %d", second.PID(), first.PID())
			}
		})
	}
}

// TestFakeBatchOnFreshSession: a batch of tries on a shared session
// whose settings are not applied yet (its first try was refused) is
// preceded by the statement that applies them.
func TestFakeBatchOnFreshSession(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	other := fs.external()
	fs.lockAs(other, k(1), false)
	stall := fs.stallNext(fTry)
	done := make(chan error, 1)
	go func() {
		_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
		done <- err
	}()
	recv(t, stall.entered)
	n := len(fs.stmts())
	keys := []Key{k(2), k(3), k(4)}
	holds, errs, wg := tryAll(t, bg, p, keys)
	fs.await(t, "3 tries queued", func() bool { return queuedOps(p) == 3 })
	stall.release()
	wantErr(t, "the try of a key held elsewhere", recv(t, done), stmt.ErrNotAcquired)
	waitAll(t, wg)
	if got := kinds(fs.since(n)); !slices.Equal(got, []fkind{fSession, fBatchTry}) {
		t.Fatalf("after the refused try: %v; want the session's settings, then one batch", got)
	}
	for _, key := range keys {
		if errs[key] != nil || fs.holder(key) != holds[key].PID() {
			t.Errorf("try of %s: %v", keyString(key), errs[key])
		}
	}
}

// TestFakeBatchedUnlocks: releases that arrive while a shared session's
// statement runs are sent together, in one batch unlock; unlocks and
// tries that arrive together go in one mixed statement.
func TestFakeBatchedUnlocks(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	var hs []*Hold
	for i := range 11 {
		hs = append(hs, mustAcquire(t, bg, p, Request{Key: k(int64(i)), Try: true}))
	}
	pid := hs[0].PID()
	for _, h := range hs {
		if h.PID() != pid {
			t.Fatalf("locks on backends %d and %d: want one shared session", pid, h.PID())
		}
	}
	// Unlocks only.
	stall := fs.stallNext(fUnlock)
	done := make(chan error, 1)
	go func() { _, err := hs[0].Release(); done <- err }()
	recv(t, stall.entered)
	n := len(fs.stmts())
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := 1; i <= 5; i++ {
		wg.Go(func() { _, errs[i] = hs[i].Release() })
	}
	fs.await(t, "5 releases queued", func() bool { return queuedOps(p) == 5 })
	stall.release()
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	waitAll(t, &wg)
	sent := fs.since(n)
	if got := kinds(sent); !slices.Equal(got, []fkind{fBatchUnlock}) || sent[0].keys != 5 {
		t.Fatalf("after the stalled unlock: %v; want one batch of 5 unlocks", got)
	}
	for i := 0; i <= 5; i++ {
		if errs[i] != nil || fs.holder(k(int64(i))) != 0 {
			t.Errorf("release of %d: %v, held by %d", i, errs[i], fs.holder(k(int64(i))))
		}
	}
	// Unlocks and tries.
	stall = fs.stallNext(fUnlock)
	go func() { _, err := hs[6].Release(); done <- err }()
	recv(t, stall.entered)
	n = len(fs.stmts())
	mixed := p.Probe().MixedBatches()
	for i := 7; i <= 9; i++ {
		wg.Go(func() { _, errs[i-6] = hs[i].Release() })
	}
	holds, tries, twg := tryAll(t, bg, p, []Key{k(20), k(21)})
	fs.await(t, "3 releases and 2 tries queued", func() bool { return queuedOps(p) == 5 })
	stall.release()
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	waitAll(t, &wg)
	waitAll(t, twg)
	sent = fs.since(n)
	if got := kinds(sent); !slices.Equal(got, []fkind{fBatchMixed}) || sent[0].keys != 5 || p.Probe().MixedBatches() != mixed+1 {
		t.Fatalf("after the stalled unlock: %v (mixed batches %d → %d); want one mixed batch of 5 keys", got, mixed, p.Probe().MixedBatches())
	}
	for i := 7; i <= 9; i++ {
		if errs[i-6] != nil || fs.holder(k(int64(i))) != 0 {
			t.Errorf("release of %d: %v", i, errs[i-6])
		}
	}
	for _, key := range []Key{k(20), k(21)} {
		if tries[key] != nil || fs.holder(key) != pid {
			t.Errorf("try of %s: %v", keyString(key), tries[key])
		}
		mustRelease(t, holds[key])
	}
	mustRelease(t, hs[10])
	if got := p.Stats(); got.Held != 0 || got.Acquired != 13 {
		t.Errorf("Stats() = %+v; want nothing held, 13 acquired", got)
	}
}
