package sqllock

import (
	"context"
	"database/sql"
	"time"

	"github.com/sqllock/sqllock/internal/core/seams"

	"github.com/sqllock/sqllock/internal/core"
)

// SetAfterBlindStatement makes f run after each statement on a blind
// driver (lib/pq) returns, before its result is handed over; the returned
// func takes f away.
func SetAfterBlindStatement(f func(ctx context.Context, err error, left func() bool)) (restore func()) {
	return seams.Set(seams.Hooks{AfterBlindStatement: f})
}

// LeaseBusy is how many statements the lease of lk's session counts in
// flight; -1 when the session is not leased.
func LeaseBusy(lk *Lock) int32 { return core.Probe{}.LeaseBusy(lk.h) }

// OnConn runs fn on the connection of lk's session between the session's
// own statements (the keep-alive's, a token's), never beside one.
func OnConn(lk *Lock, fn func(conn *sql.Conn) error) error { return core.Probe{}.OnConn(lk.h, fn) }

// ConnOf is the connection that holds lk when it has a session of its own
// (nil on a shared session): for tests that look at that session.
func ConnOf(lk *Lock) *sql.Conn { return core.Probe{}.Conn(lk.h) }

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
	MinServerVersion     = core.MinServerVersion
	LeaderRetries        = leaderRetries
)

// Queued returns how many of l's callers are in k's queue, its head among
// them.
func Queued(l *Locker, k Key) int { return l.pool.Probe().Queued(k.sqlKey()) }

// SemaphoreQueued returns how many of its Locker's callers are in s's
// queue, its head among them.
func SemaphoreQueued(s *Semaphore) int { return s.l.pool.Probe().SlotsQueued(s.slots) }

// SemaphoreSlots returns the keys of the slots of semaphore name of n slots.
var SemaphoreSlots = semaphoreSlots

// SharedOf reports whether lk is held in shared mode.
func SharedOf(lk *Lock) bool { return lk != nil && lk.h.Shared() }

// LoseSession reports s lost, as the keep-alive does when it finds one of
// its keys gone.
func LoseSession(s *Session, cause error) { core.Probe{}.Lose(s.o, cause) }

// SetObserveAsked makes f run after each of an election observer's asks
// is answered (see seams.Hooks); the returned func takes f away.
func SetObserveAsked(f func(key string, sent time.Time, read bool, holder int64)) (restore func()) {
	return seams.Set(seams.Hooks{ObserveAsked: f})
}

// SetHandoffRun makes l hand keys from one of its callers to the next
// for d after the server's last grant.
func SetHandoffRun(l *Locker, d time.Duration) { l.pool.Probe().SetHandoffRun(d) }

// NextCleared reports whether l's next caller queued for k may be handed
// the key, as far as the line goes (a check of the line cleared it).
func NextCleared(l *Locker, k Key) bool { return l.pool.Probe().NextCleared(k.sqlKey()) }

// HandOffs returns how many keys l handed from one of its callers to the
// next without a statement.
func HandOffs(l *Locker) int64 { return l.pool.Probe().HandOffs() }

// SetAfterSlotTry makes f run after each try of a semaphore's slots is
// answered, with the class of its slots' keys; the returned func takes f
// away.
func SetAfterSlotTry(f func(class int32)) (restore func()) {
	return seams.Set(seams.Hooks{AfterSlotTry: f})
}

// MixedBatches returns how many statements of l's shared sessions carried
// unlocks and tries together.
func MixedBatches(l *Locker) int64 { return l.pool.Probe().MixedBatches() }

// OwnHold reports whether lk's Hold was made in lk itself (one allocation
// per lock; see core.Request.Into).
func OwnHold(lk *Lock) bool { return lk != nil && lk.h == &lk.own }

// SkipPoolerProbe makes l take its first lock without probing for a
// transaction pooler first.
func SkipPoolerProbe(l *Locker) { l.pool.Probe().SkipPoolerProbe() }

// IgnorePooler makes l take no notice of a transaction pooler: each
// statement's own check is what meets one.
func IgnorePooler(l *Locker) { l.pool.Probe().IgnorePooler() }

// EndBoundStoppedLate runs the end of a task's bound (WithHoldAtMost) on
// lk as a task that returned at the bound's moment does: the task's
// return stops the watch of its context, which ends right after (its
// Done closes before its AfterFunc starts). It reports what end said:
// whether the bound released the lock.
func EndBoundStoppedLate(lk *Lock, d time.Duration) bool {
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := &boundError{lk: lk, d: d}
	b := lk.startBound(ctx, cause)
	stop := b.stop
	b.stop = func() bool {
		stopped := stop()
		cancel(cause)
		return stopped
	}
	return b.taskReturned()
}
