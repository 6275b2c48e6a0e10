package core

// keySet is a set of keys kept in maps keyed by the key's int64 value, one
// per key form: Go hashes an int64 faster than the Key struct, and a
// Session looks each of its keys up several times per TryLock and
// Unlock (docs/benchmarks.md has the figures). The zero value is an
// empty set.
type keySet struct {
	m [2]map[int64]struct{} // [bigint, pair]
	n int
}

// slot returns k's map index and value.
func slot(k Key) (int, int64) {
	if k.Pair {
		return 1, int64(uint64(uint32(k.Class))<<32 | uint64(uint32(k.ID)))
	}
	return 0, k.V
}

func (s *keySet) has(k Key) bool {
	f, v := slot(k)
	_, ok := s.m[f][v]
	return ok
}

func (s *keySet) add(k Key) { s.addNew(k) }

// addNew adds k, and reports whether it was not there yet: one look-up
// where has and add take two.
func (s *keySet) addNew(k Key) bool {
	f, v := slot(k)
	m := s.m[f]
	if m == nil {
		m = map[int64]struct{}{}
		s.m[f] = m
	}
	n := len(m)
	m[v] = struct{}{}
	if len(m) == n {
		return false
	}
	s.n++
	return true
}

func (s *keySet) remove(k Key) {
	f, v := slot(k)
	m := s.m[f]
	n := len(m)
	delete(m, v)
	if len(m) < n {
		s.n--
	}
}

func (s *keySet) len() int { return s.n }

// each calls f for every key, in no order.
func (s *keySet) each(f func(Key)) {
	for v := range s.m[0] {
		f(Key{V: v})
	}
	for v := range s.m[1] {
		f(Key{Pair: true, Class: int32(uint64(v) >> 32), ID: int32(uint32(v))})
	}
}
