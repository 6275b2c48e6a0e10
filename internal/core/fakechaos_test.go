package core

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// inside tracks who is in each key's critical section, to check mutual
// exclusion: a holder that is not lost is never in with a writer that is
// not lost, and a writer never with anyone. (A lock is marked lost before
// its session ends and the server frees it, so a holder that enters after
// another's loss finds that loss already told.)
type inside struct {
	off bool // record, check nothing
	fs  *fakeServer
	mu  sync.Mutex
	in  map[Key][]holderIn
}

type holderIn struct {
	id     *int // the entry's identity
	shared bool
	pid    int64
	what   string
	err    func() error
}

func (c *inside) enter(t *testing.T, key Key, shared bool, pid int64, what string, err func() error) *int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.in[key] {
		if c.off {
			break
		}
		if (!shared || !o.shared) && o.err() == nil && err() == nil {
			excl, sh := c.fs.holders(key)
			t.Errorf("key %s: two holders at once, neither lost: %s on %d (shared %v), %s on %d (shared %v); the server: %v, shared %v", keyString(key), what, pid, shared, o.what, o.pid, o.shared, excl, sh)
			for _, b := range []int64{pid, o.pid} {
				var hist []string
				for _, st := range c.fs.stmts() {
					if st.pid == b {
						hist = append(hist, fmt.Sprintf("%d:%s", st.n, st.kind))
					}
				}
				if len(hist) > 25 {
					hist = hist[len(hist)-25:]
				}
				t.Logf("backend %d: %v", b, hist)
			}
		}
	}
	id := new(int)
	c.in[key] = append(c.in[key], holderIn{id, shared, pid, what, err})
	return id
}

// leave takes the entry id out of key's critical section.
func (c *inside) leave(key Key, id *int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.in[key] = slices.DeleteFunc(c.in[key], func(h holderIn) bool { return h.id == id })
}

// TestFakeChaos: goroutines take and release locks at random (tries,
// waits, shared waits, waits with deadlines, cancellations, an Owned's
// calls) while statements fail at random (server errors, refusals after
// the grant, stalls): no two holders that are not lost ever overlap, and
// once the Pool is closed nothing is held on the server and every session
// went back as it came, or was discarded. With broken connections and
// ended backends too (a lock is then gone before its holder can know, so
// exclusion is not checked), the end state is the same.
func TestFakeChaos(t *testing.T) {
	t.Run("faults", func(t *testing.T) { chaos(t, false) })
	t.Run("broken connections", func(t *testing.T) { chaos(t, true) })
}

func chaos(t *testing.T, broken bool) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	fs := newFakeServer()
	p, _ := newFakePool(t, fs, Config{KeepAlive: 20 * time.Millisecond})
	check := &inside{fs: fs, in: map[Key][]holderIn{}, off: broken}
	faults, stopFaults := context.WithCancel(bg)
	var fwg sync.WaitGroup
	fwg.Go(func() {
		rng := rand.New(rand.NewPCG(seed, 0))
		kinds := []fkind{fTry, fPolite, fUnlock, fBatchTry, fBatchUnlock, fBatchMixed, fSlice, fRegister, fAlive, fDoorbell, fWait, fSession}
		for faults.Err() == nil {
			kind := kinds[rng.IntN(len(kinds))]
			n := 4
			if broken {
				n = 6
			}
			switch rng.IntN(n) {
			case 4:
				fs.on(&fakeRule{kind: kind, times: 1, drop: true, afterRun: rng.IntN(2) == 0})
			case 5:
				fs.mu.Lock()
				for _, b := range fs.backends {
					if !b.dead && b.conns > 0 && rng.IntN(8) == 0 {
						fs.endBackendLocked(b)
						break
					}
				}
				fs.mu.Unlock()
			case 0:
				fs.failNext(kind, 1, "XX000")
			case 1:
				// (Not after an Owned's wait was granted: see
				// TestFakeOwnedLockRefusedAfterGrant.)
				afterRun := rng.IntN(2) == 0 && kind != fWait
				fs.on(&fakeRule{kind: kind, times: 1, err: sqlState([]string{"53200", "40P01"}[rng.IntN(2)]), afterRun: afterRun})
			case 2:
				r := fs.on(&fakeRule{kind: kind, times: 1, stall: make(chan struct{})})
				time.AfterFunc(time.Duration(rng.IntN(5))*time.Millisecond, r.release)
			}
			time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
		}
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(g+1)))
			for range 60 {
				if rng.IntN(6) == 0 {
					chaosOwned(t, p, rng, check)
					continue
				}
				key := k(int64(rng.IntN(4)))
				r := Request{Key: key}
				ctx, cancel := context.WithCancel(bg)
				switch rng.IntN(5) {
				case 0:
					r.Try = true
				case 1:
					r.Shared = true
				case 2:
					cancel()
					ctx, cancel = context.WithTimeout(bg, time.Duration(rng.IntN(80))*time.Millisecond)
				case 3:
					time.AfterFunc(time.Duration(rng.IntN(30))*time.Millisecond, cancel)
				}
				h, err := p.Acquire(ctx, r)
				cancel()
				if err != nil {
					continue
				}
				id := check.enter(t, key, r.Shared, h.PID(), fmt.Sprintf("Hold %+v", r), h.Err)
				time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
				check.leave(key, id)
				h.Release()
			}
		})
	}
	waitAll(t, &wg)
	stopFaults()
	waitAll(t, &fwg)
	fs.mu.Lock()
	for _, r := range fs.rules {
		if r.stall != nil {
			r.release()
		}
	}
	fs.rules = nil // no fault in what follows
	fs.mu.Unlock()
	if err := p.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
	if got := p.Stats(); got.Held != 0 {
		t.Errorf("Stats() = %+v after Close; want nothing held", got)
	}
	defer func() {
		if !t.Failed() {
			return
		}
		fs.mu.Lock()
		var pids []int64
		for tag, l := range fs.locks {
			t.Logf("held: %+v excl %v shared %v", tag, l.excl, l.shared)
			for pid := range l.excl {
				pids = append(pids, pid)
			}
			for pid := range l.shared {
				pids = append(pids, pid)
			}
		}
		for _, pid := range pids {
			b := fs.backends[pid]
			t.Logf("backend %d: dead %v mark %q conns %d running %q", pid, b.dead, b.mark, b.conns, b.running)
		}
		fs.mu.Unlock()
		for _, pid := range pids {
			var hist []string
			for _, st := range fs.stmts() {
				if st.pid == pid {
					hist = append(hist, fmt.Sprintf("%d:%s%v", st.n, st.kind, st.args))
				}
			}
			if len(hist) > 30 {
				hist = hist[len(hist)-30:]
			}
			t.Logf("backend %d: %v", pid, hist)
		}
	}()
	fs.await(t, "every lock freed on the server", func() bool { return fs.lockCount() == 0 })
	fs.await(t, "every session given back as it came", func() bool { return len(fs.liveMarked()) == 0 })
	t.Logf("statements: %v; stats: %+v", fs.counts(), p.Stats())
}

// chaosOwned runs an Owned's calls at random: TryLock, Lock with a
// deadline, Unlock, Close.
func chaosOwned(t *testing.T, p *Pool, rng *rand.Rand, check *inside) {
	o, err := p.Open(bg)
	if err != nil {
		return
	}
	defer o.Close()
	keys := []Key{k(int64(rng.IntN(4))), k(int64(rng.IntN(4)))}
	got, err := o.TryLock(bg, keys)
	if err != nil {
		return
	}
	if rng.IntN(2) == 0 {
		ctx, cancel := context.WithTimeout(bg, time.Duration(rng.IntN(60))*time.Millisecond)
		key := k(int64(rng.IntN(4)))
		if o.Lock(ctx, key) == nil && !slicesContains(got, key) {
			got = append(got, key)
		}
		cancel()
	}
	ids := make([]*int, len(got))
	for i, key := range got {
		ids[i] = check.enter(t, key, false, o.PID(), "Owned", o.Err)
	}
	time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
	for i, key := range got {
		check.leave(key, ids[i])
	}
	if len(got) > 0 && rng.IntN(2) == 0 {
		o.Unlock(got[:1])
	}
}

func slicesContains(keys []Key, key Key) bool {
	for _, x := range keys {
		if x == key {
			return true
		}
	}
	return false
}
