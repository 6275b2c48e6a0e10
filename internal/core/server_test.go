package core

import (
	"errors"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

func TestSupported(t *testing.T) {
	tests := []struct {
		version string
		ok      bool
	}{
		{"PostgreSQL 18.1 (Debian 18.1-1) on x86_64-pc-linux-gnu", true},
		{"PostgreSQL 13.16 (Debian 13.16-0+deb11u1) on x86_64-pc-linux-gnu", true},
		{"PostgreSQL 12.0 on x86_64-pc-linux-gnu", true},
		{"PostgreSQL 17beta1 on x86_64-pc-linux-gnu", true},
		{"PostgreSQL 11.22 on x86_64-pc-linux-gnu", false},
		{"PostgreSQL 9.6.24 on x86_64-pc-linux-gnu", false},
		{"PostgreSQL 13.0 CockroachDB CCL v23.1", false},
		{"MySQL 8", false},
	}
	for _, tt := range tests {
		err := Supported(tt.version)
		if (err == nil) != tt.ok || err != nil && !errors.Is(err, stmt.ErrUnsupportedServer) {
			t.Errorf("supported(%q) = %v, want ok=%v", tt.version, err, tt.ok)
		}
	}
}
