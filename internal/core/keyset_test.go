package core

import (
	"cmp"
	"slices"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

func TestKeySet(t *testing.T) {
	var s keySet
	keys := []Key{{V: 0}, {Pair: true}, {V: -1}, {Pair: true, Class: -1, ID: -1}, {V: 1 << 40}, {Pair: true, Class: 1, ID: 2}}
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
	order := func(a, b Key) int {
		if a.Pair != b.Pair {
			if a.Pair {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.V, b.V), cmp.Compare(a.Class, b.Class), cmp.Compare(a.ID, b.ID))
	}
	slices.SortFunc(got, order)
	want := slices.Clone(keys)
	slices.SortFunc(want, order)
	if !slices.Equal(got, want) {
		t.Fatalf("each = %v, want %v", got, want)
	}
	s.remove(Key{Pair: true})
	s.remove(Key{Pair: true})
	s.remove(Key{Pair: true, Class: 9, ID: 9}) // absent
	if s.has(Key{Pair: true}) || !s.has(Key{V: 0}) || s.len() != len(keys)-1 {
		t.Fatalf("after remove: has((0,0)) = %v, has(0) = %v, len = %d", s.has(Key{Pair: true}), s.has(Key{V: 0}), s.len())
	}
}

func TestMarkPositions(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []bool
		ok   bool
	}{
		{"{}", []bool{false, false, false}, true},
		{"{1,3}", []bool{true, false, true}, true},
		{"{2}", []bool{false, true, false}, true},
		{"{4}", nil, false},
		{"{0}", nil, false},
		{"{x}", nil, false},
		{"", nil, false},
		{"2", nil, false},
		{"{2", nil, false},
	} {
		marks := make([]bool, 3)
		err := stmt.MarkPositions(tt.in, marks)
		if (err == nil) != tt.ok {
			t.Errorf("markPositions(%v) = %v", tt.in, err)
			continue
		}
		if tt.ok && !slices.Equal(marks, tt.want) {
			t.Errorf("markPositions(%v) = %v, want %v", tt.in, marks, tt.want)
		}
	}
}

// TestSharingReserve: a key is reserved once until freed, whatever part
// of the set it falls in; a bigint key and a pair key of the same value
// are distinct; many keys spread over the parts.
func TestSharingReserve(t *testing.T) {
	var sh sharing
	keys := []Key{{V: 1}, {Pair: true, Class: 0, ID: 1}, {V: -1}, {Pair: true, Class: -1, ID: -1}, {V: 1 << 40}}
	for _, k := range keys {
		if !sh.reserve(k) {
			t.Fatalf("%v: first reserve refused", k)
		}
	}
	for _, k := range keys {
		if sh.reserve(k) {
			t.Errorf("%v: reserved twice", k)
		}
	}
	sh.unreserve(keys[0])
	if !sh.reserve(keys[0]) {
		t.Errorf("%v: not reserved again after free", keys[0])
	}
	if sh.reserve(keys[1]) {
		t.Errorf("%v: freeing %v freed it too", keys[1], keys[0])
	}
	used := map[*keyPart]bool{}
	for v := range int64(1000) {
		used[sh.part(Key{V: v})] = true
	}
	if len(used) < keyParts/2 {
		t.Errorf("1,000 keys fall in %d of %d parts", len(used), keyParts)
	}
}
