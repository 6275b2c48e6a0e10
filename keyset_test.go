package sqllock

import (
	"slices"
	"testing"
)

func TestKeySet(t *testing.T) {
	var s keySet
	keys := []Key{Int64(0), Pair(0, 0), Int64(-1), Pair(-1, -1), Int64(1 << 40), Pair(1, 2)}
	for _, k := range keys {
		if s.has(k) {
			t.Fatalf("empty set has %v", k)
		}
		s.add(k)
		s.add(k) // twice: counted once
	}
	if s.len() != len(keys) {
		t.Fatalf("len = %d, want %d", s.len(), len(keys))
	}
	var got []Key
	s.each(func(k Key) { got = append(got, k) })
	slices.SortFunc(got, func(a, b Key) int {
		if a.less(b) {
			return -1
		}
		if b.less(a) {
			return 1
		}
		return 0
	})
	want := slices.Clone(keys)
	slices.SortFunc(want, func(a, b Key) int {
		if a.less(b) {
			return -1
		}
		if b.less(a) {
			return 1
		}
		return 0
	})
	if !slices.Equal(got, want) {
		t.Fatalf("each = %v, want %v", got, want)
	}
	s.remove(Pair(0, 0))
	s.remove(Pair(0, 0))
	s.remove(Pair(9, 9)) // absent
	if s.has(Pair(0, 0)) || !s.has(Int64(0)) || s.len() != len(keys)-1 {
		t.Fatalf("after remove: has(Pair(0,0)) = %v, has(Int64(0)) = %v, len = %d", s.has(Pair(0, 0)), s.has(Int64(0)), s.len())
	}
	if s.has(Key{}) {
		t.Fatal("the zero Key is in the set")
	}
}

func TestMarkPositions(t *testing.T) {
	for _, tt := range []struct {
		in   any
		want []bool
		ok   bool
	}{
		{"{}", []bool{false, false, false}, true},
		{[]byte("{1,3}"), []bool{true, false, true}, true},
		{"{2}", []bool{false, true, false}, true},
		{"{4}", nil, false},
		{"{0}", nil, false},
		{"{x}", nil, false},
		{int64(1), nil, false},
	} {
		marks := make([]bool, 3)
		err := markPositions(tt.in, marks)
		if (err == nil) != tt.ok {
			t.Errorf("markPositions(%v) = %v", tt.in, err)
			continue
		}
		if tt.ok && !slices.Equal(marks, tt.want) {
			t.Errorf("markPositions(%v) = %v, want %v", tt.in, marks, tt.want)
		}
	}
}
