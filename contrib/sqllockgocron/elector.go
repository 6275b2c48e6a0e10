package sqllockgocron

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-co-op/gocron/v2"

	"github.com/sqllock/sqllock"
)

// Elector is a gocron.Elector backed by a [sqllock.Election]: IsLeader
// answers from memory whether this instance's [Elector.Run] holds a term.
// It is safe for concurrent use.
type Elector struct {
	e     *sqllock.Election
	value string

	mu   sync.Mutex
	term *sqllock.Lock // guarded by mu: the term held now, nil when not leading
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector returns an Elector that campaigns in e with value (what
// identifies this instance to the others: see [sqllock.Election.Campaign]).
// It panics if e is nil. It does not campaign until [Elector.Run] is called.
func NewElector(e *sqllock.Election, value string) *Elector {
	if e == nil {
		panic("sqllockgocron: NewElector with a nil *sqllock.Election")
	}
	return &Elector{e: e, value: value}
}

// Run campaigns, leads while elected, and campaigns again after a lost
// term (the loop of [sqllock.Election.Lead]), until ctx ends; then it
// resigns and returns an error matching ctx.Err(). It returns early on an
// error no retry can fix, such as an invalid value. Call it once per
// Elector, in a goroutine of its own.
func (el *Elector) Run(ctx context.Context) error {
	err := el.e.Lead(ctx, el.value, func(ctx context.Context, term *sqllock.Lock) error {
		el.mu.Lock()
		el.term = term
		el.mu.Unlock()
		defer func() {
			el.mu.Lock()
			el.term = nil
			el.mu.Unlock()
		}()
		<-ctx.Done() // the term is lost, or Run's ctx ended
		return nil
	})
	if err != nil {
		return fmt.Errorf("sqllockgocron: election: %w", err)
	}
	return nil
}

// IsLeader implements gocron.Elector: nil while this instance holds a term
// that is not known to be lost, else an error matching
// [sqllock.ErrNotLeader] (and [sqllock.ErrLockLost] for a term found lost).
// It asks nothing of the server.
func (el *Elector) IsLeader(context.Context) error {
	el.mu.Lock()
	term := el.term
	el.mu.Unlock()
	if term == nil {
		return sqllock.ErrNotLeader
	}
	if err := term.Err(); err != nil {
		return fmt.Errorf("%w: %w", sqllock.ErrNotLeader, err)
	}
	return nil
}
