package sqllock

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

// Sentinel errors. Match them with [errors.Is]: the errors this package
// returns wrap them together with the underlying cause.
var (
	// ErrNotAcquired is returned by TryLock, TryRLock and the other
	// non-waiting calls when another session holds a conflicting lock, and by
	// every acquiring call whose context ended before the lock was granted;
	// in that case the error also matches the context's error
	// (context.Canceled or context.DeadlineExceeded). TryDo reports the
	// first case as (false, nil).
	ErrNotAcquired = errors.New("sqllock: lock not acquired")

	// ErrReleased is returned by the methods of a Lock (or Session) that was
	// already released, and by Unlock on a nil Lock.
	ErrReleased = errors.New("sqllock: lock released")

	// ErrLockLost is wrapped by Lock.Err, and by Unlock, when the lock is no
	// longer held although it was never released: the session died, the
	// server restarted, or the keep-alive found the lock gone.
	ErrLockLost = errors.New("sqllock: lock lost")

	// ErrStandby is returned by the acquiring calls when the server is a hot
	// standby (pg_is_in_recovery() is true): locks taken there do not
	// conflict with the primary's. Nothing is left held: a session-level
	// lock is released before returning, a transaction-level one is never
	// taken. WithAllowStandby turns the check off for a Locker's calls
	// (InTx among them); LockTx and kin always refuse a standby.
	ErrStandby = errors.New("sqllock: server is a standby")

	// ErrSessionChanged is returned, or wrapped by ErrLockLost, when a
	// statement on the pinned connection ran on a different backend than the
	// one that was granted the lock: a transaction-mode pooler (such as
	// PgBouncer with pool_mode=transaction) sits between the client and the
	// server. Use the transaction-scoped locks (LockTx, InTx) there.
	ErrSessionChanged = errors.New("sqllock: backend session changed")

	// ErrDeadlock is returned when PostgreSQL aborts a lock wait because it
	// would deadlock (SQLSTATE 40P01).
	ErrDeadlock = errors.New("sqllock: deadlock detected")

	// ErrLockTableFull is returned when the server's shared lock table is
	// exhausted (SQLSTATE 53200, "out of shared memory"); raise
	// max_locks_per_transaction or hold fewer locks at once.
	ErrLockTableFull = errors.New("sqllock: lock table full")

	// ErrUnsupportedServer is returned when the server does not implement
	// PostgreSQL advisory locks (for example CockroachDB, whose advisory
	// lock functions do not lock anything).
	ErrUnsupportedServer = errors.New("sqllock: unsupported server")

	// ErrInvalidKey is returned by ParseKey for malformed text and by every
	// call given the zero Key.
	ErrInvalidKey = errors.New("sqllock: invalid key")

	// ErrDuplicate is returned by Registry.Register when the name, or the
	// key, is already registered.
	ErrDuplicate = errors.New("sqllock: duplicate registry entry")
)

// connectionBroken reports whether err means the connection or its session
// is gone (a bad connection, a network error, SQLSTATE class 08, or 57P
// operator intervention such as a terminated backend or a shutdown), as
// opposed to an answer from a live session.
func connectionBroken(err error) bool {
	for _, answer := range []error{ErrNotAcquired, ErrStandby, ErrDeadlock, ErrLockTableFull, ErrUnsupportedServer, ErrInvalidKey} {
		if errors.Is(err, answer) {
			return false
		}
	}
	var ne net.Error
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) {
		return true
	}
	if st := sqlState(err); strings.HasPrefix(st, "08") || strings.HasPrefix(st, "57P") {
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

// ctxEnded reports whether ctx is done or past its deadline. A driver can
// see the deadline pass (a dial or read times out) a moment before ctx.Err()
// turns non-nil.
func ctxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// ctxErr returns ctx.Err(), or context.DeadlineExceeded when the deadline
// has passed but ctx does not say so yet.
func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return context.DeadlineExceeded
}

// mustContext panics when ctx is nil, naming call, the exported function
// or method given it: a nil context is a programmer's error, caught at the
// call before anything is sent or any state changes. Further down it would
// do harm: database/sql, given one, panics while holding its own mutex and
// leaves the whole *sql.DB stuck, and an Unlock would release the lock,
// then panic with its handle left in a false state.
func mustContext(ctx context.Context, call string) {
	if ctx == nil {
		panic("sqllock: " + call + " called with a nil context")
	}
}

func notAcquired(k string, ctxErr error) error {
	return fmt.Errorf("%w: %s: %w", ErrNotAcquired, k, ctxErr)
}

// lockError classifies a failed lock statement.
func lockError(k string, err error) error {
	switch sqlState(err) {
	case "40P01":
		return fmt.Errorf("%w: lock %s: %w", ErrDeadlock, k, err)
	case "53200":
		return fmt.Errorf("%w: lock %s: %w", ErrLockTableFull, k, err)
	case "55P03", "57014": // lock_timeout, statement_timeout
		return fmt.Errorf("%w: lock %s: %w", ErrNotAcquired, k, err)
	}
	return fmt.Errorf("sqllock: lock %s: %w", k, err)
}

// sqlState returns the SQLSTATE of a server error from any driver that
// exposes one (lib/pq and pgx both do), and otherwise recognises the two
// messages this package cares about.
func sqlState(err error) string {
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

// standbyError says why a lock on a standby is refused.
func standbyError(what string) error {
	return fmt.Errorf("%w (%s): its advisory locks do not conflict with the primary's; connect to the primary (or use WithAllowStandby)", ErrStandby, what)
}

// foreignSession is the error of a lock statement that found its server
// session marked by another lock session (see sqltext.Statements), and
// took nothing: a transaction-mode pooler put two clients on one server
// session.
func foreignSession() error {
	return fmt.Errorf("%w: the server session already carries another client's lock session: a transaction-mode pooler (such as PgBouncer with pool_mode=transaction) is in the way; session locks are unsafe there, use LockTx or InTx", ErrSessionChanged)
}

// sessionChanged says what a changed backend means (now is 0 when the
// new backend's pid is not known).
func sessionChanged(was, now int64) error {
	to := "another"
	if now != 0 {
		to = strconv.FormatInt(now, 10)
	}
	return fmt.Errorf("%w from backend %d to %s: a transaction-mode pooler (such as PgBouncer with pool_mode=transaction) is in the way; session locks are unsafe there, use LockTx or InTx", ErrSessionChanged, was, to)
}

// HeldError is the error of a lock that could not be taken, from a Locker
// made [WithHolders]: it says who held (or waited for) the key when the
// call gave up. It matches [ErrNotAcquired], and the context's error when
// a wait ended, with errors.Is; get it with errors.As.
type HeldError struct {
	Key     Key
	Holders []HeldLock // holders first, then waiters; empty when they could not be read
	err     error
}

// Error implements error: the refusal, naming the first holder once, as
// in "sqllock: lock not acquired: 42 is held by pid 1234 (application
// "billing", idle) from 10.0.0.7 since 15:04:05", or a wait's end and
// "; held by" the holder. Of a session of another role (one whose query
// the server hides from this role), it gives only the backend: error
// strings end up in logs that other people read, and what another role
// names its sessions is not theirs to see there ([HeldError].Holders
// keeps every field).
func (e *HeldError) Error() string {
	msg := e.err.Error()
	for _, h := range e.Holders {
		if !h.Granted {
			continue
		}
		by := h.holder()
		if h.Hidden {
			by = fmt.Sprintf("backend %d, a session of another role", h.PID)
		}
		if rest, ok := strings.CutSuffix(msg, heldElsewhere); ok {
			return rest + "is held by " + by // a refusal: "another session" named
		}
		if e.Key == (Key{}) {
			return msg + "; one slot held by " + by // a semaphore's
		}
		return msg + "; held by " + by
	}
	return msg
}

// heldElsewhere ends the error of a lock refused because another session
// holds it (see judge), which a HeldError replaces with the holder.
const heldElsewhere = "is held by another session"

// Unwrap returns the refusal (which wraps ErrNotAcquired).
func (e *HeldError) Unwrap() error { return e.err }
