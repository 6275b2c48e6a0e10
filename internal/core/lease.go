package core

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The lease: a holder that stops showing life while its TCP connection
// stays up (a process stopped or paused, its kernel still answering) loses
// its locks within the orphan bound. Each session that holds locks has the
// server end it once it has been idle for the bound (idle_session_timeout,
// PostgreSQL 14 and later), and the Locker keeps every such session from
// going idle that long, with a statement on it when it has had none for a
// third of the bound. A holder that was paused past the bound finds its
// lease expired before anything else: Err and the keep-alive compare the
// time since the last statement sent on the session with the bound, less
// a margin, and report the lock lost; the server has ended the session, or
// is about to, so the next holder may already hold the key.

// lease is one session's idle clock, as its client knows it. A nil lease
// (a server older than 14, no orphan bound, no keep-alive) never expires.
type lease struct {
	bound    time.Duration
	beat     atomic.Int64 // stmt.MonoNow when the last statement that succeeded on the session was sent
	busy     atomic.Int32 // statements (or Session calls) in flight: the session is not idle
	touching atomic.Bool  // a touch is in flight
	off      atomic.Bool  // not leased any more: its connection was handed to the caller
}

// leasing is the part of a Pool that gives its sessions their leases.
type leasing struct {
	p *Pool // its Pool
}

// newLease returns the lease of a session whose last statement was sent at
// sent (stmt.MonoNow), or nil when p leases nothing.
func (lg *leasing) newLease(sent int64) *lease {
	p := lg.p
	b := p.leaseBound()
	if b <= 0 {
		return nil
	}
	ls := &lease{bound: b}
	ls.beat.Store(sent)
	return ls
}

// leaseBound is the lease of l's sessions: the orphan bound, on servers
// that have idle_session_timeout, when the keep-alive runs (it touches the
// sessions); 0 otherwise.
func (lg *leasing) leaseBound() time.Duration {
	p := lg.p
	if !p.leased.Load() {
		return 0
	}
	return p.cfg.OrphanBound
}

// leases reports whether a Pool with cfg leases its sessions on a server
// of major version major.
func leases(cfg Config, major int) bool {
	// A pinned session's lease is its transaction's
	// idle_in_transaction_session_timeout, which every supported major has.
	return (major >= 14 || cfg.TxPooler) && cfg.OrphanBound > 0 && cfg.KeepAlive > 0
}

// sent records a statement sent at at (stmt.MonoNow) that succeeded.
func (ls *lease) sent(at int64) {
	if ls == nil {
		return
	}
	for {
		old := ls.beat.Load()
		if at <= old || ls.beat.CompareAndSwap(old, at) {
			return
		}
	}
}

// begin and done bracket a statement (or a Session's call) on the
// session; done records it as a sign of life when ok.
func (ls *lease) begin() int64 {
	if ls != nil {
		ls.busy.Add(1)
	}
	return stmt.MonoNow()
}

func (ls *lease) done(sent int64, ok bool) {
	if ls == nil {
		return
	}
	if ok {
		ls.sent(sent)
	}
	ls.busy.Add(-1)
}

// idle is how long ago the last statement that succeeded was sent.
func (ls *lease) idle() time.Duration { return time.Duration(stmt.MonoNow() - ls.beat.Load()) }

// expired reports whether the server may have ended the session: no
// statement in flight, and none sent for the bound less leaseMargin.
func (ls *lease) expired() bool {
	if ls == nil || ls.off.Load() || ls.busy.Load() > 0 {
		return false
	}
	return ls.idle() > ls.bound-leaseMargin(ls.bound)
}

// due reports whether the session needs a touch.
func (ls *lease) due() bool {
	return ls != nil && !ls.off.Load() && ls.busy.Load() == 0 && ls.idle() > ls.bound/3
}

// leaseMargin is how much sooner than the server the client counts a lease
// expired: a tenth of the bound, at least half a second.
func leaseMargin(bound time.Duration) time.Duration {
	return max(bound/10, 500*time.Millisecond)
}

// expiredError is the cause of a loss by an expired lease.
func (ls *lease) expiredError() error {
	return fmt.Errorf("no statement reached its session for %v (the process was paused or stopped?): the server ends a holding session idle for the orphan bound (%v)",
		ls.idle().Round(time.Millisecond), ls.bound)
}

// touchSQL is the statement that keeps a leased session from going idle.
const touchSQL = sqltext.TouchSQL

// leaseCheck is the keep-alive's part of the lease, on each tick: a
// session whose lease expired is lost; one that needs a touch gets one, in
// the background (one at a time per session).
func (m *monitor) leaseCheck(ws []watched) {
	for _, w := range ws {
		ls := w.leaseOf()
		switch {
		case ls.expired():
			w.lose(ls.expiredError())
		case ls.due() && ls.touching.CompareAndSwap(false, true):
			go func() {
				defer ls.touching.Store(false)
				ctx, cancel := context.WithTimeout(context.Background(), m.p.checkTimeout())
				defer cancel()
				if err := w.touch(ctx); err != nil {
					w.lose(fmt.Errorf("the statement that keeps its session from going idle failed: %w", err))
				}
			}()
		}
	}
}

// stopLease ends the lease of a session whose connection is handed to the
// caller (Session.Conn): statements of the caller's own must not
// meet the library's, so nothing keeps the session from going idle any
// more, and the server must not end it when it is. It reports whether the
// session is fine.
func (lg *leasing) stopLease(ls *lease, run func(ctx context.Context, q string) error) error {
	p := lg.p
	if ls == nil || !ls.off.CompareAndSwap(false, true) {
		return nil
	}
	return run(p.UnlockContext(), sqltext.NoIdleTimeoutSQL)
}
