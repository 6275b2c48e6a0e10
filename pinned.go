package sqllock

import (
	"context"
	"sync"
)

// pinned is the core of both handles, Lock and Session (each over the
// carrier that owns its server session): the backend that holds their
// locks, and the handle's one lifecycle (held, then released
// or lost), told through Done and Err. The handles embed it; its mu also
// guards their own fields.
type pinned struct {
	l   *Locker
	pid int64
	id  ident // who granted its locks (see checkServer)
	// lease is the session's idle clock (nil: not leased; see lease.go);
	// a Lock on a shared session shares that session's.
	lease *lease

	mu    sync.Mutex
	state lockState // guarded by mu
	err   error     // guarded by mu: nil while held
	ended bool      // guarded by mu: Done fires (set last, after the stats and the events)

	// ctx is cancelled with err once ended; made on first use (guarded by
	// mu), because most handles are never watched.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

type lockState uint8

const (
	stateHeld lockState = iota
	stateReleasing
	stateLost
	stateReleased
)

// context returns a context that is cancelled, with the handle's error as
// its cause, once it is released or lost.
func (p *pinned) context() context.Context {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx == nil {
		p.ctx, p.cancel = context.WithCancelCause(context.Background())
		if p.ended {
			p.cancel(p.err)
		}
	}
	return p.ctx
}

// end fires Done with the handle's error as the cause.
func (p *pinned) end() {
	p.mu.Lock()
	p.ended = true
	cancel, err := p.cancel, p.err
	p.mu.Unlock()
	if cancel != nil {
		cancel(err)
	}
}

// settle sets the handle's final state and error, and fires Done.
func (p *pinned) settle(state lockState, err error) {
	p.mu.Lock()
	p.state, p.err = state, err
	p.mu.Unlock()
	p.end()
}

// done returns the channel Done returns (closedChan for a nil handle).
func (p *pinned) done() <-chan struct{} { return p.context().Done() }

// error returns the handle's error: nil while held.
func (p *pinned) error() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
