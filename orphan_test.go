package sqllock

import (
	"strings"
	"testing"
	"time"
)

func TestOrphanSettings(t *testing.T) {
	for _, b := range []time.Duration{3 * time.Second, 4 * time.Second, 10 * time.Second, DefaultOrphanBound, 5 * time.Minute} {
		s := settingsFor(b)
		if s.bound() > b || s.bound() < b*2/3 || s.idle < 1 || s.interval < 1 || s.count < 1 {
			t.Errorf("settingsFor(%v) = %+v, bound %v: want within (2/3 b, b]", b, s, s.bound())
		}
	}
	if s := settingsFor(DefaultOrphanBound); s != (keepaliveSettings{idle: 10, interval: 5, count: 4}) {
		t.Errorf("settingsFor(30s) = %+v, want idle 10, interval 5, count 4", s)
	}
	st := sessionSettings(DefaultOrphanBound, "app", 16)
	if st.Idle != 10 || st.Interval != 5 || st.Count != 4 || st.UserTimeoutMs != 30000 || st.AppName != "app" || st.Major != 16 {
		t.Errorf("sessionSettings(30s) = %+v", st)
	}
	if st := sessionSettings(0, "", 16); st.Idle != 0 || st.UserTimeoutMs != 0 {
		t.Errorf("sessionSettings(0) = %+v, want no TCP settings", st)
	}
}

func TestCheckBounds(t *testing.T) {
	ok := []struct{ keepAlive, orphan time.Duration }{
		{DefaultKeepAlive, DefaultOrphanBound},
		{200 * time.Millisecond, 4 * time.Second},
		{time.Minute, 0},                // no bound
		{0, 10 * time.Second},           // no keep-alive
		{10 * time.Second, time.Minute}, // 30 s < 45 s
	}
	for _, c := range ok {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("checkBounds(%v, %v) panicked: %v", c.keepAlive, c.orphan, p)
				}
			}()
			checkBounds(c.keepAlive, c.orphan)
		}()
	}
	bad := []struct{ keepAlive, orphan time.Duration }{
		{10 * time.Second, DefaultOrphanBound}, // 30 s ≥ 22.5 s
		{DefaultKeepAlive, 2 * time.Second},    // below 3 s
	}
	for _, c := range bad {
		func() {
			defer func() {
				p := recover()
				if p == nil || !strings.HasPrefix(p.(string), "sqllock: ") {
					t.Errorf("checkBounds(%v, %v) = %v, want a sqllock panic", c.keepAlive, c.orphan, p)
				}
			}()
			checkBounds(c.keepAlive, c.orphan)
		}()
	}
}

func TestCheckOptions(t *testing.T) {
	if err := CheckOptions(); err != nil {
		t.Fatalf("CheckOptions() of the defaults = %v", err)
	}
	if err := CheckOptions(WithKeepAlive(time.Hour)); err == nil || !strings.Contains(err.Error(), "told first") {
		t.Fatalf("CheckOptions(WithKeepAlive(1h)) = %v, want the rule", err)
	}
	if err := CheckOptions(WithKeepAlive(time.Hour), WithOrphanBound(0)); err != nil {
		t.Fatalf("with the bound off = %v", err)
	}
}
