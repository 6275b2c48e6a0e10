package sqllock

// keySet is a set of keys kept in maps keyed by the key's int64 value, one
// per key form: Go hashes an int64 faster than the Key struct, and a
// Session looks each of its keys up several times per TryLock and
// Unlock (docs/benchmarks.md has the figures). The zero value is an
// empty set.
type keySet struct {
	m [formPair + 1]map[int64]struct{} // by form
	n int
}

func (s *keySet) has(k Key) bool {
	_, ok := s.m[k.form][k.v]
	return ok
}

func (s *keySet) add(k Key) {
	m := s.m[k.form]
	if m == nil {
		m = map[int64]struct{}{}
		s.m[k.form] = m
	}
	if _, ok := m[k.v]; !ok {
		m[k.v] = struct{}{}
		s.n++
	}
}

func (s *keySet) remove(k Key) {
	m := s.m[k.form]
	if _, ok := m[k.v]; ok {
		delete(m, k.v)
		s.n--
	}
}

func (s *keySet) len() int { return s.n }

// each calls f for every key, in no order.
func (s *keySet) each(f func(Key)) {
	for form, m := range s.m {
		for v := range m {
			f(Key{form: keyForm(form), v: v})
		}
	}
}
