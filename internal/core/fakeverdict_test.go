package core

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// TestFakeRefused: a try of a key another session holds is refused, the
// shared session it ran on intact: the next try runs there, with no new
// server check.
func TestFakeRefused(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	fs.lockAs(fs.external(), k(1), false)
	_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
	wantErr(t, "try of a key held elsewhere", err, stmt.ErrNotAcquired)
	if !strings.Contains(err.Error(), stmt.HeldElsewhere) {
		t.Errorf("error %q does not say the key %s", err, stmt.HeldElsewhere)
	}
	h := mustAcquire(t, bg, p, Request{Key: k(2), Try: true})
	if c := fs.counts(); c[fVersion] != 1 || c[fTry] != 2 {
		t.Errorf("statements %v: want 1 server check, 2 tries", c)
	}
	if got := p.Stats(); got.Contended != 1 || got.Discarded != 0 || got.Held != 1 {
		t.Errorf("Stats() = %+v; want 1 contended, none discarded, 1 held", got)
	}
	mustRelease(t, h)
}

// TestFakeStandby: on a standby, a lock granted is unwanted: released at
// once, and refused with ErrStandby (on a shared session, which is then
// discarded; on a dedicated one, given back as it came); with
// AllowStandby it is granted.
func TestFakeStandby(t *testing.T) {
	t.Run("shared", func(t *testing.T) {
		fs := newFakeServer()
		fs.standby = true
		p, _ := newFakePool(t, fs, Config{})
		_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
		wantErr(t, "try on a standby", err, stmt.ErrStandby)
		if fs.lockCount() != 0 {
			t.Errorf("%d locks held on the standby, want none", fs.lockCount())
		}
		if got := p.Stats(); got.Discarded != 1 || got.Held != 0 {
			t.Errorf("Stats() = %+v; want the session discarded, nothing held", got)
		}
	})
	for _, r := range []Request{{Key: k(1), Try: true}, {Key: k(1), Shared: true}} {
		t.Run("dedicated", func(t *testing.T) {
			fs := newFakeServer()
			fs.standby = true
			p, _ := newFakePool(t, fs, Config{Dedicated: true})
			_, err := p.Acquire(testCtx(t), r)
			wantErr(t, "lock on a standby", err, stmt.ErrStandby)
			if fs.lockCount() != 0 || len(fs.liveMarked()) != 0 {
				t.Errorf("%d locks held, sessions %v marked: want none", fs.lockCount(), fs.liveMarked())
			}
			if c := fs.counts(); c[fUnlock] != 1 || c[fRegister] != 0 {
				t.Errorf("statements %v: want the grant unlocked, and no wait", c)
			}
			if got := p.Stats(); got.Discarded != 0 || got.Contended != 0 {
				t.Errorf("Stats() = %+v; want nothing discarded or contended", got)
			}
		})
	}
	t.Run("allowed", func(t *testing.T) {
		fs := newFakeServer()
		fs.standby = true
		p, _ := newFakePool(t, fs, Config{AllowStandby: true})
		h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
		mustRelease(t, h)
	})
}

// TestFakeServerRefusals: a deadlock or a full lock table is a certain
// refusal: on a shared session, what the failed statement took is found
// and released, and the session goes on; on a dedicated session the
// connection is not given back (the statement may have taken the key
// before it failed).
func TestFakeServerRefusals(t *testing.T) {
	for _, tc := range []struct {
		code string
		want error
	}{{"40P01", stmt.ErrDeadlock}, {"53200", stmt.ErrLockTableFull}} {
		for _, afterRun := range []bool{false, true} {
			t.Run(tc.code, func(t *testing.T) {
				fs := newFakeServer()
				p, _ := newFakePool(t, fs, Config{})
				h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
				fs.on(&fakeRule{kind: fTry, times: 1, err: sqlState(tc.code), afterRun: afterRun})
				n := len(fs.stmts())
				_, err := p.Acquire(bg, Request{Key: k(2), Try: true})
				wantErr(t, "try that the server failed", err, tc.want)
				want := []fkind{fTry, fOwn}
				if afterRun {
					want = append(want, fUnlock) // the key it took, released
				}
				if got := kinds(fs.since(n)); !equalKinds(got, want) {
					t.Errorf("statements %v, want %v", got, want)
				}
				if fs.holder(k(2)) != 0 || fs.holder(k(1)) != h.PID() || h.Err() != nil {
					t.Errorf("after the refusal: 2 held by %d, 1 by %d (%v); want 2 free, 1 still held", fs.holder(k(2)), fs.holder(k(1)), h.Err())
				}
				mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(3), Try: true}))
				mustRelease(t, h)
				if got := p.Stats(); got.Discarded != 0 || got.Lost != 0 {
					t.Errorf("Stats() = %+v; want nothing discarded or lost", got)
				}
			})
		}
		t.Run(tc.code+" dedicated", func(t *testing.T) {
			fs := newFakeServer()
			p, _ := newFakePool(t, fs, Config{Dedicated: true})
			fs.on(&fakeRule{kind: fTry, times: 1, err: sqlState(tc.code), afterRun: true})
			_, err := p.Acquire(bg, Request{Key: k(2), Try: true})
			wantErr(t, "try that the server failed", err, tc.want)
			if got := p.Stats(); got.Discarded != 1 {
				t.Errorf("Stats() = %+v; want the session discarded", got)
			}
			fs.await(t, "the discarded session's lock to go", func() bool { return fs.lockCount() == 0 })
		})
	}
}

func equalKinds(a, b []fkind) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFakeUncertainTry: a try whose connection broke under it is
// uncertain: its shared session ends, every lock on it is reported lost
// (Err, Done, the hooks, Stats), and the call takes its key on a session
// of its own.
func TestFakeUncertainTry(t *testing.T) {
	fs := newFakeServer()
	p, hooks := newFakePool(t, fs, Config{})
	h1 := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	h2 := mustAcquire(t, bg, p, Request{Key: k(2), Try: true})
	fs.on(&fakeRule{kind: fTry, times: 1, drop: true})
	h3 := mustAcquire(t, bg, p, Request{Key: k(3), Try: true})
	if h3.PID() == h1.PID() || fs.holder(k(3)) != h3.PID() {
		t.Errorf("granted on backend %d (the server says %d), want a new one", h3.PID(), fs.holder(k(3)))
	}
	for _, h := range []*Hold{h1, h2} {
		select {
		case <-h.Done():
		default:
			t.Errorf("Done of %s not closed", keyString(h.Key()))
		}
		wantErr(t, "Err of a lock on the broken session", h.Err(), stmt.ErrLockLost)
		if first, err := h.Release(); first || !errors.Is(err, stmt.ErrLockLost) {
			t.Errorf("Release of a lost lock = %v, %v", first, err)
		}
	}
	if lost := hooks.eventsOf(EventLost); len(lost) != 2 {
		t.Errorf("%d loss events, want 2", len(lost))
	}
	if got := p.Stats(); got.Lost != 2 || got.Held != 1 || got.Discarded != 1 {
		t.Errorf("Stats() = %+v; want 2 lost, 1 held, 1 discarded", got)
	}
	if fs.holder(k(1)) != 0 || fs.holder(k(2)) != 0 {
		t.Error("the broken session's locks are still held on the server")
	}
	mustRelease(t, h3)
}

// TestFakeTryAbandoned: a caller whose ctx ends while its try is on the
// server leaves with ErrNotAcquired; the grant that comes after it left
// is undone by the session's runner, the session intact.
func TestFakeTryAbandoned(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	stall := fs.stallNext(fTry)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := p.Acquire(ctx, Request{Key: k(2), Try: true})
		done <- err
	}()
	recv(t, stall.entered)
	cancel()
	wantErr(t, "try whose ctx ended", recv(t, done), stmt.ErrNotAcquired, context.Canceled)
	n := len(fs.stmts())
	stall.release()
	fs.await(t, "the late grant to be undone", func() bool { return fs.holder(k(2)) == 0 && fs.count(fUnlock) == 1 })
	if got := kinds(fs.since(n)); !equalKinds(got, []fkind{fUnlock}) {
		t.Errorf("after the try: %v; want one unlock", got)
	}
	if h.Err() != nil || fs.holder(k(1)) != h.PID() {
		t.Errorf("the session's other lock: %v", h.Err())
	}
	// The key is free again, for the Pool too.
	mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(2), Try: true}))
	mustRelease(t, h)
}

// TestFakeTryLeftBeforeSent: a caller whose ctx ends while its try waits
// in the queue leaves it; the try is never sent.
func TestFakeTryLeftBeforeSent(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	h := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	stall := fs.stallNext(fUnlock)
	released := make(chan error, 1)
	go func() { _, err := h.Release(); released <- err }()
	recv(t, stall.entered)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := p.Acquire(ctx, Request{Key: k(2), Try: true})
		done <- err
	}()
	fs.await(t, "the try queued", func() bool { return queuedOps(p) == 1 })
	cancel()
	wantErr(t, "try whose ctx ended in the queue", recv(t, done), stmt.ErrNotAcquired, context.Canceled)
	stall.release()
	if err := recv(t, released); err != nil {
		t.Fatal(err)
	}
	if c := fs.counts(); c[fTry] != 1 || c[fBatchTry] != 0 || c[fBatchMixed] != 0 {
		t.Errorf("statements %v: the abandoned try was sent", c)
	}
	mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(2), Try: true}))
}

// TestFakeTrySole: a try whose ctx has no deadline, on a shared session
// that nothing else rides on, is run by its caller under ctx (runSole): a
// cancel cuts its statement, the caller leaves at once with
// ErrNotAcquired, and the session, which held nothing of anyone's, ends
// with it. The same try with a deadline waits aside: its ctx's end leaves
// the statement to the session's runner, which keeps the session and
// undoes the late grant (as beside a lock held on the session:
// TestFakeTryAbandoned).
func TestFakeTrySole(t *testing.T) {
	fs := newFakeServer()
	// An unlock timeout far longer than the test: a statement run aside
	// goes on until its answer.
	p, _ := newFakePool(t, fs, Config{UnlockTimeout: time.Hour})
	mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(1), Try: true})) // the shared session, set up
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	h := mustAcquire(t, ctx, p, Request{Key: k(2), Try: true})
	pid := h.PID()
	mustRelease(t, h)
	try := func(ctx context.Context, k Key) (*fakeRule, chan error) {
		stall := fs.stallNext(fTry)
		t.Cleanup(stall.release)
		done := make(chan error, 1)
		go func() {
			_, err := p.Acquire(ctx, Request{Key: k, Try: true})
			done <- err
		}()
		recv(t, stall.entered)
		return stall, done
	}
	_, done := try(ctx, k(3))
	cancel()
	wantErr(t, "a sole try cancelled", recv(t, done), stmt.ErrNotAcquired, context.Canceled)
	// Cut as the caller left.
	if got := p.Stats(); got.Discarded != 1 || got.Held != 0 || got.Lost != 0 {
		t.Errorf("Stats() as the caller left = %+v; want the one session discarded, nothing lost", got)
	}
	fs.await(t, "the cut session to end", func() bool { return !fs.alive(pid) })
	if fs.holder(k(3)) != 0 {
		t.Error("the cut try's key is held on the server")
	}
	// With a deadline: aside.
	h = mustAcquire(t, bg, p, Request{Key: k(3), Try: true}) // a new shared session
	pid = h.PID()
	mustRelease(t, h)
	dctx, dcancel := context.WithTimeout(bg, time.Hour)
	stall, done := try(dctx, k(4))
	dcancel()
	wantErr(t, "a try with a deadline cancelled", recv(t, done), stmt.ErrNotAcquired, context.Canceled)
	n := fs.count(fUnlock)
	stall.release()
	fs.await(t, "the late grant to be undone", func() bool { return fs.holder(k(4)) == 0 && fs.count(fUnlock) == n+1 })
	if got := p.Stats(); got.Discarded != 1 || !fs.alive(pid) {
		t.Errorf("Stats() = %+v, session alive %v; want the session kept", got, fs.alive(pid))
	}
	mustRelease(t, mustAcquire(t, bg, p, Request{Key: k(4), Try: true}))
}
