// Package sqltext holds every SQL text that sqllock sends: the Statements
// are written once, here, and read by the sqllock package, by poolguard,
// and by sqllockmock, whose expectations are built from the same
// functions, so that the two cannot drift apart.
package sqltext

import (
	"strconv"
	"strings"
)

// The Statements this package sends. Every statement reads its answer with
// QueryRow (never Exec: some drivers report success for a statement that a
// cancellation interrupted), and each lock statement returns the backend pid
// and pg_is_in_recovery() in the same round trip.
//
// Keys reach the server either as bind parameters ($1), or, for drivers
// whose parameterized queries cost two round trips (lib/pq), rendered into
// the SQL text by this package. Keys are integers this package formats
// itself, so no caller text ever becomes SQL.

// Every statement starts with a marker, a comment that says what it does
// ("/* sqllock: wait */ SELECT ..."): pg_stat_activity shows it as the
// statement's first words, so that a session's query tells sqllock's own
// statements from an application's, and which of them it is (Label reads
// it; `sqllock inspect` shows it in place of the text). The markers:
const (
	markPrefix    = "/* sqllock: "
	markSuffix    = " */ "
	markTry       = markPrefix + "try" + markSuffix          // a try of a lock, or of many
	markWait      = markPrefix + "wait" + markSuffix         // a wait for a lock, or what it needs
	markLine      = markPrefix + "line" + markSuffix         // a place in a key's line: taken, given up, asked about
	markUnlock    = markPrefix + "unlock" + markSuffix       // an unlock, or many
	markBatch     = markPrefix + "batch" + markSuffix        // unlocks and tries together
	markKeepAlive = markPrefix + "keep-alive" + markSuffix   // the keep-alive's checks, a lease's touch
	markCheck     = markPrefix + "server check" + markSuffix // which server answers, and how
	markSession   = markPrefix + "session" + markSuffix      // a session's settings, set or set back; its locks; whether its transaction is waited for
	markToken     = markPrefix + "token" + markSuffix        // a fencing token, or whether a lock is held
	markInspect   = markPrefix + "inspect" + markSuffix      // Inspect's and Holders' read of the locks
	markElection  = markPrefix + "election" + markSuffix     // who leads, who campaigns
	markCancel    = markPrefix + "cancel wait" + markSuffix  // an abandoned wait taken out of the server
	markFree      = markPrefix + "free" + markSuffix         // a lock no one can reach, freed with its server session
	markBreak     = markPrefix + "break" + markSuffix        // a stranded lock's holder ended (sqllock break)
)

// Label returns what q, one of this package's statements as the server
// shows it (pg_stat_activity.query), does: "sqllock: wait", "sqllock:
// keep-alive", ... (see the markers). ok is false for any other text.
func Label(q string) (label string, ok bool) {
	m := Marker(q)
	if m == "" {
		return "", false
	}
	return "sqllock: " + m[len(markPrefix):len(m)-len(markSuffix)], true
}

// Marker returns the marker q starts with, a part of q ("" when none).
func Marker(q string) string {
	if !strings.HasPrefix(q, markPrefix) {
		return ""
	}
	n := len(markPrefix)
	for n < len(q) && n < len(markPrefix)+20 && ('a' <= q[n] && q[n] <= 'z' || q[n] == ' ' || q[n] == '-') {
		if strings.HasPrefix(q[n:], markSuffix) {
			if n == len(markPrefix) {
				return ""
			}
			return q[:n+len(markSuffix)]
		}
		n++
	}
	return ""
}

// PrepareSQL returns the statement that prepares q, one of this package's
// statements, as name; it starts with q's marker.
func PrepareSQL(name, q string) string { return Marker(q) + "PREPARE " + name + " AS " + q }

// DeallocateSQL returns the statement that deallocates the prepared
// statements names.
func DeallocateSQL(names []string) string {
	var b strings.Builder
	b.WriteString(markSession)
	for _, name := range names {
		b.WriteString("DEALLOCATE " + name + ";")
	}
	return b.String()
}

// Unmarked returns q without its marker.
func Unmarked(q string) string { return strings.TrimPrefix(q, Marker(q)) }

// Key is an advisory lock key as a statement takes it: the bigint form
// (V), or the pair form (Class, ID) when Pair is set.
type Key struct {
	Pair      bool
	V         int64
	Class, ID int32
}

// Kind is what a lock call asks for; each combination of its bits is
// one of PostgreSQL's eight advisory lock functions.
type Kind uint8

const (
	Try    Kind = 1 << iota // do not wait: return whether the lock was taken
	Shared                  // shared mode; otherwise exclusive
	Xact                    // transaction-level; otherwise session-level

	KindCount = 8
)

func (k Kind) IsTry() bool    { return k&Try != 0 }
func (k Kind) IsShared() bool { return k&Shared != 0 }

// SharedKind returns Shared when shared is true.
func SharedKind(shared bool) Kind {
	if shared {
		return Shared
	}
	return 0
}

// lockFuncs names the function of every Kind.
var lockFuncs = func() (t [KindCount]string) {
	for k := range Kind(KindCount) {
		var b strings.Builder
		b.WriteString("pg_")
		if k.IsTry() {
			b.WriteString("try_")
		}
		b.WriteString("advisory_")
		if k&Xact != 0 {
			b.WriteString("xact_")
		}
		b.WriteString("lock")
		if k.IsShared() {
			b.WriteString("_shared")
		}
		t[k] = b.String()
	}
	return t
}()

func (k Kind) Fn() string { return lockFuncs[k] }

func UnlockFn(shared bool) string {
	if shared {
		return "pg_advisory_unlock_shared"
	}
	return "pg_advisory_unlock"
}

// Mode selects how keys reach the server.
type Mode uint8

const (
	Bind   Mode = iota // $1 or $1, $2
	Inline             // literals in the SQL text
)

// KeyArgs returns the argument list of k for a function call, and the bind
// values, starting at parameter number first.
func (m Mode) KeyArgs(k Key, first int) (string, []any) {
	if k.Pair {
		c, i := k.Class, k.ID
		if m == Inline {
			return strconv.FormatInt(int64(c), 10) + ", " + strconv.FormatInt(int64(i), 10), nil
		}
		return "$" + strconv.Itoa(first) + ", $" + strconv.Itoa(first+1), []any{int64(c), int64(i)}
	}
	v := k.V
	if m == Inline {
		// A negative literal needs the cast to stay a bigint argument.
		return "(" + strconv.FormatInt(v, 10) + ")::bigint", nil
	}
	return "$" + strconv.Itoa(first), []any{v}
}

// bound caches the bind-mode transaction-level Statements, which do not
// depend on the key's value: built once, they cost no allocation per lock.
var bound = func() (c struct {
	xact    [2][2]string // waits, by [exclusive, shared], then [bigint, pair]
	xactTry [2][2]string // first statements, the same way
}) {
	for sh, shared := range []bool{false, true} {
		for f, k := range []Key{{}, {Pair: true}} {
			c.xact[sh][f], _ = Bind.BuildXactLockSQL(SharedKind(shared), k)
			c.xactTry[sh][f], _ = Bind.BuildXactTrySQL(SharedKind(shared), k)
		}
	}
	return c
}()

// formIndex is 0 for the bigint form of k and 1 for the pair form.
func formIndex(k Key) int {
	if k.Pair {
		return 1
	}
	return 0
}

// sharedIndex is 0 for exclusive and 1 for shared.
func sharedIndex(shared bool) int { return int(SharedKind(shared) >> 1) }

// bindArgs appends the bound values of k, then extra, to dst (a slice
// made to measure when dst is nil).
func bindArgs(dst []any, k Key, extra ...any) []any {
	if dst == nil {
		dst = make([]any, 0, 2+len(extra))
	}
	if k.Pair {
		return append(append(dst, int64(k.Class), int64(k.ID)), extra...)
	}
	return append(append(dst, k.V), extra...)
}
