package sqllock

import (
	"context"
	"testing"
	"time"
)

// TestLeadPauses: Lead's pauses double from first to most, each in the
// upper half of its step, and start over after an attempt that lasted
// reset.
func TestLeadPauses(t *testing.T) {
	b := backoff{first: 100 * time.Millisecond, most: 800 * time.Millisecond, reset: time.Hour}
	began := time.Now()
	for i, step := range []time.Duration{100, 200, 400, 800, 800, 800} {
		step *= time.Millisecond
		if p := b.next(began); p < step/2 || p > step {
			t.Errorf("pause %d = %v, want %v to %v", i, p, step/2, step)
		}
	}
	if p := b.next(began.Add(-time.Hour)); p < 50*time.Millisecond || p > 100*time.Millisecond {
		t.Errorf("pause after a long attempt = %v, want 50ms to 100ms", p)
	}
	if def := (&Locker{}).Election(Key{}).backoff; def.first > 250*time.Millisecond || def.most > 5*time.Second {
		t.Errorf("default pauses %v to %v: more than the documented quarter second to 5 s", def.first, def.most)
	}
}

// TestObserveQueue: Observe's queue keeps every change for a consumer
// that falls behind, in order, up to maxBehind; past that it drops the
// oldest, never handing the consumer one leader twice in a row, and
// always keeps the newest.
func TestObserveQueue(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen, ch := make(chan Leader), make(chan Leader)
	go deliver(ctx, seen, ch)
	leader := Leader{PID: 7, Value: "a"}
	seen <- leader
	if got := <-ch; got != leader {
		t.Fatalf("first = %v, want %v", got, leader)
	}
	// Behind by fewer than maxBehind: every change, in order.
	var want []Leader
	for i := range 10 {
		want = append(want, Leader{}, Leader{PID: 100 + i, Value: "b"})
	}
	for _, ld := range want {
		seen <- ld
	}
	for i, w := range want {
		if got := <-ch; got != w {
			t.Fatalf("change %d = %v, want %v", i, got, w)
		}
	}
	// Behind by more: the newest maxBehind or so, no repeat. The last
	// sent was PID 109; the changes alternate no leader and leader 109
	// (re-elected on the same session), so dropping a no leader leaves
	// 109 after 109 unless the drop takes it too.
	n := maxBehind + 5
	var last Leader
	for i := range n {
		last = Leader{}
		if i%2 == 1 {
			last = Leader{PID: 109, Value: "b"}
		}
		seen <- last
	}
	prev := Leader{PID: 109, Value: "b"}
	var got []Leader
	for more := true; more; {
		select {
		case ld := <-ch:
			if ld.same(prev) {
				t.Fatalf("after %d changes, %v twice in a row", len(got), ld)
			}
			got, prev = append(got, ld), ld
		case <-time.After(200 * time.Millisecond):
			more = false // every change sent on seen is in the queue
		}
	}
	if len(got) > maxBehind || len(got) < maxBehind-2 || got[len(got)-1] != last {
		t.Fatalf("%d changes kept, the last %v; want about %d, the last %v", len(got), got[len(got)-1], maxBehind, last)
	}
}
