package sqllock

import "sync/atomic"

// Stats are counters of a Locker since New.
type Stats struct {
	Held      int64 // locks held now
	Acquired  int64 // locks granted
	Contended int64 // non-waiting attempts that found the lock taken
	// TimedOut counts waiting lock calls (Lock, RLock, Do, a Semaphore's
	// Acquire, an Election's campaign, Session.Lock, InTx) that returned
	// without the lock because their context's deadline passed while they
	// waited: each returned an error matching ErrNotAcquired and
	// context.DeadlineExceeded. A call whose context was cancelled is not
	// counted (its caller gave up; no deadline was too short), nor one whose
	// deadline had passed before it began (it sent nothing).
	TimedOut  int64
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

// lockerStats are what the Locker counts itself; its core counts the
// rest.
type lockerStats struct {
	windows, observerPanics atomic.Int64
}

// Stats returns the Locker's counters.
func (l *Locker) Stats() Stats {
	c := l.pool.Stats()
	return Stats{Held: c.Held, Acquired: c.Acquired, Contended: c.Contended, TimedOut: c.TimedOut, Lost: c.Lost, Discarded: c.Discarded,
		KeepAliveChecks: c.KeepAliveChecks, KeepAliveSkipped: c.KeepAliveSkipped, SnapshotWaits: c.SnapshotWaits,
		Windows: l.stats.windows.Load(), ObserverPanics: l.stats.observerPanics.Load(), SharedSessions: c.SharedSessions}
}
