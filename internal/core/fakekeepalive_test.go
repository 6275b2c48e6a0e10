package core

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// TestFakeKeepAlive: the keep-alive asks the server, in one statement for
// every lock, whether each is still granted to its backend: a lock
// released behind the Pool's back, or whose session ended, is reported
// lost (Err, Done, the hooks), and its session discarded; an Owned is lost
// whole.
func TestFakeKeepAlive(t *testing.T) {
	fs := newFakeServer()
	p, hooks := newFakePool(t, fs, Config{KeepAlive: 10 * time.Millisecond})
	ctx := testCtx(t)
	h1 := mustAcquire(t, ctx, p, Request{Key: k(1), Try: true})
	h2 := mustAcquire(t, ctx, p, Request{Key: k(2), Shared: true})
	o := openOwned(t, p)
	if _, err := o.TryLock(ctx, []Key{k(3)}); err != nil {
		t.Fatal(err)
	}
	fs.awaitCount(t, fKeepAlive, 2)
	if h1.Err() != nil || h2.Err() != nil || o.Err() != nil {
		t.Fatalf("lost with nothing wrong: %v, %v, %v", h1.Err(), h2.Err(), o.Err())
	}
	fs.steal(k(1))
	recv(t, h1.Done())
	wantErr(t, "a lock released behind the Pool's back", h1.Err(), stmt.ErrLockLost)
	if !strings.Contains(h1.Err().Error(), "no longer holds it") {
		t.Errorf("Err = %v: it does not say why", h1.Err())
	}
	fs.terminate(h2.PID())
	recv(t, h2.Done())
	wantErr(t, "a lock whose session ended", h2.Err(), stmt.ErrLockLost)
	if !strings.Contains(h2.Err().Error(), "ended") {
		t.Errorf("Err = %v: it does not say why", h2.Err())
	}
	fs.steal(k(3))
	recv(t, o.Done())
	wantErr(t, "an Owned whose key went", o.Err(), stmt.ErrLockLost)
	if got := p.Stats(); got.Lost != 3 || got.KeepAliveChecks < 2 {
		t.Errorf("Stats() = %+v; want 3 lost, 2 checks or more", got)
	}
	if len(hooks.eventsOf(EventKeepAlive)) < 2 || len(hooks.eventsOf(EventLost)) != 3 {
		t.Errorf("%d keep-alive events, %d losses", len(hooks.eventsOf(EventKeepAlive)), len(hooks.eventsOf(EventLost)))
	}
}

// TestFakeKeepAliveFails: checks that get no answer from the server
// twice in a row report every lock lost; one failure alone does not.
func TestFakeKeepAliveFails(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{KeepAlive: 10 * time.Millisecond})
	h := mustAcquire(t, testCtx(t), p, Request{Key: k(1), Try: true})
	fs.awaitCount(t, fKeepAlive, 1)
	fs.failNext(fKeepAlive, 2, "XX000") // the first check, and the one that asks again
	n := fs.count(fKeepAlive)
	fs.awaitCount(t, fKeepAlive, n+3)
	if h.Err() != nil {
		t.Fatalf("lost after one failed check: %v", h.Err())
	}
	fs.failNext(fKeepAlive, 4, "XX000")
	recv(t, h.Done())
	wantErr(t, "a lock the keep-alive could not confirm twice", h.Err(), stmt.ErrLockLost)
	if !strings.Contains(h.Err().Error(), "could not reach the server") {
		t.Errorf("Err = %v: it does not say why", h.Err())
	}
}

// TestFakeLease: on a server with idle_session_timeout, the sessions that
// hold locks are leased: one idle for a third of the orphan bound is
// touched, and stays held.
func TestFakeLease(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{KeepAlive: 20 * time.Millisecond, OrphanBound: 900 * time.Millisecond})
	ctx := testCtx(t)
	h := mustAcquire(t, ctx, p, Request{Key: k(1), Try: true})
	o := openOwned(t, p)
	if p.Probe().LeaseBusy(h) < 0 {
		t.Fatal("the lock's session is not leased")
	}
	fs.await(t, "both sessions touched", func() bool {
		touched := map[int64]bool{}
		for _, st := range fs.stmts() {
			if st.kind == fTouch {
				touched[st.pid] = true
			}
		}
		return touched[h.PID()] && touched[o.PID()]
	})
	if h.Err() != nil || o.Err() != nil {
		t.Errorf("lost while touched: %v, %v", h.Err(), o.Err())
	}
	n := len(fs.stmts())
	o.Conn() // handed out: not leased any more
	if got := kinds(fs.since(n)); countIn(fs.since(n), fNoIdle) != 1 {
		t.Errorf("handing the connection out sent %v, want the lease ended", got)
	}
	mustRelease(t, h)
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFakeTag: a statement about a held lock's tag (a fencing token) runs
// on its session; no row is the server's word that the lock is lost.
func TestFakeTag(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	h := mustAcquire(t, ctx, p, Request{Key: k(1), Try: true})
	t1, err := h.Tag(ctx, sqltext.TokenSQL)
	if err != nil {
		t.Fatal(err)
	}
	t2, err := h.Tag(ctx, sqltext.TokenSQL)
	if err != nil || t2 <= t1 {
		t.Errorf("tokens %d then %d (%v): want them growing", t1, t2, err)
	}
	if st := fs.stmts(); st[len(st)-1].pid != h.PID() {
		t.Errorf("the token was taken on backend %d, want the holder's %d", st[len(st)-1].pid, h.PID())
	}
	fs.steal(k(1))
	_, err = h.Tag(ctx, sqltext.HeldSQL)
	wantErr(t, "a statement about a lock found not held", err, stmt.ErrLockLost)
	wantErr(t, "Err of that lock", h.Err(), stmt.ErrLockLost)
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	if _, err := h.Tag(cancelled, sqltext.TokenSQL); !errors.Is(err, stmt.ErrLockLost) {
		t.Errorf("Tag of a lost lock = %v", err)
	}
}
