package stmt

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// The sentinel errors of the sqllock package, which re-exports them (and
// documents who returns each): they live here so that the core's errors
// wrap them.
var (
	ErrNotAcquired       = errors.New("sqllock: lock not acquired")
	ErrReleased          = errors.New("sqllock: lock released")
	ErrLockLost          = errors.New("sqllock: lock lost")
	ErrStandby           = errors.New("sqllock: server is a standby")
	ErrSessionChanged    = errors.New("sqllock: backend session changed")
	ErrDeadlock          = errors.New("sqllock: deadlock detected")
	ErrLockTableFull     = errors.New("sqllock: lock table full")
	ErrUnsupportedServer = errors.New("sqllock: unsupported server")
	ErrInvalidKey        = errors.New("sqllock: invalid key")
)

// ErrAbandoned reports a statement that outlived its context on a driver
// that does not give up a read when its context ends (lib/pq, on a network
// that stopped answering): the caller got its answer at the context's end,
// and the connection is closed, as discarded, once the statement returns.
// The caller must not use the connection again.
var ErrAbandoned = errors.New("sqllock: no answer from the server by the end of the context; the connection is discarded when the statement returns")

// HeldElsewhere ends the error of a lock refused because another session
// holds it (see the core's judge), which the sqllock package's HeldError replaces with the
// holder.
const HeldElsewhere = "is held by another session"

// ConnectionBroken reports whether err means the connection or its session
// is gone (a bad connection, a network error, SQLSTATE class 08, or 57P
// operator intervention such as a terminated backend or a shutdown), as
// opposed to an answer from a live session.
func ConnectionBroken(err error) bool {
	for _, answer := range []error{ErrNotAcquired, ErrStandby, ErrDeadlock, ErrLockTableFull, ErrUnsupportedServer, ErrInvalidKey} {
		if errors.Is(err, answer) {
			return false
		}
	}
	var ne net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) {
		return true
	}
	if st := SQLState(err); strings.HasPrefix(st, "08") || strings.HasPrefix(st, "57P") {
		return true
	}
	msg := err.Error()
	for _, s := range []string{"conn closed", "bad connection", "broken pipe", "connection reset", "connection refused"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// CtxEnded reports whether ctx is done or past its deadline. A driver can
// see the deadline pass (a dial or read times out) a moment before ctx.Err()
// turns non-nil.
func CtxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// CtxErr returns ctx.Err(), or context.DeadlineExceeded when the deadline
// has passed but ctx does not say so yet.
func CtxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// NotAcquired is the error of a call whose ctx ended (ctxErr) before the
// lock named what was granted.
func NotAcquired(what string, ctxErr error) error {
	return fmt.Errorf("%w: %s: %w", ErrNotAcquired, what, ctxErr)
}

// LockError classifies a failed lock statement.
func LockError(what string, err error) error {
	switch SQLState(err) {
	case "40P01":
		return fmt.Errorf("%w: lock %s: %w", ErrDeadlock, what, err)
	case "53200":
		return fmt.Errorf("%w: lock %s: %w", ErrLockTableFull, what, err)
	case "55P03", "57014": // lock_timeout, statement_timeout
		return fmt.Errorf("%w: lock %s: %w", ErrNotAcquired, what, err)
	}
	return fmt.Errorf("sqllock: lock %s: %w", what, err)
}

// The SQLSTATE codes the core reads, each asked by one function: the only
// place outside the judge where a code is compared (a test keeps it so).

// LockTimedOut: lock_not_available (55P03), a wait's lock_timeout fired.
func LockTimedOut(err error) bool { return SQLState(err) == "55P03" }

// Deadlocked: deadlock_detected (40P01): the server chose this statement
// as a deadlock's victim; it took nothing.
func Deadlocked(err error) bool { return SQLState(err) == "40P01" }

// LockTableFull: out_of_memory (53200), the shared lock table is full.
func LockTableFull(err error) bool { return SQLState(err) == "53200" }

// QueryCanceled: query_canceled (57014), a cancel or a statement_timeout.
func QueryCanceled(err error) bool { return SQLState(err) == "57014" }

// AdminShutdown: admin_shutdown (57P01), the backend was terminated.
func AdminShutdown(err error) bool { return SQLState(err) == "57P01" }

// preparedMissing: invalid_sql_statement_name (26000), a prepared
// statement that is not there.
func preparedMissing(err error) bool { return SQLState(err) == "26000" }

// PreparedAstray: a prepared statement missing (26000) or there already
// (duplicate_prepared_statement, 42P05): another client's server session.
func PreparedAstray(err error) bool {
	switch SQLState(err) {
	case "26000", "42P05":
		return true
	}
	return false
}

// StandbyRefusal: feature_not_supported (0A000) or read_only_sql_transaction
// (25006), as a standby refuses a read-write or serializable transaction,
// or a write.
func StandbyRefusal(err error) bool {
	switch SQLState(err) {
	case "0A000", "25006":
		return true
	}
	return false
}

// SQLState returns the SQLSTATE of a server error from any driver that
// exposes one (lib/pq and pgx both do), and otherwise recognises the two
// messages this package cares about.
func SQLState(err error) string {
	if err == nil {
		return ""
	}
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "deadlock detected"):
		return "40P01"
	case strings.Contains(msg, "out of shared memory"):
		return "53200"
	}
	return ""
}

// StandbyError says why a lock on a standby is refused.
func StandbyError(what string) error {
	return fmt.Errorf("%w (%s): its advisory locks do not conflict with the primary's; connect to the primary (or use WithAllowStandby)", ErrStandby, what)
}

// ForeignSession is the error of a lock statement that found its server
// session marked by another lock session (see sqltext.Statements), and
// took nothing: a transaction-mode pooler put two clients on one server
// session.
func ForeignSession() error {
	return NewPoolerError("the server session already carries another client's lock session")
}

// SessionChanged says what a changed backend means (now is 0 when the
// new backend's pid is not known).
func SessionChanged(was, now int64) error {
	to := "another"
	if now != 0 {
		to = strconv.FormatInt(now, 10)
	}
	if was == 0 {
		// The backend was never known: nothing says another one answered
		// because a pooler is in the way.
		return fmt.Errorf("%w: another backend than the session's answered", ErrSessionChanged)
	}
	return NewPoolerError("from backend " + strconv.FormatInt(was, 10) + " to " + to)
}

// NewPoolerError returns the error of a session-level lock call behind a
// transaction pooler, for evidence that says so for certain: it matches
// ErrSessionChanged, and says what to do.
func NewPoolerError(evidence string) error { return &PoolerError{evidence} }

// PoolerError is NewPoolerError's: evidence of a pooler, which the core's
// poolerEvidence
// tells from other errors that match ErrSessionChanged (an unlock that
// found no row on a session whose backend was never known, say).
type PoolerError struct{ evidence string }

func (e *PoolerError) Error() string {
	return ErrSessionChanged.Error() + ": " + e.evidence + ": a transaction-mode pooler (such as PgBouncer with pool_mode=transaction, Supavisor or a pooled endpoint) is in the way, where a session lock excludes no one; use sqllock.WithTransactionPooler(), or transaction locks (LockTx, InTx)"
}

func (e *PoolerError) Is(target error) bool { return target == ErrSessionChanged }
