package sqllock

import (
	"fmt"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The orphan bound: when a lock's holder dies or is cut off, PostgreSQL
// keeps its session, and the lock, until TCP notices, which with Linux's
// defaults takes over two hours. The statement that takes a session-level
// lock also sets, on its own session, TCP keep-alive settings that make the
// server end a dead holder's session within the bound.

// defaultOrphanBound is how long the server keeps the lock of a holder that
// died or was cut off (see [WithOrphanBound]).
const defaultOrphanBound = 30 * time.Second

// keepaliveSettings are the server settings for an orphan bound.
type keepaliveSettings struct {
	idle, interval, count int // seconds, seconds, probes
}

// settingsFor spreads bound b over the first probe and the unanswered
// ones: idle b/3, then count probes every b/6 (each at least 1 s), so that
// idle + count × interval ≤ b for any b of 3 s or more.
func settingsFor(b time.Duration) keepaliveSettings {
	sec := int(b / time.Second)
	s := keepaliveSettings{idle: max(1, sec/3), interval: max(1, sec/6)}
	s.count = max(1, (sec-s.idle)/s.interval)
	return s
}

// bound is the time from the last sign of life to the end of the session.
func (s keepaliveSettings) bound() time.Duration {
	return time.Duration(s.idle+s.count*s.interval) * time.Second
}

// sessionSettings returns the settings of a lock session of a Locker
// with orphan bound orphan and application name name, on a server of
// major version major (see sqltext.Settings).
func sessionSettings(orphan time.Duration, name string, major int) sqltext.Settings {
	st := sqltext.Settings{AppName: name, Major: major}
	return withOrphan(st, orphan)
}

// withOrphan adds the orphan bound's TCP settings to st.
func withOrphan(st sqltext.Settings, orphan time.Duration) sqltext.Settings {
	if orphan > 0 {
		s := settingsFor(orphan)
		st.Idle, st.Interval, st.Count = s.idle, s.interval, s.count
		st.UserTimeoutMs = int(s.bound() / time.Millisecond)
	}
	return st
}

// clientBound is how long after the server stops answering the keep-alive
// reports a lock lost: the next tick, then two checks that time out.
func clientBound(keepAlive time.Duration) time.Duration {
	t := max(keepAlive, time.Second)
	return keepAlive + failedChecksBeforeLost*t
}

// boundsError returns why keepAlive and orphan break the rule that the
// holder is told before the server frees its lock (the client bound must
// stay below three quarters of the orphan bound), or nil.
func boundsError(keepAlive, orphan time.Duration) error {
	if orphan == 0 {
		return nil
	}
	if orphan < 3*time.Second {
		return fmt.Errorf("sqllock: WithOrphanBound(%v): the bound must be at least 3s (TCP keep-alive settings count in seconds)", orphan)
	}
	if keepAlive == 0 {
		return nil // no keep-alive: the holder is never told; documented
	}
	if c := clientBound(keepAlive); c >= orphan*3/4 {
		return fmt.Errorf("sqllock: WithKeepAlive(%v) tells a cut-off holder after up to %v, but WithOrphanBound(%v) lets the server free its lock after %v: "+
			"the holder must be told first, with a margin (keep-alive + 2 × max(keep-alive, 1s) < 3/4 of the bound); lower the keep-alive or raise the bound",
			keepAlive, c, orphan, settingsFor(orphan).bound())
	}
	return nil
}

// boundFor returns the shortest orphan bound, in whole seconds, that lets
// keepAlive tell a cut-off holder first (see boundsError).
func boundFor(keepAlive time.Duration) time.Duration {
	b := clientBound(keepAlive)*4/3 + time.Second
	return max(minOrphanBound, b.Truncate(time.Second)+time.Second)
}

// keepAliveFor returns a keep-alive interval that tells a cut-off holder
// within three quarters of orphan (see boundsError): a fifth of it (at
// most the longest interval, maxKeepAlive), or, for bounds below 5 s,
// whose checks must fail faster than their 1 s floor, what is left of
// three quarters of it after two checks, with a margin.
func keepAliveFor(orphan time.Duration) time.Duration {
	if orphan >= 5*time.Second {
		return min(orphan/5, maxKeepAlive)
	}
	return max(minKeepAlive, (orphan*3/4-failedChecksBeforeLost*time.Second)*4/5)
}
