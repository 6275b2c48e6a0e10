package sqllock

import (
	"context"
	"database/sql"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqllock/sqllock/internal/core"
)

// TestOptionsAdapt: a single keep-alive or orphan bound never makes a
// configuration invalid: the other setting adapts to it; only two given
// values that break the rule, or values out of range, are errors (and
// New panics with the same text); a tiny keep-alive is raised to its
// floor.
func TestOptionsAdapt(t *testing.T) {
	single := []Option{WithKeepAlive(8 * time.Second), WithKeepAlive(time.Minute), WithKeepAlive(time.Hour),
		WithOrphanBound(3 * time.Second), WithOrphanBound(4 * time.Second), WithOrphanBound(10 * time.Second),
		WithOrphanBound(20 * time.Second), WithOrphanBound(27 * time.Hour)}
	for _, o := range single {
		c, err := newConfig([]Option{o})
		if err != nil {
			t.Errorf("newConfig(%+v) = %v, want the other setting adapted", o, err)
			continue
		}
		if err := core.BoundsError(c.keepAlive, c.orphanBound); err != nil || c.keepAlive < MinKeepAlive {
			t.Errorf("adapted to keep-alive %v, bound %v: %v", c.keepAlive, c.orphanBound, err)
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("New with one setting panicked: %v", p)
				}
			}()
			New(mockDB(t), o)
		}()
	}
	if c, _ := newConfig([]Option{WithKeepAlive(time.Nanosecond)}); c.keepAlive != MinKeepAlive {
		t.Errorf("WithKeepAlive(1ns) = %v, want the floor %v", c.keepAlive, MinKeepAlive)
	}
	if c, _ := newConfig([]Option{WithKeepAlive(8 * time.Second)}); c.orphanBound <= DefaultOrphanBound {
		t.Errorf("WithKeepAlive(8s) alone kept the bound at %v", c.orphanBound)
	}
	if c, _ := newConfig([]Option{WithOrphanBound(10 * time.Second)}); c.keepAlive >= DefaultKeepAlive {
		t.Errorf("WithOrphanBound(10s) alone kept the keep-alive at %v", c.keepAlive)
	}
	bad := []struct {
		opts []Option
		want string
	}{
		{[]Option{WithKeepAlive(10 * time.Second), WithOrphanBound(DefaultOrphanBound)}, "told first"},
		{[]Option{WithOrphanBound(2 * time.Second)}, "from 3s"},
		{[]Option{WithOrphanBound(720 * time.Hour)}, "to 27h"},
		{[]Option{WithOrphanBound(48 * time.Hour)}, "to 27h"},
		{[]Option{WithKeepAlive(-time.Second)}, "negative"},
		{[]Option{WithOrphanBound(-time.Second)}, "negative"},
		{[]Option{WithUnlockTimeout(0)}, "bounded"},
		{[]Option{WithUnlockTimeout(MaxUnlockTimeout + 1)}, "at most 1h"},
		{[]Option{WithUnlockTimeout(math.MaxInt64)}, "at most 1h"},
		{[]Option{WithKeepAlive(MaxKeepAlive + 1)}, "at most 1h"},
		{[]Option{WithKeepAlive(math.MaxInt64), WithOrphanBound(0)}, "at most 1h"},
		{[]Option{WithOrphanBound(MaxOrphanBound + 1)}, "to 27h"},
		{[]Option{WithOrphanBound(math.MaxInt64)}, "to 27h"},
		{[]Option{WithApplicationName("it's")}, "printable ASCII"},
	}
	for _, b := range bad {
		err := CheckOptions(b.opts...)
		if err == nil || !strings.Contains(err.Error(), b.want) || !strings.HasPrefix(err.Error(), "sqllock: ") {
			t.Errorf("CheckOptions(%v) = %v, want an error saying %q", b.opts, err, b.want)
			continue
		}
		func() {
			defer func() {
				if p := recover(); p == nil || p.(string) != err.Error() {
					t.Errorf("New(%v) panicked with %v, want %q", b.opts, p, err)
				}
			}()
			New(mockDB(t), b.opts...)
		}()
	}
}

func TestCheckOptions(t *testing.T) {
	if err := CheckOptions(); err != nil {
		t.Fatalf("CheckOptions() of the defaults = %v", err)
	}
	// Every duration at its maximum, alone and together.
	for _, opts := range [][]Option{
		{WithKeepAlive(MaxKeepAlive)},
		{WithKeepAlive(MaxKeepAlive), WithOrphanBound(0)},
		{WithUnlockTimeout(MaxUnlockTimeout)},
		{WithOrphanBound(MaxOrphanBound)},
		{WithKeepAlive(MaxKeepAlive), WithOrphanBound(MaxOrphanBound), WithUnlockTimeout(MaxUnlockTimeout)},
	} {
		c, err := newConfig(opts)
		if err != nil {
			t.Errorf("CheckOptions(%v) = %v, want nil", opts, err)
		}
		if c.keepAlive > MaxKeepAlive || c.orphanBound > MaxOrphanBound {
			t.Errorf("CheckOptions(%v) adapted the keep-alive to %v and the bound to %v: out of range", opts, c.keepAlive, c.orphanBound)
		}
	}
	if err := CheckOptions(WithKeepAlive(time.Hour), WithOrphanBound(time.Minute)); err == nil || !strings.Contains(err.Error(), "told first") {
		t.Fatalf("CheckOptions(WithKeepAlive(1h), WithOrphanBound(1m)) = %v, want the rule", err)
	}
	if err := CheckOptions(WithKeepAlive(time.Hour), WithOrphanBound(0)); err != nil {
		t.Fatalf("with the bound off = %v", err)
	}
}

// mockDB returns a *sql.DB that no test statement reaches.
func mockDB(t *testing.T) *sql.DB {
	db, _, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestHoldWindowBound: a hold window is from 0 to MaxHoldWindow; Do
// refuses another before it takes the lock.
func TestHoldWindowBound(t *testing.T) {
	for _, d := range []time.Duration{0, time.Second, MaxHoldWindow} {
		if _, err := newDoConfig([]DoOption{WithHoldAtLeast(d)}); err != nil {
			t.Errorf("WithHoldAtLeast(%v) = %v, want nil", d, err)
		}
	}
	for _, d := range []time.Duration{-time.Second, MaxHoldWindow + 1, math.MaxInt64} {
		err := New(mockDB(t), WithKeepAlive(0)).Do(t.Context(), Int64(1), func(context.Context) error { return nil }, WithHoldAtLeast(d))
		if err == nil || !strings.HasPrefix(err.Error(), "sqllock: WithHoldAtLeast(") {
			t.Errorf("Do with WithHoldAtLeast(%v) = %v, want its refusal (and nothing sent)", d, err)
		}
	}
}
