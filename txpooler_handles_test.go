package sqllock_test

// Every handle of a Locker WithTransactionPooler works behind the
// bouncer: elections (Campaign, Lead, Token, Leader, Observe) with
// tokens that increase across terms, a semaphore that never lets more
// than its permits in, and Inspect (see txpooler_invariants_test.go for
// the set-up).

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestTxPoolerElection: three terms behind the bouncer, each on a Locker
// of its own: one Campaign, then a Lead that waits for it and is elected
// when it resigns, then a Campaign after Lead's fn returns. Each term's
// Token is greater than the last, Leader (asked from another Locker)
// names each leader while it leads, and Observe, on yet another Locker,
// reports each leader while it leads: the three in order.
func TestTxPoolerElection(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		k := sqllock.Int64(7950)
		a, b, c, watcher := p.locker(t, drv), p.locker(t, drv), p.locker(t, drv), p.locker(t, drv)
		octx, stop := context.WithCancel(bg())
		defer stop()
		seen := watcher.Election(k).Observe(octx)
		var values []string // the leaders Observe reported, in order
		leaderIs := func(want string) {
			t.Helper()
			ld, err := watcher.Election(k).Leader(bg())
			if err != nil || ld.Value != want {
				t.Fatalf("Leader() = %v, %v; want %q", ld, err, want)
			}
			// Observe reports it while it leads.
			deadline := time.After(10 * time.Second)
			for len(values) == 0 || values[len(values)-1] != want {
				select {
				case ld := <-seen:
					if ld.Value != "" && (len(values) == 0 || values[len(values)-1] != ld.Value) {
						values = append(values, ld.Value)
					}
				case <-deadline:
					t.Fatalf("Observe reported %v within 10 s, want %q last", values, want)
				}
			}
		}
		var tokens []int64
		term, err := a.Election(k).Campaign(bg(), "a")
		if err != nil {
			t.Fatal(err)
		}
		leaderIs("a")
		tok, err := term.Token(bg())
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tok)
		led := make(chan error, 1)
		elected := make(chan struct{})
		resign := make(chan struct{})
		go func() {
			led <- b.Election(k).Lead(bg(), "b", func(ctx context.Context, term *sqllock.Lock) error {
				tok, err := term.Token(ctx)
				if err != nil {
					return err
				}
				tokens = append(tokens, tok)
				close(elected)
				<-resign
				return nil
			})
		}()
		waitFor(t, "Lead's campaign in the server", func() bool { return waitingPID(t, p.observer, k) != 0 })
		if err := term.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-elected:
		case err := <-led:
			t.Fatalf("Lead() = %v before it was elected", err)
		case <-time.After(30 * time.Second):
			t.Fatal("Lead not elected 30 s after the leader resigned")
		}
		leaderIs("b")
		close(resign)
		if err := <-led; err != nil {
			t.Fatalf("Lead() = %v", err)
		}
		term, err = c.Election(k).Campaign(bg(), "c")
		if err != nil {
			t.Fatal(err)
		}
		leaderIs("c")
		if tok, err = term.Token(bg()); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tok)
		if err := term.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		t.Logf("3 terms: tokens %v; Observe reported %v", tokens, values)
		if !slices.Equal(values, []string{"a", "b", "c"}) {
			t.Errorf("Observe reported %v, want [a b c]", values)
		}
		if !(tokens[0] < tokens[1] && tokens[1] < tokens[2]) {
			t.Errorf("tokens of 3 terms %v, want increasing", tokens)
		}
		p.waitNoStrays(t, 5*time.Second)
	})
}

// TestTxPoolerSemaphore: a semaphore of 2, behind the bouncer, under
// contention for 3 s: 2 Lockers × 4 goroutines Acquire (or TryAcquire)
// and hold 0–3 ms. Never more than 2 inside (counted by the holders, and
// in pg_locks, sampled every 5 ms by the observer), and every goroutine
// got in.
func TestTxPoolerSemaphore(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		const name = "txpooler sem"
		reg := sqllock.NewRegistry()
		if err := reg.RegisterSemaphore(name, 2); err != nil {
			t.Fatal(err)
		}
		var inside, most, samples, mostSeen atomic.Int64
		var entered [8]atomic.Int64
		var errs errTally
		stop := time.Now().Add(3 * time.Second)
		var wg sync.WaitGroup
		for li := range 2 {
			sem := p.locker(t, drv).Semaphore(name, 2)
			for g := range 4 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(li), uint64(g)))
					for time.Now().Before(stop) {
						ctx, cancel := context.WithTimeout(bg(), 20*time.Second)
						var lk *sqllock.Lock
						var err error
						if rng.IntN(4) == 0 {
							lk, err = sem.TryAcquire(ctx)
						} else {
							lk, err = sem.Acquire(ctx)
						}
						cancel()
						if errors.Is(err, sqllock.ErrNotAcquired) {
							continue
						}
						if err != nil {
							errs.add("Acquire", err)
							continue
						}
						n := inside.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						entered[li*4+g].Add(1)
						time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
						inside.Add(-1)
						if err := lk.Unlock(bg()); err != nil {
							errs.add("Unlock", err)
						}
					}
				})
			}
		}
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for time.Now().Before(stop) {
				locks, err := sqllock.Inspect(bg(), p.observer, reg)
				if err != nil {
					t.Error(err)
					return
				}
				var n int64
				for _, h := range locks {
					if h.Semaphore == name && h.Granted {
						n++
					}
				}
				samples.Add(1)
				mostSeen.Store(max(mostSeen.Load(), n))
				time.Sleep(5 * time.Millisecond)
			}
		}()
		waitGroup(t, &wg, hangCeiling)
		<-sampled
		var total int64
		var per []int64
		for i := range entered {
			total += entered[i].Load()
			per = append(per, entered[i].Load())
		}
		t.Logf("3 s, 8 goroutines, a semaphore of 2: %d permits %v; at most %d inside (holders), at most %d granted slots in %d samples of pg_locks; %d errors",
			total, per, most.Load(), mostSeen.Load(), samples.Load(), errs.total())
		if most.Load() > 2 || mostSeen.Load() > 2 {
			t.Errorf("a semaphore of 2: %d inside, %d slots granted at once", most.Load(), mostSeen.Load())
		}
		if errs.total() > 0 {
			t.Errorf("errors: %s", errs.String())
		}
		if slices.Contains(per, 0) {
			t.Errorf("a goroutine never got a permit: %v", per)
		}
		p.waitNoStrays(t, 5*time.Second)
	})
}

// TestTxPoolerInspect: Inspect, through the bouncer (lib/pq, and pgx in
// its simple protocol) and on a direct connection, reports a Locker's
// held lock with its holder's backend, and a waiter with Granted false,
// blocked by the holder.
func TestTxPoolerInspect(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		a, b := p.locker(t, drv), p.locker(t, drv)
		k := sqllock.Int64(7960)
		lk, err := a.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg())
		defer cancel()
		go b.Lock(ctx, k)
		waitFor(t, "the waiter in the server", func() bool { return waitingPID(t, p.observer, k) != 0 })
		bdsn := p.bdsn
		if drv == "pgx" {
			bdsn += "&default_query_exec_mode=simple_protocol"
		}
		for name, q := range map[string]sqllock.Querier{"through the bouncer": pgtest.Open(t, drv, bdsn), "direct": p.observer} {
			locks, err := sqllock.Inspect(bg(), q, nil, k)
			if err != nil {
				t.Fatalf("%s: Inspect() = %v", name, err)
			}
			var holder, waiter *sqllock.HeldLock
			for i := range locks {
				if locks[i].Granted {
					holder = &locks[i]
				} else {
					waiter = &locks[i]
				}
			}
			if holder == nil || holder.PID != lk.PID() || waiter == nil || !slices.Equal(waiter.BlockedBy, []int{lk.PID()}) {
				t.Fatalf("%s: Inspect() = %v; want the holder's backend %d and a waiter blocked by it", name, locks, lk.PID())
			}
			t.Logf("%s: %v", name, locks)
		}
	})
}

// TestTxPoolerInspectStatementCache: Inspect, given a pool of pgx with
// its default statement cache through the bouncer, never fails. Through
// the cache, pgx would prepare its statement on one server connection
// and run it on another (PgBouncer 1.18 keeps no prepared statement
// across them): Inspect asks pgx for its simple protocol on a pool or a
// connection.
func TestTxPoolerInspectStatementCache(t *testing.T) {
	long(t)
	p := behindTxPooler(t, 4)
	startPoolerTraffic(t, p.bdsn, trafficKey, 2)
	db := pgtest.Open(t, "pgx", p.bdsn)
	failed := 0
	var first error
	for range 200 {
		if _, err := sqllock.Inspect(bg(), db, nil); err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	t.Logf("200 Inspect calls through the bouncer on pgx's default statement cache: %d failed (%v)", failed, first)
	if failed > 0 {
		t.Errorf("%d of 200 Inspect calls failed", failed)
	}
}

// TestTxPoolerWindowsAndShared: behind the bouncer, TryDo runs its task
// on a free key and not on a held one; Do with WithHoldAtLeast and
// Lock.UnlockAfter keep the key held (another Locker's TryLock is
// refused) until their window ends, then free it; two Lockers' RLocks
// share a key that a third cannot Lock meanwhile.
func TestTxPoolerWindowsAndShared(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		a, b, c := p.locker(t, drv), p.locker(t, drv), p.locker(t, drv)
		refused := func(k sqllock.Key) bool {
			lk, err := c.TryLock(bg(), k)
			if err == nil {
				lk.Unlock(bg())
				return false
			}
			if !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("TryLock() = %v", err)
			}
			return true
		}
		const window = 600 * time.Millisecond
		// freedAfter checks that k, acquired after before, is held until
		// at least window after before (the grant came later), and free
		// within 5 s after that. Each look is timed after it is answered.
		freedAfter := func(k sqllock.Key, before time.Time, what string) {
			t.Helper()
			deadline := before.Add(window + 5*time.Second)
			for refused(k) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: the key still held 5 s after its window", what)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if since := time.Since(before); since < window {
				t.Fatalf("%s: the key free %v after it was asked for, before its window of %v", what, since, window)
			}
		}
		k := sqllock.Int64(7970)
		ran, err := a.TryDo(bg(), k, func(context.Context) error { return nil })
		if err != nil || !ran {
			t.Fatalf("TryDo() on a free key = %v, %v", ran, err)
		}
		held, err := b.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		if ran, err := a.TryDo(bg(), k, func(context.Context) error { return nil }); err != nil || ran {
			t.Fatalf("TryDo() on a held key = %v, %v; want false, nil", ran, err)
		}
		held.Unlock(bg())
		before := time.Now()
		if err := a.Do(bg(), k, func(context.Context) error { return nil }, sqllock.WithHoldAtLeast(window)); err != nil {
			t.Fatalf("Do() with a window = %v", err)
		}
		freedAfter(k, before, "Do with WithHoldAtLeast")
		lk, err := a.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		before = time.Now()
		if err := lk.UnlockAfter(window); err != nil {
			t.Fatalf("UnlockAfter() = %v", err)
		}
		freedAfter(k, before, "UnlockAfter")
		r1, err := a.RLock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := b.TryRLock(bg(), k)
		if err != nil {
			t.Fatalf("a second Locker's TryRLock() = %v", err)
		}
		if !refused(k) {
			t.Fatal("TryLock() of a key two RLocks hold: granted")
		}
		if h := holders(t, p.observer, k); len(h) != 2 {
			t.Fatalf("holders of %v = %v, want 2", k, h)
		}
		r1.Unlock(bg())
		r2.Unlock(bg())
		if refused(k) {
			t.Fatal("TryLock() after both RLocks were released: refused")
		}
		p.waitNoStrays(t, 5*time.Second)
	})
}
