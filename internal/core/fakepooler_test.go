package core

import (
	"errors"
	"strings"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// behindPooler makes every new connection of fs land on one server
// session, as a transaction pooler that hands out the session it released
// last does.
func (fs *fakeServer) behindPooler() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.oneBackend = fs.newBackendLocked()
}

// wantPoolerError fails the test unless err is the pooler guard's.
func wantPoolerError(t *testing.T, what string, err error) {
	t.Helper()
	wantErr(t, what, err, stmt.ErrSessionChanged)
	if !strings.Contains(err.Error(), "WithTransactionPooler") {
		t.Errorf("%s = %v: it does not say what to do", what, err)
	}
}

// TestFakePoolerProbe: two connections on one backend are a transaction
// pooler: the probe before the Pool's first lock finds it, the lock is
// refused before any lock statement is sent, and so is every later one.
func TestFakePoolerProbe(t *testing.T) {
	fs := newFakeServer()
	fs.behindPooler()
	p, hooks := newFakePool(t, fs, Config{})
	_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
	wantPoolerError(t, "lock behind a pooler", err)
	n := len(fs.stmts())
	_, err = p.Acquire(bg, Request{Key: k(2), Shared: true})
	wantPoolerError(t, "the next lock", err)
	if _, err := p.Open(bg); !errors.Is(err, stmt.ErrSessionChanged) {
		t.Errorf("Open behind a pooler = %v", err)
	}
	if c := fs.counts(); c[fTry] != 0 || c[fPolite] != 0 || c[fSession] != 0 || len(fs.since(n)) != 0 {
		t.Errorf("statements %v (%d after the first refusal): want no lock statement", c, len(fs.since(n)))
	}
	if p.Pooled() == nil || !hooks.logged("a transaction pooler is in the way") {
		t.Error("the pooler was not recorded, or not logged")
	}
}

// TestFakePoolerTwoConnections: with the probe off, the second
// connection's server check finds the first one's backend: the Pool sees
// a pooler, discards every session it has (their locks are lost, and
// freed on the server), and refuses the lock.
func TestFakePoolerTwoConnections(t *testing.T) {
	fs := newFakeServer()
	fs.behindPooler()
	p, _ := newFakePool(t, fs, Config{})
	p.Probe().SkipPoolerProbe()
	h1 := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	_, err := p.Acquire(bg, Request{Key: k(2), Shared: true}) // a session of its own
	wantPoolerError(t, "lock on a second connection to the same backend", err)
	recv(t, h1.Done())
	wantErr(t, "the first lock", h1.Err(), stmt.ErrLockLost, stmt.ErrSessionChanged)
	fs.await(t, "the first lock freed on the server", func() bool { return fs.holder(k(1)) == 0 })
	if fs.count(fStranded) == 0 {
		t.Error("the stranded server session was not freed with StrandedSQL")
	}
}

// TestFakePoolerOtherPID: a lock granted on another backend than its
// connection's server check found (the pooler moved it) is refused, and
// freed there before the call returns.
func TestFakePoolerOtherPID(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	p.Probe().SkipPoolerProbe()
	fs.on(&fakeRule{kind: fTry, times: 1, moveTo: true})
	_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
	wantPoolerError(t, "lock answered by another backend", err)
	if fs.holder(k(1)) != 0 {
		t.Errorf("the lock taken on the other backend is held by %d after the call", fs.holder(k(1)))
	}
	if c := fs.counts(); c[fBegin] == 0 || c[fStranded] == 0 || c[fCommit] == 0 {
		t.Errorf("statements %v: want the other backend freed in a transaction of its own", c)
	}
	if p.Pooled() == nil {
		t.Error("the pooler was not recorded")
	}
}

// TestFakePoolerUnlockElsewhere: an unlock that reached another backend
// (it ran nothing there, and answered no row) loses the session's locks,
// and the server session they stay on is freed before Release returns.
func TestFakePoolerUnlockElsewhere(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	h1 := mustAcquire(t, bg, p, Request{Key: k(1), Try: true})
	h2 := mustAcquire(t, bg, p, Request{Key: k(2), Try: true})
	fs.on(&fakeRule{kind: fUnlock, times: 1, moveTo: true})
	_, err := h1.Release()
	wantErr(t, "release answered by another backend", err, stmt.ErrLockLost, stmt.ErrSessionChanged)
	wantErr(t, "the session's other lock", h2.Err(), stmt.ErrLockLost)
	if fs.holder(k(1)) != 0 || fs.holder(k(2)) != 0 || fs.alive(h1.PID()) {
		t.Errorf("after the release: 1 held by %d, 2 by %d, backend %d alive %v; want it freed", fs.holder(k(1)), fs.holder(k(2)), h1.PID(), fs.alive(h1.PID()))
	}
}

// TestFakePoolerEvidence: a server check that meets a prepared statement
// of another client (SQLSTATE 26000), or a session carrying another
// Locker's owner mark, are evidence of a pooler.
func TestFakePoolerEvidence(t *testing.T) {
	t.Run("prepared statement", func(t *testing.T) {
		fs := newFakeServer()
		p, _ := newFakePool(t, fs, Config{})
		fs.failNext(fVersion, 1, "26000")
		_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
		wantPoolerError(t, "lock", err)
	})
	t.Run("foreign mark", func(t *testing.T) {
		fs := newFakeServer()
		p, _ := newFakePool(t, fs, Config{})
		p.Probe().SkipPoolerProbe()
		fs.on(&fakeRule{kind: fTry, times: 1, when: func(st *fakeStmt) bool {
			fs.backends[st.pid].mark = "another.locker" // under fs.mu
			return true
		}})
		_, err := p.Acquire(bg, Request{Key: k(1), Try: true})
		wantPoolerError(t, "lock on a session marked by another Locker", err)
		if fs.lockCount() != 0 {
			t.Error("a lock was taken on the foreign session")
		}
	})
}
