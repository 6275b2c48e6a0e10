package core

import (
	"strings"
	"testing"
	"time"
)

func TestOrphanSettings(t *testing.T) {
	for _, b := range []time.Duration{3 * time.Second, 4 * time.Second, 10 * time.Second, 30 * time.Second, 5 * time.Minute} {
		s := ProbesFor(b)
		if s.Bound() > b || s.Bound() < b*2/3 || s.Idle < 1 || s.Interval < 1 || s.Count < 1 {
			t.Errorf("ProbesFor(%v) = %+v, bound %v: want within (2/3 b, b]", b, s, s.Bound())
		}
	}
	if s := ProbesFor(30 * time.Second); s != (Probes{Idle: 10, Interval: 5, Count: 4}) {
		t.Errorf("ProbesFor(30s) = %+v, want idle 10, interval 5, count 4", s)
	}
	st := sessionSettings(30*time.Second, "app", 16)
	if st.Idle != 10 || st.Interval != 5 || st.Count != 4 || st.UserTimeoutMs != 30000 || st.AppName != "app" || st.Major != 16 {
		t.Errorf("sessionSettings(30s) = %+v", st)
	}
	if st := sessionSettings(0, "", 16); st.Idle != 0 || st.UserTimeoutMs != 0 {
		t.Errorf("sessionSettings(0) = %+v, want no TCP settings", st)
	}
}

func TestCheckBounds(t *testing.T) {
	ok := []struct{ keepAlive, orphan time.Duration }{
		{5 * time.Second, 30 * time.Second},
		{200 * time.Millisecond, 4 * time.Second},
		{time.Minute, 0},                // no bound
		{0, 10 * time.Second},           // no keep-alive
		{10 * time.Second, time.Minute}, // 30 s < 45 s
	}
	for _, c := range ok {
		if err := BoundsError(c.keepAlive, c.orphan); err != nil {
			t.Errorf("BoundsError(%v, %v) = %v", c.keepAlive, c.orphan, err)
		}
	}
	if err := BoundsError(10*time.Second, 30*time.Second); err == nil || !strings.HasPrefix(err.Error(), "sqllock: ") {
		t.Errorf("BoundsError(10s, 30s) = %v, want the rule", err)
	}
}
