package core

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"
)

// TestGateJoinOrShut: calls that join a shared session without the
// sharing's lock, and its end as it idles (closeGateIdle), exclude each other:
// either the session shut with no call in it, or every call that joined
// finds it open, whatever the interleaving.
func TestGateJoinOrShut(t *testing.T) {
	for round := range 2000 {
		s := (&session{}).link()
		var joined atomic.Int64
		var shut atomic.Bool
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				<-start
				if s.join() {
					joined.Add(1)
				}
			})
		}
		wg.Go(func() {
			<-start
			shut.Store(s.closeGateIdle())
		})
		close(start)
		wg.Wait()
		if shut.Load() == (joined.Load() > 0) {
			t.Fatalf("round %d: shut %v with %d calls joined", round, shut.Load(), joined.Load())
		}
		if got := s.users(); got != joined.Load() {
			t.Fatalf("round %d: users() = %d, want %d", round, got, joined.Load())
		}
		if shut.Load() && s.join() {
			t.Fatalf("round %d: a call joined a shut session", round)
		}
	}
}

// TestLingerSparesHandedOver: a shared session handed over to a waiter is
// the waiter's: the countdown that ends an idle shared session, fired as
// it was handed over, leaves it be.
func TestLingerSparesHandedOver(t *testing.T) {
	p := (&Pool{}).link()
	s := (&session{p: p, life: life{kind: kindShared}, backend: backend{pid: 1}, connHandle: connHandle{gone: make(chan struct{})}}).link()
	s.linger = time.AfterFunc(time.Hour, func() {})
	defer s.linger.Stop()
	s.idleAt = stmt.MonoNow() - int64(2*sessionLinger) // idle long enough to end
	p.share.all = []*session{s}
	if !s.handOver() {
		t.Fatal("handOver() = false for an idle shared session")
	}
	s.lingered()
	if s.armed {
		t.Error("the countdown was armed again on a session handed over")
	}
	s.closeIfIdle()
	if s.state != open || s.kind != kindDedicated {
		t.Fatalf("after its linger: state %d, kind %d; want it open and dedicated", s.state, s.kind)
	}
}

// TestSharedForNoneUsable: when every shared session is retiring and the
// pool has no room for another, a call takes a session of its own at once
// instead of waiting for one that nobody opens.
func TestSharedForNoneUsable(t *testing.T) {
	db, err := sql.Open("sqllock-core-stub", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(4) // room for one shared session
	p := (&Pool{Engine: wait.Engine{DB: db}}).link()
	s := (&session{p: p, life: life{kind: kindShared}, connHandle: connHandle{gone: make(chan struct{})}}).link()
	s.mu.Lock()
	s.setStateLocked(retiring, nil)
	s.mu.Unlock()
	p.share.all = []*session{s}
	p.share.published()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	got, err := p.sharedFor(ctx)
	if err == nil || got != nil || time.Since(start) > time.Second {
		t.Fatalf("sharedFor() = %v, %v after %v; want no session, at once", got, err, time.Since(start))
	}
}

// TestFakeTriesWhileSharedCloses: tries without a deadline, on a pool
// capped at 8, that arrive while the Pool's shared sessions are closing
// (they idled for their linger, and their resets are under way) wait for one to
// leave and open another: they do not each pin a session of their own,
// which would fill the pool with their locks, so that the next one waited
// for a connection for ever (hundreds of TryLocks stuck on a pool of 8).
func TestFakeTriesWhileSharedCloses(t *testing.T) {
	fs := newFakeServer()
	db := fs.db(t)
	db.SetMaxOpenConns(8)
	h := &testHooks{}
	p := NewPool(db, Config{UnlockTimeout: 10 * time.Second}, h)
	t.Cleanup(func() {
		p.Close()
		fs.checkKnown(t)
	})
	// Two shared sessions (the most a pool of 8 shares): more locks than
	// one takes.
	var first []*Hold
	for i := range sharedSpread + 1 {
		first = append(first, mustAcquire(t, bg, p, Request{Key: k(int64(1000 + i)), Try: true}))
	}
	if got := p.Stats().SharedSessions; got != 2 {
		t.Fatalf("%d shared sessions, want 2", got)
	}
	reset := fs.on(&fakeRule{kind: fReset, times: 2, stall: make(chan struct{}), entered: make(chan *fakeStmt, 2)})
	defer reset.release()
	for _, h := range first {
		mustRelease(t, h)
	}
	recv(t, reset.entered) // both idled, and are closing
	recv(t, reset.entered)
	const n = 40
	holds := make([]*Hold, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h, err := p.Acquire(bg, Request{Key: k(int64(100 + i)), Try: true})
			holds[i] = h
			errs <- err
		})
	}
	// The tries find no shared session that takes calls, and no room for
	// another: they wait for a closing one to leave (before, each took a session of its own,
	// holding a connection with its lock, until the pool was full).
	time.Sleep(200 * time.Millisecond)
	reset.release()
	waitAll(t, &wg)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Acquire() = %v", err)
		}
	}
	if st := db.Stats(); st.InUse > 2 {
		t.Errorf("%d of the pool's connections in use with %d locks held, want the shared sessions' (2 at most)", st.InUse, n)
	}
	for _, h := range holds {
		mustRelease(t, h)
	}
}

// TestFakeSlowOpeningSpreads: many tries at once on a fresh Pool whose
// first shared session opens at once and the others slowly (a loaded
// server accepting connections) do not all pile on the first while the
// others open: once it holds its share, the calls wait for the others
// (before, the least busy session took a few more at a time, without
// bound on its locks, as long as others were opening: 322 of 400 locks on
// one of 16 sessions).
func TestFakeSlowOpeningSpreads(t *testing.T) {
	fs := newFakeServer()
	db := fs.db(t)
	h := &testHooks{}
	p := NewPool(db, Config{UnlockTimeout: 10 * time.Second}, h)
	t.Cleanup(func() {
		p.Close()
		fs.checkKnown(t)
	})
	const n = 400
	holds := make([]*Hold, n)
	holds[0] = mustAcquire(t, bg, p, Request{Key: k(100), Try: true}) // the first shared session
	fs.mu.Lock()
	fs.connectGate, fs.connectFree = make(chan struct{}), fs.conns
	fs.mu.Unlock()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	// The calls arrive one after another (a loaded machine starting its
	// goroutines), while only the first session is open: each that found
	// it with few calls in flight used to join it.
	for i := 1; i < n; i++ {
		wg.Go(func() {
			h, err := p.Acquire(bg, Request{Key: k(int64(100 + i)), Try: true})
			holds[i] = h
			errs <- err
		})
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(100 * time.Millisecond)
	close(fs.connectGate)
	waitAll(t, &wg)
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Acquire() = %v", err)
		}
	}
	fs.mu.Lock()
	opened := fs.conns - fs.connectFree
	fs.mu.Unlock()
	if opened < 2 {
		t.Fatalf("%d connections opened once the gate opened, want several (the other shared sessions)", opened)
	}
	per := map[int64]int{}
	most := 0
	for _, h := range holds {
		per[h.PID()]++
		most = max(most, per[h.PID()])
	}
	t.Logf("%d locks on %d shared sessions, at most %d on one", n, len(per), most)
	if bound := sharedOverflow + sharedQueue; most > bound {
		t.Errorf("%d of %d locks on one shared session while others opened, want at most %d", most, n, bound)
	}
	for _, h := range holds {
		mustRelease(t, h)
	}
}
