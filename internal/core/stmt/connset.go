package stmt

import (
	"reflect"
	"sync"
	"sync/atomic"
)

// MaxConns is how many driver connections a ConnSet remembers; past it,
// it forgets them all (what it knew is learnt again on each connection's
// next use, harmlessly), so that connections closed long ago are not kept.
const MaxConns = 4096

// ConnSet remembers a value per driver connection: each one's backend pid
// (a wait for a lock on a connection whose pid is known needs no try
// first; see the core's acquireOn), and each one's identity (see the core's checkServer).
type ConnSet[T comparable] struct {
	conn sync.Map // driver connection → T
	n    atomic.Int64
}

// ComparableConn reports whether dc can be a map key.
func ComparableConn(dc any) bool { return dc != nil && reflect.TypeOf(dc).Comparable() }

// Get returns what the set knows of dc.
func (t *ConnSet[T]) Get(dc any) (T, bool) {
	var zero T
	if !ComparableConn(dc) {
		return zero, false
	}
	v, ok := t.conn.Load(dc)
	if !ok {
		return zero, false
	}
	return v.(T), true
}

// Set records v for dc.
func (t *ConnSet[T]) Set(dc any, v T) {
	if !ComparableConn(dc) {
		return
	}
	if old, ok := t.conn.Load(dc); ok {
		if old.(T) != v {
			t.conn.Store(dc, v)
		}
		return
	}
	if t.n.Add(1) > MaxConns {
		t.conn.Clear()
		t.n.Store(1)
	}
	t.conn.Store(dc, v)
}
