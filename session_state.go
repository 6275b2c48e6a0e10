package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
)

// The Session's state and accounting: which keys it holds, whether it is
// usable, and how it ends. Its calls (session.go) run between begin and
// end.

// holds reports whether the Session holds k.
func (s *Session) holds(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held.has(k)
}

// heldOnce returns keys without repeats, or the first key the Session
// does not hold.
func (s *Session) heldOnce(keys []Key) ([]Key, *Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	uniq := make([]Key, 0, len(keys))
	var seen keySet
	for i, k := range keys {
		if seen.has(k) {
			continue
		}
		if !s.held.has(k) {
			return nil, &keys[i]
		}
		seen.add(k)
		uniq = append(uniq, k)
	}
	return uniq, nil
}

// heldOf returns the keys of keys the Session holds, without repeats, in
// the order given.
func (s *Session) heldOf(keys []Key) []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Key
	var seen keySet
	for _, k := range keys {
		if s.held.has(k) && !seen.has(k) {
			seen.add(k)
			out = append(out, k)
		}
	}
	return out
}

// notHeld returns keys without repeats and without those the Session holds.
func (s *Session) notHeld(keys []Key) []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := make([]Key, 0, len(keys))
	var seen keySet
	for _, k := range keys {
		if !s.held.has(k) && !seen.has(k) {
			seen.add(k)
			want = append(want, k)
		}
	}
	return want
}

// callSlot serialises a Session's calls: one at a time; a call that waits
// for its turn gives up when its ctx ends.
type callSlot chan struct{}

func (c callSlot) lock()   { c <- struct{}{} }
func (c callSlot) unlock() { <-c }

func (c callSlot) tryLock() bool {
	select {
	case c <- struct{}{}:
		return true
	default:
		return false
	}
}

// begin starts a call: it takes calls, or returns an error matching
// ErrNotAcquired and ctx's error when ctx ends first (a call of the
// Session's waits, as long as its caller lets it), and checks that the
// Session is usable. end must follow when begin returns nil.
func (s *Session) begin(ctx context.Context) error {
	select {
	case s.calls <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w: another call of the Session's is under way: %w", ErrNotAcquired, ctx.Err())
	}
	if s.lease.expired() {
		s.lose(s.lease.expiredError())
	}
	if err := s.Err(); err != nil {
		s.calls.unlock()
		return err
	}
	s.lease.begin() // the session is busy, not idle, until end
	return nil
}

// end finishes a call. (A Session that the keep-alive found lost while the
// call ran had its connection discarded as the call's statement returned.)
func (s *Session) end() {
	s.lease.end(0, false)
	if s.Err() == nil && s.lease.due() {
		// A long call (a wait): show life now, rather than at the
		// keep-alive's next tick, which could find the lease expired.
		if err := s.touchLocked(s.l.unlockContext()); err != nil {
			s.lose(fmt.Errorf("the statement that keeps its session from going idle failed: %w", err))
		}
	}
	s.calls.unlock()
}

func (s *Session) leaseOf() *lease { return s.lease }

// touch runs the lease's statement on the Session's connection, unless a
// call is in progress (its session is not idle).
func (s *Session) touch(ctx context.Context) error {
	if !s.calls.tryLock() {
		return nil
	}
	defer s.calls.unlock()
	if s.Err() != nil {
		return nil
	}
	return s.touchLocked(ctx)
}

// touchLocked is touch; the caller holds calls.
func (s *Session) touchLocked(ctx context.Context) error {
	var v int64
	return s.c.queryRowCtx(ctx, touchSQL, nil, &v) // a sign of life when it answers
}

func (s *Session) setReleased(err error) { s.settle(stateReleased, err) }

// add records keys as held.
func (s *Session) add(keys []Key) {
	if len(keys) == 0 {
		return
	}
	s.mu.Lock()
	for _, k := range keys {
		s.held.add(k)
	}
	s.sorted = nil
	s.mu.Unlock()
	s.l.stats.took(int64(len(keys)))
}

// lose marks the Session lost and discards its session: the server
// releases its locks as the session ends. It never waits for a call in
// progress (that call's statement discards the connection as it returns),
// so the keep-alive and the Session's own calls use it alike.
func (s *Session) lose(cause error) { s.c.fail(cause) }

// markLost marks a usable Session lost, forgets its locks and counts
// them (its session failed: see carrier.fail); it returns the loss to
// tell, and false when the Session was not usable.
func (s *Session) markLost(cause error) (lossNote, bool) {
	s.mu.Lock()
	if s.state != stateHeld {
		s.mu.Unlock()
		return lossNote{}, false
	}
	n := int64(s.held.len())
	s.state = stateLost
	s.err = fmt.Errorf("%w: session on backend %d (%d locks): %w", ErrLockLost, s.pid, n, cause)
	s.held, s.sorted = keySet{}, nil
	err := s.err
	s.mu.Unlock()
	s.l.mon.remove(s)
	e := Event{Kind: EventLost, PID: int(s.pid), Err: err}
	s.l.count(e, n)
	return lossNote{s.l, e, s.pinned.end}, true
}

// heldKeys is the keep-alive's view of the Session: the keys held and not
// being released. It takes only mu, so a call waiting in the server never
// delays the keep-alive.
func (s *Session) heldKeys(buf []heldKey) []heldKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held.each(func(k Key) {
		if !s.releasing.has(k) {
			buf = append(buf, heldKey{pid: s.pid, id: s.id, key: k})
		}
	})
	return buf
}

// loseKey loses the Session when the keep-alive found k gone, unless k is
// no longer held or is being released: the keep-alive's query may have
// run after an unlock that its snapshot of the keys did not know of.
func (s *Session) loseKey(k Key, cause error) {
	s.mu.Lock()
	gone := s.held.has(k) && !s.releasing.has(k)
	s.mu.Unlock()
	if gone {
		s.lose(fmt.Errorf("%s: %w", s.l.name(k), cause))
	}
}

// markReleasing marks keys as being released, until endRelease.
func (s *Session) markReleasing(keys []Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		s.releasing.add(k)
	}
}

// endRelease ends the release of keys; when the server confirmed it, the
// keys the Session held are forgotten in the same step, so that the
// keep-alive never sees them held and not being released in between.
func (s *Session) endRelease(keys []Key, released bool) {
	s.mu.Lock()
	n := int64(0)
	for _, k := range keys {
		s.releasing.remove(k)
		if released && s.held.has(k) {
			s.held.remove(k)
			n++
		}
	}
	if n > 0 {
		s.sorted = nil
	}
	s.mu.Unlock()
	s.l.stats.released(n)
}

// Conn returns the pinned connection: the session that holds the locks.
// Statements of yours on it run as you run them; when the Session is lost
// (Done is closed), the connection is discarded as soon as the statement
// of yours on it, if any, returns. Once Conn was called, [Session.Close]
// closes the connection instead of giving it back to the pool: what your
// statements changed on the session (settings, temporary tables, prepared
// statements) never reaches the pool's other users.
func (s *Session) Conn() *sql.Conn {
	if s == nil {
		return nil
	}
	if s.lease != nil && !s.lease.off.Load() {
		s.calls.lock()
		err := s.l.stopLease(s.lease, func(ctx context.Context, q string) error {
			var v int64
			return s.c.queryRowCtx(ctx, q, nil, &v)
		})
		if err != nil {
			s.lose(fmt.Errorf("its session could not be handed out: %w", err))
		}
		s.calls.unlock()
	}
	s.c.handedOut.Store(true)
	return s.c.conn
}

// PID returns the backend process id of the session.
func (s *Session) PID() int {
	if s == nil {
		return 0
	}
	return int(s.pid)
}

// Done returns a channel that is closed when the Session is closed or lost.
func (s *Session) Done() <-chan struct{} {
	if s == nil {
		return closedChan
	}
	return s.done()
}

// Err returns nil while the Session is usable, ErrReleased after Close, and
// an error wrapping ErrLockLost once it is lost. It never waits for a call
// in progress.
func (s *Session) Err() error {
	if s == nil {
		return ErrReleased
	}
	if s.lease.expired() {
		s.lose(s.lease.expiredError())
	}
	return s.error()
}

// Held returns the keys the Session holds, sorted. It never waits for a
// call in progress.
func (s *Session) Held() []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sorted == nil {
		s.sorted = make([]Key, 0, s.held.len())
		s.held.each(func(k Key) { s.sorted = append(s.sorted, k) })
		sort.Slice(s.sorted, func(i, j int) bool { return s.sorted[i].less(s.sorted[j]) })
	}
	return append([]Key(nil), s.sorted...)
}
