package sqllock

import (
	"errors"
	"fmt"
	"sync"
	"testing"
)

func TestRegistry(t *testing.T) {
	r := NewRegistry()
	tests := []struct {
		name    string
		regName string
		key     Key
		wantErr error
	}{
		{"first", "cron:reindex_posts", Int64(1001), nil},
		{"second", "cron:cleanup_old_logs", Int64(1002), nil},
		{"pair form is another key space", "job:daily_report", Pair(0, 1001), nil},
		{"same name same key is a no-op", "cron:reindex_posts", Int64(1001), nil},
		{"same name other key", "cron:reindex_posts", Int64(1003), ErrDuplicate},
		{"other name same key", "cron:copy", Int64(1002), ErrDuplicate},
		{"zero key", "x", Key{}, ErrInvalidKey},
		{"empty name", "", Int64(5), ErrInvalidKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := r.Register(tt.regName, tt.key)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("Register(%q, %v) = %v, want %v", tt.regName, tt.key, err, tt.wantErr)
			}
		})
	}
	if n, ok := r.name(Int64(1002)); !ok || n != "cron:cleanup_old_logs" {
		t.Errorf("Name(1002) = %q, %v", n, ok)
	}
	if _, ok := r.name(Int64(1003)); ok {
		t.Error("Name(1003) found a name that was refused")
	}
	var all []string
	for n, k := range r.All() {
		all = append(all, n+"="+k.String())
	}
	want := []string{"cron:cleanup_old_logs=1002", "cron:reindex_posts=1001", "job:daily_report=(0,1001)"}
	if fmt.Sprint(all) != fmt.Sprint(want) {
		t.Errorf("All() = %v, want %v", all, want)
	}
	var nilReg *Registry
	if _, ok := nilReg.name(Int64(1)); ok {
		t.Error("nil Registry Name found something")
	}
}

func TestRegistryMustRegisterPanics(t *testing.T) {
	r := NewRegistry()
	if k := r.MustRegister("a", Hash("a")); k != Hash("a") {
		t.Fatalf("MustRegister returned %v", k)
	}
	defer func() {
		if p := recover(); p == nil {
			t.Fatal("MustRegister with a duplicate key did not panic")
		}
	}()
	r.MustRegister("b", Hash("a"))
}

func TestRegistryConcurrent(t *testing.T) {
	r := NewRegistry()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 8; i++ {
				// Every goroutine registers the same 8 names with the same keys,
				// and one name with a key of its own that collides with nobody.
				if err := r.Register(fmt.Sprintf("job-%d", i), Int64(int64(i))); err != nil {
					errs <- err
				}
			}
			// All goroutines race for key 100 under different names: exactly one wins.
			if err := r.Register(fmt.Sprintf("racer-%d", g), Int64(100)); err != nil && !errors.Is(err, ErrDuplicate) {
				errs <- err
			}
			_ = r.All()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got := 0
	for range r.All() {
		got++
	}
	if got != 9 {
		t.Errorf("len(All()) = %d, want 9 (8 jobs and one racer)", got)
	}
}

// TestRegistrySemaphores: a semaphore's slots and named keys never overlap
// in a Registry, a semaphore's size cannot change silently, and bad sizes
// are errors, not panics.
func TestRegistrySemaphores(t *testing.T) {
	r := NewRegistry()
	slot := semaphoreSlots("reports", 3)[0]
	if err := r.Register("billing:job", slot); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterSemaphore("reports", 3); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("RegisterSemaphore over a named key's slot = %v, want ErrDuplicate", err)
	}
	r = NewRegistry()
	if err := r.RegisterSemaphore("reports", 3); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("billing:job", slot); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("Register of a semaphore's slot = %v, want ErrDuplicate", err)
	}
	if err := r.RegisterSemaphore("reports", 5); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("RegisterSemaphore with another size = %v, want ErrDuplicate", err)
	}
	if err := r.RegisterSemaphore("reports", 3); err != nil {
		t.Fatalf("RegisterSemaphore again, same size = %v, want nil", err)
	}
	for _, n := range []int{0, -1, 1025} {
		if err := r.RegisterSemaphore("x", n); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("RegisterSemaphore(x, %d) = %v, want ErrInvalidKey", n, err)
		}
	}
	if keys := semaphoreSlots("x", -1); len(keys) != 0 {
		t.Fatalf("semaphoreSlots(x, -1) = %v, want none", keys)
	}
}
