package core

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// openOwned opens an Owned on p, or fails the test.
func openOwned(t *testing.T, p *Pool) *Owned {
	t.Helper()
	o, err := p.Open(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// sortedKeys returns keys sorted by value (bigint keys).
func sortedKeys(keys []Key) []Key {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, func(a, b Key) int { return int(a.V - b.V) })
	return keys
}

// TestFakeOwnedTryLockUnlock: an Owned's session is set up by one
// statement; TryLock takes the free keys of many in one statement (a key
// held already is not taken twice, a repeated one once); Unlock releases
// many in one, one in the single-key statement, and refuses a key not
// held with no statement; Close releases the rest and gives the session
// back as it came.
func TestFakeOwnedTryLockUnlock(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	o := openOwned(t, p)
	if c := fs.counts(); c[fSession] != 1 || fs.markOf(o.PID()) == "" {
		t.Fatalf("statements %v, mark %q: want the session set up by one statement", c, fs.markOf(o.PID()))
	}
	fs.lockAs(fs.external(), k(2), false)
	n := len(fs.stmts())
	got, err := o.TryLock(ctx, []Key{k(1), k(2), k(3), k(1)})
	if err != nil || !slices.Equal(got, []Key{k(1), k(3)}) {
		t.Fatalf("TryLock = %v, %v; want 1 and 3", got, err)
	}
	if sent := fs.since(n); !equalKinds(kinds(sent), []fkind{fBatchTry}) || sent[0].keys != 3 {
		t.Errorf("TryLock sent %v, want one batch of 3 keys", kinds(sent))
	}
	n = len(fs.stmts())
	if got, err := o.TryLock(ctx, []Key{k(3)}); err != nil || !slices.Equal(got, []Key{k(3)}) || len(fs.since(n)) != 0 {
		t.Errorf("TryLock of a key held = %v, %v, %d statements; want it, and no statement", got, err, len(fs.since(n)))
	}
	if held := sortedKeys(o.Held()); !slices.Equal(held, []Key{k(1), k(3)}) {
		t.Errorf("Held = %v", held)
	}
	if got := p.Stats(); got.Held != 2 || got.Contended != 1 {
		t.Errorf("Stats() = %+v; want 2 held, 1 contended", got)
	}
	if err := o.Unlock([]Key{k(2)}); err == nil || !strings.Contains(err.Error(), "not held") || len(fs.since(n)) != 0 {
		t.Errorf("Unlock of a key not held = %v; want an error, and no statement", err)
	}
	if err := o.Unlock([]Key{k(1), k(1)}); err != nil {
		t.Fatal(err)
	}
	if got := kinds(fs.since(n)); !equalKinds(got, []fkind{fUnlock}) || fs.holder(k(1)) != 0 {
		t.Errorf("Unlock of one key sent %v", got)
	}
	if _, err := o.TryLock(ctx, []Key{k(4), k(5)}); err != nil {
		t.Fatal(err)
	}
	n = len(fs.stmts())
	if err := o.Unlock([]Key{k(4), k(5)}); err != nil {
		t.Fatal(err)
	}
	if sent := fs.since(n); !equalKinds(kinds(sent), []fkind{fBatchUnlock}) || sent[0].keys != 2 {
		t.Errorf("Unlock of two keys sent %v", kinds(sent))
	}
	pid := o.PID()
	n = len(fs.stmts())
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if got := kinds(fs.since(n)); !equalKinds(got, []fkind{fUnlock, fReset}) || fs.lockCount() != 1 || fs.markOf(pid) != "" || !fs.alive(pid) {
		t.Errorf("Close sent %v; %d locks left, mark %q: want its key unlocked, its settings reset, the session back in the pool", got, fs.lockCount(), fs.markOf(pid))
	}
	select {
	case <-o.Done():
	default:
		t.Error("Done not closed by Close")
	}
	if err := o.Close(); !errors.Is(err, stmt.ErrReleased) {
		t.Errorf("second Close = %v", err)
	}
	if _, err := o.TryLock(ctx, []Key{k(6)}); !errors.Is(err, stmt.ErrReleased) {
		t.Errorf("TryLock after Close = %v", err)
	}
}

// TestFakeOwnedLock: an Owned's Lock waits in one statement (its waits
// stay visible to the server's deadlock detector) until the key is free;
// a deadline the server keeps ends the wait with ErrNotAcquired and
// context.DeadlineExceeded, the Owned intact; a cancelled wait loses the
// Owned and every lock on it.
func TestFakeOwnedLock(t *testing.T) {
	fs := newFakeServer()
	p, hooks := newFakePool(t, fs, Config{})
	o := openOwned(t, p)
	other := fs.external()
	fs.lockAs(other, k(1), false)
	done := make(chan error, 1)
	go func() { done <- o.Lock(testCtx(t), k(1)) }()
	fs.awaitCount(t, fWait, 1)
	fs.await(t, "the wait on the key", func() bool { w, ok := fs.waitingOn(o.PID()); return ok && w == keyTag(k(1)) })
	fs.unlockAs(other, k(1), false)
	if err := recv(t, done); err != nil {
		t.Fatal(err)
	}
	if fs.holder(k(1)) != o.PID() || fs.count(fWait) != 1 || fs.count(fRegister) != 0 {
		t.Errorf("after Lock: held by %d, %d waits: want one wait statement on %d", fs.holder(k(1)), fs.count(fWait), o.PID())
	}
	n := len(fs.stmts())
	if err := o.Lock(testCtx(t), k(1)); err != nil || len(fs.since(n)) != 0 {
		t.Errorf("Lock of a key held = %v with %d statements; want nil, none", err, len(fs.since(n)))
	}

	fs.lockAs(other, k(2), false)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	err := o.Lock(ctx, k(2))
	wantErr(t, "Lock past its deadline", err, stmt.ErrNotAcquired, context.DeadlineExceeded)
	if o.Err() != nil || fs.holder(k(1)) != o.PID() || fs.count(fGranted) != 1 {
		t.Errorf("after the deadline: Err %v, 1 held by %d, %d grant checks; want the Owned intact, its grant checked", o.Err(), fs.holder(k(1)), fs.count(fGranted))
	}
	if got := p.Stats(); got.TimedOut != 1 {
		t.Errorf("Stats() = %+v; want 1 timed out", got)
	}

	ctx, cancel = context.WithCancel(bg)
	go func() { done <- o.Lock(ctx, k(2)) }()
	fs.await(t, "the wait on 2", func() bool { w, ok := fs.waitingOn(o.PID()); return ok && w == keyTag(k(2)) })
	cancel()
	wantErr(t, "Lock cancelled", recv(t, done), stmt.ErrNotAcquired, context.Canceled)
	recv(t, o.Done())
	wantErr(t, "Err of the Owned", o.Err(), stmt.ErrLockLost)
	if lost := hooks.eventsOf(EventLost); len(lost) != 1 || !lost[0].Owned || lost[0].N != 1 {
		t.Errorf("loss events %+v, want one of the Owned's 1 lock", lost)
	}
	fs.await(t, "its lock freed with its session", func() bool { return fs.holder(k(1)) == 0 })
	if err := o.Close(); !errors.Is(err, stmt.ErrLockLost) {
		t.Errorf("Close of a lost Owned = %v", err)
	}
}

// TestFakeOwnedFailures: a full lock table fails TryLock, what the
// statement took released and the Owned intact; an unlock found not held
// loses the Owned; a TryLock whose ctx ends during its statement loses
// it too (what it took is unknown).
func TestFakeOwnedFailures(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	ctx := testCtx(t)
	o := openOwned(t, p)
	if _, err := o.TryLock(ctx, []Key{k(1)}); err != nil {
		t.Fatal(err)
	}
	fs.on(&fakeRule{kind: fBatchTry, times: 1, err: sqlState("53200"), afterRun: true})
	_, err := o.TryLock(ctx, []Key{k(2), k(3)})
	wantErr(t, "TryLock on a full lock table", err, stmt.ErrLockTableFull)
	if o.Err() != nil || fs.holder(k(2)) != 0 || fs.holder(k(3)) != 0 || fs.holder(k(1)) != o.PID() {
		t.Errorf("after the refusal: Err %v; 2 held by %d, 3 by %d: want them released, the Owned intact", o.Err(), fs.holder(k(2)), fs.holder(k(3)))
	}

	stall := fs.stallNext(fBatchTry)
	tctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { _, err := o.TryLock(tctx, []Key{k(4), k(5)}); done <- err }()
	recv(t, stall.entered)
	cancel()
	wantErr(t, "TryLock cancelled during its statement", recv(t, done), stmt.ErrNotAcquired, context.Canceled)
	wantErr(t, "Err of the Owned", o.Err(), stmt.ErrLockLost)
	fs.await(t, "its locks freed with its session", func() bool { return fs.lockCount() == 0 })

	o = openOwned(t, p)
	if _, err := o.TryLock(ctx, []Key{k(1), k(2)}); err != nil {
		t.Fatal(err)
	}
	fs.steal(k(1))
	err = o.Unlock([]Key{k(1), k(2)})
	wantErr(t, "Unlock of a key found not held", err, stmt.ErrLockLost)
	wantErr(t, "Err of the Owned", o.Err(), stmt.ErrLockLost)
	if got := p.Stats(); got.Discarded != 2 {
		t.Errorf("Stats() = %+v; want both sessions discarded", got)
	}
}

// TestFakeOwnedConn: an Owned whose connection was handed to the caller
// closes it, rather than give it back to the pool.
func TestFakeOwnedConn(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	o := openOwned(t, p)
	if o.Conn() == nil {
		t.Fatal("Conn() = nil")
	}
	pid := o.PID()
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if fs.alive(pid) {
		t.Error("the connection handed to the caller went back to the pool")
	}
}

// TestFakeOpenStandby: an Owned is refused on a standby, and its session
// goes back as it came; with AllowStandby it opens.
func TestFakeOpenStandby(t *testing.T) {
	fs := newFakeServer()
	fs.standby = true
	p, _ := newFakePool(t, fs, Config{})
	_, err := p.Open(bg)
	wantErr(t, "Open on a standby", err, stmt.ErrStandby)
	if len(fs.liveMarked()) != 0 || p.Stats().Discarded != 0 {
		t.Errorf("sessions %v still marked: want the session reset and given back", fs.liveMarked())
	}
	p2, _ := newFakePool(t, fs, Config{AllowStandby: true})
	o := openOwned(t, p2)
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFakeOwnedLockRefusedAfterGrant: a wait statement of an Owned's Lock
// that the server failed with a certain refusal (a full lock table, a
// deadlock) after it was granted the key (the statement applies the
// session's settings after the grant, and a session-level lock outlives
// the failed statement: settle guards a Pool's sessions against it) must
// not leave the key held, unknown, on the Owned's session: the key is
// released (or the Owned lost), and the connection never goes back to
// the pool holding it.
func TestFakeOwnedLockRefusedAfterGrant(t *testing.T) {
	for _, code := range []string{"53200", "40P01"} {
		t.Run(code, func(t *testing.T) {
			fs := newFakeServer()
			p, _ := newFakePool(t, fs, Config{})
			o := openOwned(t, p)
			pid := o.PID()
			fs.on(&fakeRule{kind: fWait, times: 1, err: sqlState(code), afterRun: true})
			if err := o.Lock(bg, k(1)); err == nil {
				t.Fatal("Lock = nil, want the refusal")
			}
			if o.Err() == nil && fs.holder(k(1)) == pid && !slices.Contains(o.Held(), k(1)) {
				t.Errorf("the Owned's session holds key 1, which the Owned does not know it holds")
			}
			o.Close()
			if fs.alive(pid) && fs.holder(k(1)) == pid {
				t.Errorf("backend %d went back to the pool holding key 1", pid)
			}
		})
	}
}

// TestFakeOwnedLateAnswer: an Owned's wait granted by the server, whose
// answer the driver delivers only once the call's ctx ended, is
// uncertain: the Owned is lost (its session discarded, and the key freed
// with it), rather than told a grant its caller has given up on.
func TestFakeOwnedLateAnswer(t *testing.T) {
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{})
	o := openOwned(t, p)
	r := fs.on(&fakeRule{kind: fWait, times: 1, late: true})
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() { done <- o.Lock(ctx, k(1)) }()
	recv(t, r.entered)
	fs.await(t, "the key granted on the server", func() bool { return fs.holder(k(1)) == o.PID() })
	cancel()
	wantErr(t, "Lock answered after its ctx ended", recv(t, done), stmt.ErrNotAcquired, context.Canceled)
	wantErr(t, "Err of the Owned", o.Err(), stmt.ErrLockLost)
	fs.await(t, "the key freed with the session", func() bool { return fs.holder(k(1)) == 0 })
}
