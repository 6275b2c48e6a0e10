package pglocks

import (
	"database/sql/driver"
	"math"
	"testing"
)

func TestTagKeys(t *testing.T) {
	tests := []struct {
		tag  Tag
		want int64
	}{
		{Tag{0, 5, Bigint}, 5},
		{Tag{0xFFFFFFFF, 0xFFFFFFFF, Bigint}, -1},
		{Tag{256, 5, Bigint}, 1<<40 + 5},
		{Tag{0x80000000, 0, Bigint}, math.MinInt64},
	}
	for _, tt := range tests {
		if got := tt.tag.BigintKey(); got != tt.want {
			t.Errorf("%+v.BigintKey() = %d, want %d", tt.tag, got, tt.want)
		}
	}
	if c, i := (Tag{0xFFFFFFFC, 12, Pair}).PairKey(); c != -4 || i != 12 {
		t.Errorf("PairKey = %d, %d; want -4, 12", c, i)
	}
}

func TestScan(t *testing.T) {
	r := Scan([]driver.Value{int32(7), int64(0), []byte("5"), int64(1), []byte("ShareLock"), true})
	if r.PID != 7 || r.Tag != (Tag{0, 5, 1}) || !r.Shared || !r.Granted {
		t.Fatalf("Scan = %+v", r)
	}
	if Int(1.5) != 0 || Int("x") != 0 || Text(3) != "" {
		t.Fatal("unconvertible values must be zero")
	}
}
