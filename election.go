package sqllock

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Election is a leader election on a key: of the candidates that campaign
// on it, in every process that uses the same key, at most one leads at a
// time, for as long as it holds the key's lock. It has the shape of etcd's
// concurrency.Election: [Election.Campaign] blocks until elected,
// [Leadership.Resign] steps down, [Election.Leader] tells who leads without
// campaigning, and [Election.Observe] reports each change.
//
// The leader's value (what identifies the candidate, such as its host
// name) is visible to everyone without a table: it is the
// application_name of the session that holds the lock (prefixed with
// [ElectionPrefix]), as pg_stat_activity and `sqllock inspect` show it.
//
// An Election is safe for concurrent use.
type Election struct {
	l   *Locker
	key Key
}

// ElectionPrefix starts the application_name of a candidate's session: the
// rest is its value.
const ElectionPrefix = "sqllock-election:"

// maxValue is the longest value: application_name holds 63 bytes.
const maxValue = 63 - len(ElectionPrefix)

// Election returns the election on key k.
func (l *Locker) Election(k Key) *Election { return &Election{l: l, key: k} }

// Key returns the election's key.
func (e *Election) Key() Key { return e.key }

// Campaign waits until this candidate is elected, and returns its
// Leadership; value identifies the candidate to everyone (1 to 46 bytes of
// printable ASCII, without quotes or backslashes). It waits in the server
// (no polling), as [Locker.Lock] does. When ctx ends first, it returns an
// error matching [ErrNotAcquired] and ctx.Err(), and this candidate does
// not lead. Other errors are those of Locker.Lock, and [ErrInvalidKey] for
// an unusable value.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	if !validAppName(value) || len(value) > maxValue {
		return nil, fmt.Errorf("%w: election value %q: want 1 to %d bytes of printable ASCII without quotes or backslashes", ErrInvalidKey, value, maxValue)
	}
	lk, err := e.candidate(value).Lock(ctx, e.key)
	if err != nil {
		return nil, err
	}
	return &Leadership{e: e, lk: lk, value: value}, nil
}

// candidate returns a Locker like the election's whose lock sessions are
// named with value, so that the leader's session carries it while it
// waits and while it leads.
func (e *Election) candidate(value string) *Locker {
	c := New(e.l.db)
	c.cfg = e.l.cfg
	c.cfg.appName, c.cfg.forceAppName = ElectionPrefix+value, true
	c.cfg.dedicated = true // the value is the session's own name
	c.observers = e.l.observers
	return c
}

// Leader is who leads an election, as the server shows it.
type Leader struct {
	Value      string    // the leader's value ("" when no candidate holds the key)
	PID        int       // the backend of the leader's session (0: no leader)
	ClientAddr string    // the leader's client address, when the server shows it
	Since      time.Time // when the leader's session was last granted or changed state
}

// String returns "value (backend PID)", or "no leader".
func (ld Leader) String() string {
	if ld.PID == 0 {
		return "no leader"
	}
	return fmt.Sprintf("%q (backend %d)", ld.Value, ld.PID)
}

// Leader returns who leads now, in one query: the zero Leader (PID 0)
// when no one does. It needs no privileges, and costs the leader nothing.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	for try := 0; ; try++ {
		hs, err := Inspect(ctx, e.l.db, WithKeys(e.key))
		if err != nil {
			return Leader{}, err
		}
		unnamed := false
		for _, h := range hs {
			if !h.Granted || h.Shared {
				continue
			}
			value, ok := strings.CutPrefix(h.ApplicationName, ElectionPrefix)
			if !ok && try < leaderRetries && ctx.Err() == nil {
				// Granted a moment ago: the statement that was granted
				// the lock names its session next.
				unnamed = true
				break
			}
			if !ok {
				value = "" // a holder that is no candidate
			}
			return Leader{Value: value, PID: h.PID, ClientAddr: h.ClientAddr, Since: h.Since}, nil
		}
		if !unnamed {
			return Leader{}, nil
		}
		time.Sleep(time.Millisecond)
	}
}

// leaderRetries is how many times Leader reads again a leader whose
// session does not carry its value yet.
const leaderRetries = 20

// Observe reports the election's leader on the returned channel: the
// leader at once, then each change (including to no leader, the zero
// Leader), in order, until ctx ends, when it closes the channel. It asks
// the server once per interval (the Locker's keep-alive interval, or one
// second when that is off): one small query per interval per observer,
// and nothing for the candidates. A leadership shorter than the interval
// can go unseen. A failed query is retried at the next interval.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	interval := e.l.cfg.keepAlive
	if interval <= 0 {
		interval = time.Second
	}
	ch := make(chan Leader, 1)
	go func() {
		defer close(ch)
		t := time.NewTicker(interval)
		defer t.Stop()
		last, first := Leader{}, true
		for {
			qctx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
			ld, err := e.Leader(qctx)
			cancel()
			if err == nil && (first || ld.PID != last.PID || ld.Value != last.Value) {
				select {
				case ch <- ld:
				case <-ctx.Done():
					return
				}
				last, first = ld, false
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// Leadership is a candidate's term as leader: it lasts until Resign, or
// until its lock is lost (Done closes, Err says why). Work done as leader
// should stop when Done closes, and writes to shared resources should
// carry the term's fencing token ([Leadership.Token]).
//
// A Leadership is safe for concurrent use.
type Leadership struct {
	e     *Election
	lk    *Lock
	value string
}

// Value returns the value this candidate campaigned with.
func (ld *Leadership) Value() string { return ld.value }

// Done returns a channel closed when the term ends: resigned, or the lock
// lost (its session ended, the server restarted, a partition).
func (ld *Leadership) Done() <-chan struct{} { return ld.lk.Done() }

// Err returns nil while this candidate leads, then [ErrReleased] after
// Resign, or an error wrapping [ErrLockLost].
func (ld *Leadership) Err() error { return ld.lk.Err() }

// Token returns the term's fencing token (see [Lock.Token]): it grows
// across successive terms of the election.
func (ld *Leadership) Token(ctx context.Context) (int64, error) { return ld.lk.Token(ctx) }

// Lock returns the lock that makes this candidate the leader.
func (ld *Leadership) Lock() *Lock { return ld.lk }

// Resign ends the term: the next candidate is elected at once. It returns
// the error of [Lock.Unlock] (an error wrapping ErrLockLost when the term
// had already ended by a loss); it is safe to call twice.
func (ld *Leadership) Resign(ctx context.Context) error { return ld.lk.Unlock(ctx) }
