package core

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"
)

// ErrClosed is the error of a call on a Pool that is closing or closed
// (see Pool.Close); the sqllock package re-exports it.
var ErrClosed = errors.New("sqllock: Locker closed")

// errReleasedByClose is the error of a Hold that Close released: it matches
// stmt.ErrReleased and ErrClosed.
var errReleasedByClose = fmt.Errorf("%w: %w", stmt.ErrReleased, ErrClosed)

// closing is a Pool's end: once StartClose ran, no call takes a lock, and
// the calls that wait leave.
type closing struct {
	p *Pool // its Pool

	started atomic.Bool
	once    sync.Once
	// ctx is cancelled (cause ErrClosed) by StartClose: the waits of the
	// Pool's calls watch it (untilClosed). Made with the Pool.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// init makes the closing of a new Pool.
func (c *closing) init() {
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
}

// Closed reports whether StartClose ran.
func (cl *closing) Closed() bool {
	return cl.started.Load()
}

// closedError is the error of a call on a closed Pool, about the lock
// named what.
func closedError(what string) error {
	return fmt.Errorf("%w: %s: %w", stmt.ErrNotAcquired, what, ErrClosed)
}

// untilClosed returns ctx, cancelled also when the Pool starts closing,
// for a call that is about to wait (a wait is long; a try ends by itself).
// stop releases what it took.
func (cl *closing) untilClosed(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(cl.ctx, func() { cancel(ErrClosed) })
	return cctx, func() { stop(); cancel(nil) }
}

// waitInLine is the engine's WaitInLine (wait.Engine.WaitInLine), left
// when the Pool starts closing.
func (p *Pool) waitInLine(ctx context.Context, w wait.Waiter, st *statements, ln wait.Line, pid int64) wait.Outcome {
	ctx, stop := p.untilClosed(ctx)
	defer stop()
	return p.Engine.WaitInLine(ctx, w, st, ln, pid)
}

// waitOn is the engine's WaitOn (wait.Engine.WaitOn), left when the Pool
// starts closing.
func (p *Pool) waitOn(ctx context.Context, w wait.Waiter, lv wait.Level, st *statements, kind Kind, k Key, pid int64) wait.Outcome {
	ctx, stop := p.untilClosed(ctx)
	defer stop()
	return p.Engine.WaitOn(ctx, w, lv, st, kind, k, pid)
}

// closedOr returns err, which a call of the Pool's returns, matching
// ErrClosed too when the Pool closed meanwhile and err says the call
// took nothing.
func (cl *closing) closedOr(err error) error {
	p := cl.p
	switch {
	case err == nil || !p.Closed() || errors.Is(err, ErrClosed):
		return err
	case errors.Is(err, stmt.ErrNotAcquired):
		return fmt.Errorf("%w (%w)", err, ErrClosed)
	case errors.Is(err, context.Canceled):
		// The wait's context, which the closing cancelled, ended it.
		return fmt.Errorf("%w: %w (%w)", stmt.ErrNotAcquired, err, ErrClosed)
	}
	return err
}

// StartClose makes the Pool take no new lock, and its calls that wait
// (in its queues, in the server) leave, with an error matching
// stmt.ErrNotAcquired and ErrClosed. What the Pool holds stays held until
// Close.
func (cl *closing) StartClose() {
	cl.once.Do(func() {
		cl.started.Store(true)
		cl.cancel(ErrClosed)
	})
}

// Close starts closing (StartClose), then releases every lock the Pool
// holds (Holds and Owned sessions), confirming each unlock as Release
// does, and ends its shared sessions that hold nothing, so that their
// connections go back to the pool now. It returns once every session of
// the Pool has ended, or the unlock timeout has passed, with the errors
// of the releases that were not confirmed (each wraps stmt.ErrLockLost, or the
// error that ended its session, which the server then releases); its
// spare connections go back to the pool too (see stmt's budget.go). Holds it
// released report an error matching stmt.ErrReleased and ErrClosed.
func (cl *closing) Close() error {
	p := cl.p
	p.StartClose()
	var holds []*Hold
	var owners []*Owned
	var shared []*session
	for _, s := range p.liveSessions() {
		s.mu.Lock()
		for h := s.held.head; h != nil; h = h.next {
			holds = append(holds, h)
		}
		if s.owner != nil {
			owners = append(owners, s.owner)
		}
		if s.kind == kindShared {
			shared = append(shared, s)
		}
		s.mu.Unlock()
	}
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		if err != nil && !errors.Is(err, stmt.ErrReleased) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	}
	var wg sync.WaitGroup
	for _, h := range holds {
		wg.Go(func() {
			_, err := h.Release()
			fail(err)
		})
	}
	for _, o := range owners {
		wg.Go(func() { fail(o.Close()) })
	}
	wg.Wait()
	for _, s := range shared {
		s.closeIfIdle()
	}
	deadline := time.Now().Add(p.cfg.UnlockTimeout)
	for len(p.liveSessions()) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.AwaitFreed(time.Until(deadline))
	// The connections go back to the pool before Close returns: an ended
	// session's, once the statement on it returned (a discarded waiter's
	// cancelled wait, say), and the budget's (spares, a cancel under way).
	for {
		p.Budget.Flush()
		if p.unended.Load() == 0 && p.Budget.Count() == 0 || !time.Now().Before(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	return errors.Join(errs...)
}
