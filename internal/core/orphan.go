package core

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

// Limits of the keep-alive and the orphan bound.
const (
	// MinKeepAlive is the shortest keep-alive interval: shorter ones are
	// raised to it (a check per millisecond helps no one, and loads the
	// server).
	MinKeepAlive = 100 * time.Millisecond
	// MaxKeepAlive is the longest keep-alive interval: checks an hour
	// apart already tell a cut-off holder up to three hours late.
	MaxKeepAlive = time.Hour
	// MinOrphanBound is the shortest orphan bound: TCP keep-alive settings
	// count in seconds.
	MinOrphanBound = 3 * time.Second
	// MaxOrphanBound is the longest orphan bound: Linux takes at most
	// 32,767 s for tcp_keepalives_idle, a third of the bound.
	MaxOrphanBound = 27 * time.Hour
)

// Probes are the server's TCP keep-alive settings for an orphan bound.
type Probes struct {
	Idle, Interval, Count int // seconds, seconds, probes
}

// ProbesFor spreads bound b over the first probe and the unanswered ones:
// idle b/3, then count probes every b/6 (each at least 1 s), so that idle +
// count × interval ≤ b for any b of 3 s or more.
func ProbesFor(b time.Duration) Probes {
	sec := int(b / time.Second)
	s := Probes{Idle: max(1, sec/3), Interval: max(1, sec/6)}
	s.Count = max(1, (sec-s.Idle)/s.Interval)
	return s
}

// Bound is the time from the last sign of life to the end of the session.
func (s Probes) Bound() time.Duration {
	return time.Duration(s.Idle+s.Count*s.Interval) * time.Second
}

// sessionSettings returns the settings of a lock session of a Pool with
// orphan bound orphan and application name name, on a server of major
// version major (see sqltext.Settings).
func sessionSettings(orphan time.Duration, name string, major int) sqltext.Settings {
	st := sqltext.Settings{AppName: name, Major: major}
	if orphan > 0 {
		s := ProbesFor(orphan)
		st.Idle, st.Interval, st.Count = s.Idle, s.Interval, s.Count
		st.UserTimeoutMs = int(s.Bound() / time.Millisecond)
	}
	return st
}

// ClientBound is how long after the server stops answering the keep-alive
// reports a lock lost: the next tick, then two checks that time out.
func ClientBound(keepAlive time.Duration) time.Duration {
	t := max(keepAlive, time.Second)
	return keepAlive + FailedChecksBeforeLost*t
}

// BoundsError returns why keepAlive and orphan break the rule that the
// holder is told before the server frees its lock (the client bound must
// stay below three quarters of the orphan bound), or nil.
func BoundsError(keepAlive, orphan time.Duration) error {
	if orphan == 0 {
		return nil
	}
	if orphan < MinOrphanBound {
		return fmt.Errorf("sqllock: WithOrphanBound(%v): the bound must be at least 3s (TCP keep-alive settings count in seconds)", orphan)
	}
	if keepAlive == 0 {
		return nil // no keep-alive: the holder is never told; documented
	}
	if c := ClientBound(keepAlive); c >= orphan*3/4 {
		return fmt.Errorf("sqllock: WithKeepAlive(%v) tells a cut-off holder after up to %v, but WithOrphanBound(%v) lets the server free its lock after %v: "+
			"the holder must be told first, with a margin (keep-alive + 2 × max(keep-alive, 1s) < 3/4 of the bound); lower the keep-alive or raise the bound",
			keepAlive, c, orphan, ProbesFor(orphan).Bound())
	}
	return nil
}

// BoundFor returns the shortest orphan bound, in whole seconds, that lets
// keepAlive tell a cut-off holder first (see BoundsError).
func BoundFor(keepAlive time.Duration) time.Duration {
	b := ClientBound(keepAlive)*4/3 + time.Second
	return max(MinOrphanBound, b.Truncate(time.Second)+time.Second)
}

// KeepAliveFor returns a keep-alive interval that tells a cut-off holder
// within three quarters of orphan (see BoundsError): a fifth of it (at
// most the longest interval, MaxKeepAlive), or, for bounds below 5 s,
// whose checks must fail faster than their 1 s floor, what is left of
// three quarters of it after two checks, with a margin.
func KeepAliveFor(orphan time.Duration) time.Duration {
	if orphan >= 5*time.Second {
		return min(orphan/5, MaxKeepAlive)
	}
	return max(MinKeepAlive, (orphan*3/4-FailedChecksBeforeLost*time.Second)*4/5)
}
