package core

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestGateJoinOrShut: calls that join a shared session without the
// sharing's lock, and its end as it idles (shutIdle), exclude each other:
// either the session shut with no call in it, or every call that joined
// finds it open, whatever the interleaving.
func TestGateJoinOrShut(t *testing.T) {
	for round := range 2000 {
		s := &session{}
		var joined atomic.Int64
		var shut atomic.Bool
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				<-start
				if s.join() {
					joined.Add(1)
				}
			})
		}
		wg.Go(func() {
			<-start
			shut.Store(s.shutIdle())
		})
		close(start)
		wg.Wait()
		if shut.Load() == (joined.Load() > 0) {
			t.Fatalf("round %d: shut %v with %d calls joined", round, shut.Load(), joined.Load())
		}
		if got := s.users(); got != joined.Load() {
			t.Fatalf("round %d: users() = %d, want %d", round, got, joined.Load())
		}
		if shut.Load() && s.join() {
			t.Fatalf("round %d: a call joined a shut session", round)
		}
	}
}
