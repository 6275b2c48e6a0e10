package core

import (
	"testing"
	"time"
)

// TestHeadLostBeforeDone: a head granted a lock that its session lost
// before the queue heard of the grant does not become the queue's holder
// (its loss told the queue already, and nothing would tell it again): the
// next caller becomes head.
func TestHeadLostBeforeDone(t *testing.T) {
	var qs keyQueues
	qk := queueKey{k: Key{V: 7}}
	head := &qwaiter{state: qhead}
	next := &qwaiter{ready: make(chan struct{})}
	sh := qs.shard(qk)
	sh.m = map[queueKey]*keyQueue{qk: {head: head, waiters: []*qwaiter{next}}}
	qs.live.Store(1)
	lost := &Hold{key: qk.k, lifecycle: lifecycle{state: holdLost}}
	qs.headDone((&Pool{}).link(), qk, head, lost)
	select {
	case <-next.ready:
	case <-time.After(time.Second):
		t.Fatalf("the next caller is not head after the head's lock was lost (holder %v)", sh.m[qk].holder != nil)
	}
	if q := sh.m[qk]; q.holder != nil || q.head != next {
		t.Fatalf("holder %v, head %v; want none and the next caller", q.holder, q.head)
	}
}
