package sqllock

import (
	"context"
	"database/sql"
)

// SetAfterBlindStatement makes f run after each statement on a blind
// driver (lib/pq) returns, before its result is handed over (see
// boundedRaw); the returned func takes f away.
func SetAfterBlindStatement(f func(ctx context.Context, err error, left func() bool)) (restore func()) {
	afterBlindStatement.Store(&f)
	return func() { afterBlindStatement.Store(nil) }
}

// LeaseBusy is how many statements the lease of lk's session counts in
// flight; -1 when the session is not leased.
func LeaseBusy(lk *Lock) int32 {
	if lk.lease == nil {
		return -1
	}
	return lk.lease.busy.Load()
}

// ConnOf is the connection that holds lk when it has a session of its own
// (nil on a shared session): for tests that look at that session.
func ConnOf(lk *Lock) *sql.Conn {
	if lk.c.dedicated {
		return lk.c.conn
	}
	return nil
}

// The limits and defaults the tests check against.
const (
	DefaultUnlockTimeout = defaultUnlockTimeout
	DefaultKeepAlive     = defaultKeepAlive
	DefaultOrphanBound   = defaultOrphanBound
	ElectionPrefix       = electionPrefix
	MinKeepAlive         = minKeepAlive
	MinOrphanBound       = minOrphanBound
	MaxOrphanBound       = maxOrphanBound
	MaxKeepAlive         = maxKeepAlive
	MaxUnlockTimeout     = maxUnlockTimeout
	MaxHoldWindow        = maxHoldWindow
	MinServerVersion     = minServerVersion
)

// SemaphoreSlots returns the keys of the slots of semaphore name of n slots.
var SemaphoreSlots = semaphoreSlots

// SharedOf reports whether lk is held in shared mode.
func SharedOf(lk *Lock) bool { return lk != nil && lk.shared }

// LoseSession reports s lost, as the keep-alive does when it finds one of
// its keys gone.
func LoseSession(s *Session, cause error) { s.lose(cause) }
