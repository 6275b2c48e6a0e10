package sqllock

import "sync/atomic"

// Stats are counters of a Locker since New.
type Stats struct {
	Held      int64 // locks held now
	Acquired  int64 // locks granted
	Contended int64 // non-waiting attempts that found the lock taken
	Lost      int64 // locks lost while held
	Discarded int64 // connections closed instead of returned to the pool
	// KeepAliveChecks counts keep-alive queries: one per interval for all
	// of the Locker's locks and Sessions, whatever their number.
	KeepAliveChecks int64
	// KeepAliveSkipped counts intervals in which the keep-alive could not
	// check because the pool was at its SetMaxOpenConns limit. Such an
	// interval is not evidence that a lock was lost; no lock is watched
	// during it.
	KeepAliveSkipped int64
	// SnapshotWaits counts waits started again because PostgreSQL reported
	// a holder's CREATE INDEX CONCURRENTLY (or kin), waiting for the wait's
	// snapshot, as a deadlock (rare: waits are sliced to avoid it).
	SnapshotWaits int64
	// Windows is how many held locks wait for the end of their hold
	// window (Lock.UnlockAfter, WithHoldAtLeast), their work done.
	Windows int64
	// ObserverPanics counts panics of observers and log handlers, which
	// were recovered (see [Observer]).
	ObserverPanics int64
	// SharedSessions is the number of server sessions the Locker shares
	// among its exclusive locks now (see [Locker.Lock]); a lock on a session
	// of its own adds one session that this does not count.
	SharedSessions int
}

type lockerStats struct {
	held, acquired, contended, lost, discarded, keepAlive, keepAliveSkipped, windows, observerPanics atomic.Int64
}

// Stats returns the Locker's counters.
func (l *Locker) Stats() Stats {
	return Stats{Held: l.stats.held.Load(), Acquired: l.stats.acquired.Load(), Contended: l.stats.contended.Load(),
		Lost: l.stats.lost.Load(), Discarded: l.stats.discarded.Load(), KeepAliveChecks: l.stats.keepAlive.Load(),
		KeepAliveSkipped: l.stats.keepAliveSkipped.Load(), SnapshotWaits: l.snapshotWaits.Load(),
		Windows: l.stats.windows.Load(), ObserverPanics: l.stats.observerPanics.Load(),
		SharedSessions: l.share.sessions()}
}

// took counts n locks granted and now held.
func (s *lockerStats) took(n int64) {
	s.acquired.Add(n)
	s.held.Add(n)
}

// released counts n held locks released.
func (s *lockerStats) released(n int64) { s.held.Add(-n) }

// lostHeld counts n held locks found lost.
func (s *lockerStats) lostHeld(n int64) {
	s.held.Add(-n)
	s.lost.Add(n)
}
