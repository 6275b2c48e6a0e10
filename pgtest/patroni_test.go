package pgtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock/pgtest"
)

// TestPatroniOptions: settings Patroni would refuse, or that mean nothing,
// are errors before anything starts.
func TestPatroniOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  pgtest.PatroniOption
		want string
	}{
		{"no nodes", pgtest.WithNodes(0), "at least 1"},
		{"loop_wait + 2 × retry_timeout > ttl", pgtest.WithTimings(10*time.Second, 3*time.Second, 4*time.Second), "≤ ttl"},
		{"not whole seconds", pgtest.WithTimings(10*time.Second, 1500*time.Millisecond, 4*time.Second), "whole seconds"},
		{"zero", pgtest.WithTimings(10*time.Second, 0, 4*time.Second), "whole seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := pgtest.NewPatroni(context.Background(), tt.opt)
			if err == nil {
				p.Close()
				t.Fatal("NewPatroni() = nil error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewPatroni() = %v, want it to say %q", err, tt.want)
			}
		})
	}
}
