package poolguard

import (
	"log/slog"
	"time"
)

// Policy is what the guard does with a connection that comes back to the
// pool holding advisory locks.
type Policy int

const (
	// Discard closes the connection; PostgreSQL releases its locks as the
	// session ends. The pool opens a new connection when it needs one.
	Discard Policy = iota
	// UnlockAll runs pg_advisory_unlock_all() on the connection and keeps it
	// when that succeeds (and discards it when it fails).
	UnlockAll
	// Report keeps the connection as it is, locks and all; only WithOnLeak and
	// the logger hear of it. For measuring before enforcing.
	Report
)

func (p Policy) String() string {
	switch p {
	case Discard:
		return "discard"
	case UnlockAll:
		return "unlock-all"
	case Report:
		return "report"
	}
	return "unknown"
}

// DefaultCheckTimeout bounds one check of a returning connection.
const DefaultCheckTimeout = 2 * time.Second

// Option configures a Connector.
type Option interface{ apply(*config) }

type config struct {
	policy       Policy
	onLeak       func(Leak)
	always       bool
	logger       *slog.Logger
	checkTimeout time.Duration
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// WithPolicy sets what happens to a leaking connection (default [Discard]).
func WithPolicy(p Policy) Option { return optionFunc(func(c *config) { c.policy = p }) }

// WithOnLeak calls fn for every leak found, whatever the policy. fn runs
// synchronously while database/sql returns the connection to the pool: keep
// it short, and do not use the *sql.DB from it.
func WithOnLeak(fn func(Leak)) Option { return optionFunc(func(c *config) { c.onLeak = fn }) }

// WithCheckAlways checks every connection that comes back, dirty or not: for
// locks taken inside stored functions, whose call text the guard cannot
// recognise. It costs one round trip per return to the pool.
func WithCheckAlways() Option { return optionFunc(func(c *config) { c.always = true }) }

// WithLogger logs each leak at Warn level to l.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.logger = l }) }

// WithCheckTimeout bounds one check (default [DefaultCheckTimeout]); a check
// that takes longer counts as a leak. A check must be bounded:
// WithCheckTimeout panics if d is not positive.
func WithCheckTimeout(d time.Duration) Option {
	if d <= 0 {
		panic("poolguard: WithCheckTimeout: a check must be bounded; got " + d.String())
	}
	return optionFunc(func(c *config) { c.checkTimeout = d })
}
