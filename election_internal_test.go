package sqllock

import (
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
