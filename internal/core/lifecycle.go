package core

import (
	"context"
	"sync"
)

// lifecycle is what a Hold and an Owned share: a state that only moves
// forward, the error that goes with it, and a Done that closes with that
// error as its cause. Its mu guards its fields, and the fields its owner
// says it guards.
type lifecycle struct {
	mu    sync.Mutex
	state holdState // guarded by mu
	err   error     // guarded by mu: nil while held
	ended bool      // guarded by mu: Done is closed, or closing
	// ctx is cancelled with err once ended; made on first use (guarded by
	// mu), because most are never watched.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Context returns a context that is cancelled, with the error as its
// cause, once the lifecycle ended (released, closed or lost).
func (l *lifecycle) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithCancelCause(context.Background())
		if l.ended {
			l.cancel(l.err)
		}
	}
	return l.ctx
}

// Done returns a channel that is closed once the lifecycle ended.
func (l *lifecycle) Done() <-chan struct{} { return l.Context().Done() }

// error returns the error: nil while held.
func (l *lifecycle) error() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// settle sets the final state and error, and closes Done.
func (l *lifecycle) settle(state holdState, err error) {
	l.mu.Lock()
	l.state, l.err = state, err
	l.mu.Unlock()
	l.closeDone()
}

// closeDone closes Done, with the error as the cause.
func (l *lifecycle) closeDone() {
	l.mu.Lock()
	l.ended = true
	cancel, err := l.cancel, l.err
	l.mu.Unlock()
	if cancel != nil {
		cancel(err)
	}
}
