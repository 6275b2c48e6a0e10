package core

// The few internal readings the fake-driven tests need to synchronise
// with the Pool (they know the names of the core's fields; every other
// test goes through the exported API): a rename inside the core is fixed
// here alone.

// queuedOps returns how many operations wait in the queues of p's
// sessions for their runner.
func queuedOps(p *Pool) int {
	n := 0
	for _, s := range p.liveSessions() {
		s.mu.Lock()
		n += len(s.queue)
		s.mu.Unlock()
	}
	return n
}

// liveSessionCount returns how many sessions of p have not ended.
func liveSessionCount(p *Pool) int { return len(p.liveSessions()) }
