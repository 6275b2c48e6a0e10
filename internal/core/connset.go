package core

import (
	"reflect"
	"sync"
	"sync/atomic"
)

// maxConns is how many driver connections a connSet remembers; past it,
// it forgets them all (what it knew is learnt again on each connection's
// next use, harmlessly), so that connections closed long ago are not kept.
const maxConns = 4096

// connSet remembers a value per driver connection: each one's backend pid
// (a wait for a lock on a connection whose pid is known needs no try
// first; see acquireOn), and each one's identity (see checkServer).
type connSet[T comparable] struct {
	conn sync.Map // driver connection → T
	n    atomic.Int64
}

// comparableConn reports whether dc can be a map key.
func comparableConn(dc any) bool { return dc != nil && reflect.TypeOf(dc).Comparable() }

// get returns what the set knows of dc.
func (t *connSet[T]) get(dc any) (T, bool) {
	var zero T
	if !comparableConn(dc) {
		return zero, false
	}
	v, ok := t.conn.Load(dc)
	if !ok {
		return zero, false
	}
	return v.(T), true
}

// set records v for dc.
func (t *connSet[T]) set(dc any, v T) {
	if !comparableConn(dc) {
		return
	}
	if old, ok := t.conn.Load(dc); ok {
		if old.(T) != v {
			t.conn.Store(dc, v)
		}
		return
	}
	if t.n.Add(1) > maxConns {
		t.conn.Clear()
		t.n.Store(1)
	}
	t.conn.Store(dc, v)
}
