// Package sqltext holds every SQL text that sqllock sends: the Statements
// are written once, here, and read by the sqllock package, by poolguard,
// and by sqllockmock, whose expectations are built from the same
// functions, so that the two cannot drift apart.
package sqltext

import (
	"database/sql/driver"
	"encoding/hex"
	"fmt"
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

// Statements are a Locker's session-level statements. A session leaves as
// it came: the settings a lock session needs (Settings.Tune) are applied
// by the statement that is granted the lock, only once it is (a refused
// try changes nothing), and undone (Settings.Untune) by the statement that
// releases it; so a connection goes back to the pool with the settings it
// came with, at no extra round trip. A name (Settings.Waiting) is also set
// local to each wait statement, so that a waiting session shows it, and
// no longer.
//
// The owner mark. Advisory locks are re-entrant within a server session,
// so two clients that a transaction-mode pooler (PgBouncer with
// pool_mode=transaction) puts on one server session would both be granted
// one key. Every lock session carries a mark of its own (the setting
// sqllock.owner, applied with its settings and reset with them), given to
// each statement that takes a lock as its last parameter, and such a
// statement takes nothing on a server session that carries another mark:
// one not yet set up (Statements of settings) takes a session whose mark
// is empty or its own; one set up already (Plain), a session whose mark
// is its own. Elsewhere the statement answers NULL where it would answer
// whether it took the lock (see each statement).
type Statements struct {
	mode    Mode
	tune    string // an SQL expression that applies the settings (and the mark, o.m)
	untune  string // an SQL expression that sets them back (RESET)
	waiting string // one that applies, for a wait's length, what a waiting session shows ("": none)
	gate    string // the condition on the session's mark, o.m

	// Bind mode: built once per Locker, no allocation per lock.
	try    [2][2]string // [exclusive, shared][bigint, pair]
	wait   [2][2]string
	unlock [2][2]string
}

// NewStatements returns the Statements of sessions not yet set up, whose
// settings are applied by tune and set back by untune.
func NewStatements(mode Mode, tune, untune string) *Statements {
	return newStatements(mode, tune, untune, "", freshGate)
}

// ForSettings returns the Statements of lock sessions that need st, not
// yet set up: its Tune and Untune, and its Waiting on the wait statement.
func ForSettings(mode Mode, st Settings) *Statements {
	return newStatements(mode, st.Tune(), st.Untune(), st.Waiting(), freshGate)
}

// Described returns Statements whose settings and condition on the owner
// mark are all the text any (sqllockmock's patterns match any text there):
// they describe those of any Locker, set up or not.
func Described(any string) *Statements {
	return newStatements(Bind, any, any, "", any)
}

// Plain returns the Statements of lock sessions set up already: they apply
// and reset nothing, and run only on a session that carries their mark.
func Plain(mode Mode) *Statements {
	return newStatements(mode, "''", "''", "", ownGate)
}

// The owner mark's setting, and the conditions on it (see Statements).
const (
	markSetting = "sqllock.owner"
	// sessionMark is the session's mark, NULL when it has none.
	sessionMark = "current_setting('" + markSetting + "', true)"
	freshGate   = "coalesce(current_setting('" + markSetting + "', true), '') IN ('', o.m)"
	ownGate     = "current_setting('" + markSetting + "', true) = o.m"
)

// ValidMark reports whether mark can be a session's owner mark: 1 to 40
// bytes of digits, lower-case letters, dots and dashes (rendered into the
// SQL text for Inline mode).
func ValidMark(mark string) bool {
	if mark == "" || len(mark) > 40 {
		return false
	}
	for i := 0; i < len(mark); i++ {
		c := mark[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

// markFrom returns the FROM item that names the session's mark o.m: bound
// as parameter n, or rendered into the text (Inline).
func (m Mode) markFrom(n int, mark string) (string, []any) {
	e, args := m.markExpr(n, mark)
	return "(SELECT " + e + " AS m OFFSET 0) AS o", args
}

// plain reports whether s are Plain's: statements of a session set up
// already, which apply and reset nothing.
func (s *Statements) plain() bool { return s.gate == ownGate && s.tune == "''" && s.untune == "''" }

// markExpr returns the session's mark as a text expression: bound as
// parameter n, or rendered into the text (Inline).
func (m Mode) markExpr(n int, mark string) (string, []any) {
	if m == Inline {
		if !ValidMark(mark) {
			panic("sqltext: invalid owner mark " + strconv.Quote(mark))
		}
		return "'" + mark + "'::text", nil
	}
	return "$" + strconv.Itoa(n) + "::text", []any{mark}
}

func newStatements(mode Mode, tune, untune, waiting, gate string) *Statements {
	s := &Statements{mode: mode, tune: tune, untune: untune, waiting: waiting, gate: gate}
	if mode == Bind {
		for sh, shared := range []bool{false, true} {
			for f, k := range []Key{{}, {Pair: true}} {
				s.try[sh][f], _ = s.BuildTrySQL(Try|SharedKind(shared), k, "")
				s.wait[sh][f], _ = s.BuildWaitSQL(SharedKind(shared), k, "", "")
				s.unlock[sh][f], _ = s.BuildUnlockSQL(shared, k, 0)
			}
		}
	}
	return s
}

// TrySQL returns the statement that tries a session-level lock (kind has
// Try) on the session marked mark. Its single row is (acquired bool, pid
// int, in_recovery bool), acquired NULL (and nothing tried) on a session
// of another mark; it applies the settings only when acquired (a shared
// session's first try is this statement too, so a lock that opens one
// sends what a lock on a session of its own does). Plain's answers the
// first column only: on a session set up already, the mark stands for the
// pid, and the server's recovery state was read as it was set up.
func (s *Statements) TrySQL(kind Kind, k Key, mark string) (string, []any) {
	return s.TrySQLTo(nil, kind, k, mark)
}

// TrySQLTo is TrySQL with its arguments appended to args, and the mark
// (a string) given as an interface value: a caller that keeps both, made
// once, sends a Bind-mode try with no allocation of its own.
func (s *Statements) TrySQLTo(args []any, kind Kind, k Key, mark any) (string, []any) {
	if s.mode == Bind {
		return s.try[sharedIndex(kind.IsShared())][formIndex(k)], bindArgs(args, k, mark)
	}
	q, a := s.BuildTrySQL(kind, k, mark.(string))
	return q, append(args, a...)
}

func (s *Statements) BuildTrySQL(kind Kind, k Key, mark string) (string, []any) {
	a, args := s.mode.KeyArgs(k, 1)
	if s.plain() {
		// A session set up already: the mark compared in place, no
		// settings, one expression (a subquery costs the server's parser
		// and planner more than the lock itself, on every simple-protocol
		// statement).
		// Its one column: the mark names the backend (the session's own
		// mark is set on that backend only), and a backend that is not a
		// standby as it is set up never becomes one.
		m, margs := s.mode.markExpr(len(args)+1, mark)
		return markTry + "SELECT CASE WHEN " + sessionMark + " = " + m + " THEN " + kind.Fn() + "(" + a + ") END", append(args, margs...)
	}
	from, margs := s.mode.markFrom(len(args)+1, mark)
	// CASE evaluates the settings only when the try succeeded (concat
	// never returns NULL).
	return markTry + "SELECT CASE WHEN " + s.gate + " THEN CASE WHEN " + kind.Fn() + "(" + a + ") THEN " + s.tune + " IS NOT NULL ELSE false END END, pg_backend_pid(), pg_is_in_recovery() FROM " + from, append(args, margs...)
}

// WaitSQL returns the statement with which a Locker waits for a
// session-level lock (kind is exclusive or shared, not try). Its single row
// is that of trySQL, acquired true. The wait lasts at most slice (a
// lock_timeout local to the statement, error 55P03; "0": no limit, which
// also overrides a lock_timeout of the role, the database or the session).
// With slice half the server's deadlock_timeout, the caller waits again
// until it is granted: the statement's snapshot never lives long enough
// for a CREATE INDEX CONCURRENTLY (or REINDEX CONCURRENTLY, DETACH
// PARTITION CONCURRENTLY, ...) of the holder, which waits for old
// snapshots, to be reported a deadlock. A session that holds nothing but
// its wait is in no genuine deadlock, so nothing is lost. On a session of
// another mark than mark it waits for nothing and answers no row.
func (s *Statements) WaitSQL(kind Kind, k Key, slice, mark string) (string, []any) {
	if s.mode == Bind {
		return s.wait[sharedIndex(kind.IsShared())][formIndex(k)], bindArgs(nil, k, slice, mark)
	}
	return s.BuildWaitSQL(kind, k, slice, mark)
}

func (s *Statements) BuildWaitSQL(kind Kind, k Key, slice, mark string) (string, []any) {
	a, args := s.mode.KeyArgs(k, 1)
	timeout := "'" + slice + "'"
	if s.mode == Bind {
		timeout = "$" + strconv.Itoa(len(args)+1)
		args = append(args, slice)
	}
	from, margs := s.mode.markFrom(len(args)+1, mark)
	set := "set_config('lock_timeout', " + timeout + ", true)"
	if s.waiting != "" {
		set = "concat(" + set + ", " + s.waiting + ")"
	}
	return markWait + "SELECT " + s.tune + " IS NOT NULL, pg_backend_pid(), pg_is_in_recovery()" +
		" FROM " + from + ", LATERAL (SELECT CASE WHEN " + s.gate + " THEN " + set + " END OFFSET 0) AS s(v), " +
		"LATERAL (SELECT " + kind.Fn() + "(" + a + ") WHERE s.v IS NOT NULL) AS l", append(args, margs...)
}

// GrantedSQL returns the statement that asks, after a wait statement
// failed with 55P03, whether the session holds the lock anyway: a
// lock_timeout that fires as the lock is granted fails the statement, yet
// PostgreSQL keeps the grant (the error's cleanup keeps a lock granted
// before it). Its single row, only when the session that runs it holds
// the lock whose tag is (classid, objid, objsubid) in kind's mode, is that
// of WaitSQL, the settings (and mark) applied: they were undone with the
// failed statement.
func (s *Statements) GrantedSQL(kind Kind, classid, objid int64, objsubid int, mark string) (string, []any) {
	mode := "ExclusiveLock"
	if kind.IsShared() {
		mode = "ShareLock"
	}
	from, margs := s.mode.markFrom(4, mark)
	q, args := s.mode.TagArgs(markWait+"SELECT "+s.tune+" IS NOT NULL, pg_backend_pid(), pg_is_in_recovery() FROM "+from+", pg_catalog.pg_locks l"+heldWhere+" AND l.mode = '"+mode+"'", classid, objid, objsubid)
	return q, append(args, margs...)
}

// UnlockSQL returns the statement that releases a session-level lock, and
// sets the session's settings back, but only on the backend that was
// granted it: its single row is (released bool, the settings' text) on that
// backend, and it returns no row (and changes nothing) on any other. (SQL
// evaluates WHERE before the select list.)
func (s *Statements) UnlockSQL(shared bool, k Key, pid int64) (string, []any) {
	return s.UnlockSQLTo(nil, shared, k, pid)
}

// UnlockSQLTo is UnlockSQL as TrySQLTo is TrySQL, the pid (an int64)
// given as an interface value.
func (s *Statements) UnlockSQLTo(args []any, shared bool, k Key, pid any) (string, []any) {
	if s.mode == Bind {
		return s.unlock[sharedIndex(shared)][formIndex(k)], bindArgs(args, k, pid)
	}
	q, a := s.BuildUnlockSQL(shared, k, pid.(int64))
	return q, append(args, a...)
}

func (s *Statements) BuildUnlockSQL(shared bool, k Key, pid int64) (string, []any) {
	a, args := s.mode.KeyArgs(k, 1)
	q := markUnlock + "SELECT CASE WHEN " + UnlockFn(shared) + "(" + a + ") THEN " + s.untune + " IS NOT NULL ELSE false END WHERE pg_backend_pid() = "
	if s.plain() {
		q = markUnlock + "SELECT " + UnlockFn(shared) + "(" + a + ") WHERE pg_backend_pid() = " // nothing to reset
	}
	if s.mode == Inline {
		return q + strconv.FormatInt(pid, 10), nil
	}
	return q + "$" + strconv.Itoa(len(args)+1) + "::int4", append(args, pid)
}

// SemaphoreTrySQL returns the statement that takes the first free slot of
// the n slots of class, its mark as parameter $1 (render it with
// Mode.Arrays): its single row is (slot, or -1 when none is free, or -2
// on a session of another mark; pid, in_recovery, the settings' text).
// CASE takes the first slot whose try succeeds and tries no further: one
// round trip, and never more than one slot.
func (s *Statements) SemaphoreTrySQL(class int32, n int) string {
	var b strings.Builder
	b.WriteString(markTry + "SELECT l.slot, pg_backend_pid(), pg_is_in_recovery(), CASE WHEN l.slot >= 0 THEN " + s.tune + " END" +
		" FROM (SELECT $1::text AS m OFFSET 0) AS o, LATERAL (SELECT CASE WHEN NOT " + s.gate + " THEN -2")
	c := strconv.Itoa(int(class))
	for i := range n {
		fmt.Fprintf(&b, " WHEN pg_try_advisory_lock(%s, %d) THEN %d", c, i, i)
	}
	b.WriteString(" ELSE -1 END AS slot OFFSET 0) AS l")
	return b.String()
}

// SessionSQL returns the statement that starts a Session (or sets up a
// shared session for a batch), marked mark: its single row is (pid,
// in_recovery, the settings' text); it applies the settings. On a session
// of another mark it applies nothing, and answers pid 0.
func (s *Statements) SessionSQL(mark string) (string, []any) {
	from, args := s.mode.markFrom(1, mark)
	return markSession + "SELECT coalesce(CASE WHEN " + s.gate + " THEN pg_backend_pid() END, 0), pg_is_in_recovery(), CASE WHEN " + s.gate + " THEN " + s.tune + " END FROM " + from, args
}

// SetBackSQL returns the statement that sets a Session's settings back as
// it closes, on backend pid only: its single row is (the settings' text),
// no row on another backend.
func (s *Statements) SetBackSQL(pid int64) (string, []any) {
	if s.mode == Inline {
		return markSession + "SELECT " + s.untune + " WHERE pg_backend_pid() = " + strconv.FormatInt(pid, 10), nil
	}
	return markSession + "SELECT " + s.untune + " WHERE pg_backend_pid() = $1::int4", []any{pid}
}

// WaitSliceSQL returns half the server's deadlock_timeout in
// milliseconds (at least 1): the lock_timeout of a wait statement (asked
// once per Locker, not in every wait).
const WaitSliceSQL = markWait + "SELECT greatest(1, (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 500)::int8)"

// XactTrySQL returns the statement with which every transaction-level
// lock call starts, whatever its context and whether or not it may wait:
// it tries the lock without waiting (one round trip when the key is free),
// and reports the backend and whether the server is a standby. On a
// standby it takes nothing: pg_is_in_recovery() is read once, in a
// subquery kept apart (OFFSET 0), and the try function is called only
// when it is false (a standby's advisory locks do not conflict with the
// primary's). Its single row is (acquired bool, pid int, in_recovery
// bool). Only a call that finds the key held, and may wait, sends a wait
// statement after it (XactLockSQL, XactDeadlineLockSQL).
func (m Mode) XactTrySQL(kind Kind, k Key) (string, []any) {
	if m == Bind {
		return bound.xactTry[sharedIndex(kind.IsShared())][formIndex(k)], bindArgs(nil, k)
	}
	return m.BuildXactTrySQL(kind, k)
}

func (m Mode) BuildXactTrySQL(kind Kind, k Key) (string, []any) {
	a, args := m.KeyArgs(k, 1)
	fn := (kind | Xact | Try).Fn()
	return markTry + "SELECT CASE WHEN s.r THEN false ELSE " + fn + "(" + a + ") END, pg_backend_pid(), s.r" +
		" FROM (SELECT pg_is_in_recovery() AS r OFFSET 0) AS s", args
}

// XactLockSQL returns the statement with which a transaction waits for a
// transaction-level lock (kind's Try is ignored) for as long as it takes.
// Its single row is (acquired bool).
func (m Mode) XactLockSQL(kind Kind, k Key) (string, []any) {
	if m == Bind {
		return bound.xact[sharedIndex(kind.IsShared())][formIndex(k)], bindArgs(nil, k)
	}
	return m.BuildXactLockSQL(kind, k)
}

func (m Mode) BuildXactLockSQL(kind Kind, k Key) (string, []any) {
	a, args := m.KeyArgs(k, 1)
	return markWait + "SELECT true FROM " + (kind&^Try | Xact).Fn() + "(" + a + ")", args
}

// XactDeadlineLockSQL returns the statement with which a transaction
// waits for a transaction-level lock (kind's Try is ignored) for at most
// timeout (a duration the server reads, such as "250ms"): the wait's own
// lock_timeout, 55P03 when it fires, so that the server keeps the
// caller's deadline even when the driver's cancel never reaches it. A
// lock_timeout of the transaction's own that is shorter still applies,
// and so does one of "0" (none) meaning none: the shorter wins. The
// transaction's setting is set back as the lock is granted (a 55P03
// aborts the transaction anyway). Its single row is (acquired bool).
func (m Mode) XactDeadlineLockSQL(kind Kind, k Key, timeout string) (string, []any) {
	kind = kind&^Try | Xact
	a, args := m.KeyArgs(k, 1)
	t := "'" + timeout + "'"
	if m == Bind {
		t = "$" + strconv.Itoa(len(args)+1)
		args = append(args, timeout)
	}
	return markWait + "SELECT set_config('lock_timeout', o.old, true) IS NOT NULL" +
		" FROM (SELECT current_setting('lock_timeout') AS old OFFSET 0) AS o," +
		" LATERAL (SELECT set_config('lock_timeout', CASE WHEN o.old::interval > '0' AND o.old::interval < " + t + "::text::interval THEN o.old ELSE " + t + "::text END, true) OFFSET 0) AS s(v)," +
		" LATERAL (SELECT " + kind.Fn() + "(" + a + ") WHERE s.v IS NOT NULL) AS l", args
}

// RecoverySQL asks whether the server is a standby: InTx asks it when a
// BEGIN is refused (lib/pq begins read-write transactions, which a
// standby refuses).
const RecoverySQL = markCheck + "SELECT pg_is_in_recovery()"

// DetectMode picks Inline for lib/pq, whose parameterized queries cost
// an extra round trip (an unnamed prepare, then the execution), and Bind
// for every other driver: pgx caches one prepared statement per SQL text, so
// a text per key would churn its cache.
func DetectMode(d driver.Driver) Mode {
	if strings.HasPrefix(strings.TrimPrefix(fmt.Sprintf("%T", d), "*"), "pq.") {
		return Inline
	}
	return Bind
}

// KeepAliveSQL returns, for lists of expected locks, the 1-based positions of
// those that are not granted to their backend any more, each with why:
//
//	1  the server does not show the lock granted to that pid, whose
//	   session lives on
//	2  another server answers (another start than the one granted it:
//	   restarted, or failed over to)
//	3  that pid is another backend now (another start: the pid was reused)
//	4  no backend has that pid: its session ended
//
// A lock's server and backend starts are those VersionSQL read on its
// connection (0: unknown, not compared). The lists are passed as array
// literals in text, which every driver can bind.
var KeepAliveSQL = markKeepAlive + `WITH s AS (SELECT ` + serverStart + ` AS server),
 b AS (SELECT a.pid, ` + micros("a.backend_start") + ` AS backend FROM pg_catalog.pg_stat_get_activity(NULL) AS a)
SELECT h.i, CASE WHEN h.server <> 0 AND h.server <> s.server THEN 2
  WHEN b.pid IS NULL THEN 4
  WHEN h.backend <> 0 AND h.backend <> b.backend THEN 3 ELSE 1 END
 FROM unnest($1::text::int4[], $2::text::int8[], $3::text::int8[], $4::text::int4[], $5::text::bool[], $6::text::int8[], $7::text::int8[])
 WITH ORDINALITY AS h(pid, classid, objid, objsubid, shared, server, backend, i)
 CROSS JOIN s LEFT JOIN b ON b.pid = h.pid
 WHERE (h.server <> 0 AND h.server <> s.server)
  OR (h.backend <> 0 AND h.backend <> coalesce(b.backend, 0))
  OR NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted
  AND l.pid = h.pid AND l.classid::int8 = h.classid AND l.objid::int8 = h.objid AND l.objsubid = h.objsubid
  AND l.mode = CASE WHEN h.shared THEN 'ShareLock' ELSE 'ExclusiveLock' END)`

// ClearSnapshotSQL drops the statistics a transaction has read so far:
// pg_stat_activity is read once per transaction, and a pinned session's
// transaction lives long (see BeginPinnedSQL).
const ClearSnapshotSQL = markKeepAlive + "SELECT pg_stat_clear_snapshot()"

// WaitedOnSQL lists, of the backends whose pids are in $1 (an array
// literal in text), those whose transaction another backend waits for
// (CREATE INDEX CONCURRENTLY and its kin wait so for every transaction
// that held an old snapshot as they began their last phase): a row per
// pid. A pinned session's transaction (see BeginPinnedSQL) can be one,
// through any statement it ran at that moment, and lives as long as the
// locks it holds.
const WaitedOnSQL = markKeepAlive + `SELECT DISTINCT m.pid::int8 FROM pg_catalog.pg_locks m
 JOIN pg_catalog.pg_locks w ON w.locktype = 'virtualxid' AND w.virtualxid = m.virtualxid AND NOT w.granted
 WHERE m.locktype = 'virtualxid' AND m.granted AND m.pid = ANY ($1::text::int4[])`

// WaitedOnMeSQL answers whether another backend waits for the end of
// this backend's transaction (see WaitedOnSQL): a pinned session's wait
// asks it after each slice that ended ungranted, since a CREATE INDEX
// CONCURRENTLY that began its last phase as a slice ran waits for the
// whole transaction, which a waiter keeps open until it is granted and
// has released.
const WaitedOnMeSQL = markSession + `SELECT EXISTS (SELECT FROM pg_catalog.pg_locks m
 JOIN pg_catalog.pg_locks w ON w.locktype = 'virtualxid' AND w.virtualxid = m.virtualxid AND NOT w.granted
 WHERE m.locktype = 'virtualxid' AND m.granted AND m.pid = pg_backend_pid())`

// BatchMax is the most keys a session's queue sends in one batch
// statement (BatchSQL): a bound on its text, not on its cost,
// which its answer keeps to one short row whatever the number of keys.
const BatchMax = 1000

// Batch is what a batch statement does with its keys.
type Batch uint8

const (
	BatchTry    Batch = iota // pg_try_advisory_lock on every key
	BatchUnlock              // pg_advisory_unlock on every key
	BatchMixed               // its first keys released, the others tried
	BatchKinds  = 3
)

// BatchSQL returns batch statement b, which calls its function on every
// key in keys, in their order, on backend onlyPID only, with its
// arguments; for BatchMixed, the first unlocks keys are released
// (pg_advisory_unlock), the others tried (pg_try_advisory_lock). Its
// single row is the positions (from 1) of the keys whose call did not
// answer true (not taken, not released), as a text array literal ('{}'
// when every call did); on any other backend it calls nothing and answers
// no row. One row costs the server and the client less than a row per
// key (docs/benchmarks.md). The keys are passed as array literals in
// text, which every driver can bind (see BatchText and BatchArgs), or, in
// Inline mode, rendered into the text.
func (m Mode) BatchSQL(b Batch, onlyPID string, keys []Key, unlocks int) (string, []any) {
	args, _, pairs := BatchArgs(nil, nil, keys, unlocks, b == BatchMixed)
	q := BatchText(b, pairs, onlyPID)
	if m != Inline {
		return q, args
	}
	strs := make([]string, len(args))
	for i, a := range args {
		strs[i] = a.(string)
	}
	return m.Arrays(q, strs...)
}

// BatchText returns the text of batch statement b (see BatchSQL) on
// backend onlyPID, its keys bound: $1 the keys, bigint keys as they are
// and pair keys packed (class in the high 32 bits, id in the low); then,
// for BatchMixed, how many are released; then, when pairs, which keys are
// pairs. A session sends few distinct texts: its pid is in them, and its
// keys are not.
func BatchText(b Batch, pairs bool, onlyPID string) string {
	params, cols := "$1::text::int8[]", "u(v, i)"
	call := func(fn string) string { return fn + "(u.v)" }
	n := 2
	if b == BatchMixed {
		n++
	}
	if pairs {
		params += ", $" + strconv.Itoa(n) + "::text::bool[]"
		cols = "u(v, p, i)"
		call = func(fn string) string {
			return "CASE WHEN u.p THEN " + fn + "((u.v >> 32)::int4, ((u.v << 32) >> 32)::int4) ELSE " + fn + "(u.v) END"
		}
	}
	var got string
	switch b {
	case BatchTry:
		got = call("pg_try_advisory_lock")
	case BatchUnlock:
		got = call("pg_advisory_unlock")
	default:
		got = "CASE WHEN u.i <= $2::text::int8 THEN " + call("pg_advisory_unlock") + " ELSE " + call("pg_try_advisory_lock") + " END"
	}
	// The positions come from a subquery (ARRAY), not an aggregate: a
	// backend that had run nothing but SELECT 1 failed its first statement
	// with an aggregate on a full lock table, before calling anything
	// (measured on PostgreSQL 15), and a batch's unlocks must still run
	// there, its tries refused. The condition on the backend is a one-time
	// filter, checked before the subquery runs.
	return batchMarks[b] + "SELECT ARRAY(SELECT u.i FROM unnest(" + params + ") WITH ORDINALITY AS " + cols +
		" WHERE " + got + " IS NOT TRUE)::text WHERE pg_backend_pid() = " + onlyPID
}

// batchMarks are the markers of the batch statements, by Batch.
var batchMarks = [BatchKinds]string{BatchTry: markTry, BatchUnlock: markUnlock, BatchMixed: markBatch}

// BatchArgs appends to args the arguments of a batch statement of keys
// (see BatchText): the keys' array literal, built in buf (returned, for
// use again once the arguments are sent), how many are released when
// mixed, and, when keys has pair keys (pairs), which are. The array
// literals are made without an allocation per key.
func BatchArgs(args []any, buf []byte, keys []Key, unlocks int, mixed bool) (_ []any, _ []byte, pairs bool) {
	buf = append(buf[:0], '{')
	for i, k := range keys {
		if i > 0 {
			buf = append(buf, ',')
		}
		if k.Pair {
			pairs = true
			buf = strconv.AppendInt(buf, int64(k.Class)<<32|int64(uint32(k.ID)), 10)
		} else {
			buf = strconv.AppendInt(buf, k.V, 10)
		}
	}
	buf = append(buf, '}')
	args = append(args, string(buf))
	if mixed {
		args = append(args, strconv.Itoa(unlocks))
	}
	if pairs {
		buf = append(buf[:0], '{')
		for i, k := range keys {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = append(buf, "ft"[b2i(k.Pair)])
		}
		buf = append(buf, '}')
		args = append(args, string(buf))
	}
	return args, buf, pairs
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Arrays returns q with its array parameters ($1, $2, ...: text literals
// of arrays of numbers and booleans that this package formats) bound, or,
// in Inline mode, rendered into the text: lib/pq spends a round trip
// preparing any statement with parameters.
func (m Mode) Arrays(q string, lits ...string) (string, []any) {
	if m != Inline {
		args := make([]any, len(lits))
		for i, l := range lits {
			args[i] = l
		}
		return q, args
	}
	for i := len(lits); i >= 1; i-- { // $10 before $1
		q = strings.ReplaceAll(q, "$"+strconv.Itoa(i)+"::text", "'"+lits[i-1]+"'::text")
	}
	return q, nil
}

// InspectSQL reads the advisory locks of the current database with their
// sessions. Keys are decoded in Go from classid, objid and objsubid; the
// wait start is read through to_jsonb so that servers older than 14, which
// lack pg_locks.waitstart, answer too.
const InspectSQL = markInspect + `SELECT l.classid::int8, l.objid::int8, l.objsubid::int4, l.mode, l.granted,
 coalesce(l.pid, 0), coalesce(a.application_name, ''), coalesce(a.state, ''), coalesce(a.query, ''),
 coalesce(to_jsonb(l) ->> 'waitstart', ''), coalesce(host(a.client_addr), ''), coalesce(to_jsonb(a) ->> 'state_change', ''),
 CASE WHEN l.granted OR l.pid IS NULL THEN '{}' ELSE pg_blocking_pids(l.pid)::text END
FROM pg_catalog.pg_locks l
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
 AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())`

// ClockSQL reads the server's clock.
const ClockSQL = markInspect + "SELECT clock_timestamp()"

// IdleStates are the states (pg_stat_activity.state) of a session that
// runs nothing: the client has all the server's answers and sends nothing.
var IdleStates = []string{"idle", "idle in transaction", "idle in transaction (aborted)"}

// BreakSQL terminates backend $1 (pg_terminate_backend), a holder of the
// advisory lock whose tag is ($2, $3, $4), only if it is as its client
// read it: in the state it entered at $5 (pg_stat_activity.state_change,
// so it has run no statement since, and holds what it held), idle or idle
// in a transaction, for at least $6 (an interval, as text) by the
// server's clock, and named $7 (application_name). Its single row is
// pg_terminate_backend's answer; there is no row, and nothing is done,
// when the backend is not as read.
const BreakSQL = markBreak + `SELECT pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a
 WHERE a.pid = $1::int4 AND a.state_change = $5::timestamptz
  AND a.state IN ('idle', 'idle in transaction', 'idle in transaction (aborted)')
  AND a.state_change <= clock_timestamp() - $6::text::interval
  AND a.application_name = $7::text
  AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = a.pid
   AND l.classid::int8 = $2::int8 AND l.objid::int8 = $3::int8 AND l.objsubid = $4::int4)`

// Own reports whether query, a session's current or last statement as
// pg_stat_activity shows it (cut to track_activity_query_size, 1 kB by
// default), is one that the library sends on the sessions that hold its
// locks: its lock, unlock, batch, token and lease statements, and the
// core's prepared statements (named sqllock_<mark>_N). Such a session
// belongs to a live Locker, whose keep-alive watches it (or to a process
// frozen while its Locker held it, which the lease ends on PostgreSQL 14
// and later). A Session whose connection ran the caller's statements
// last, and a transaction of the caller's (InTx, LockTx), show the
// caller's statements, not the library's.
func Own(query string) bool {
	q := strings.TrimSpace(query)
	if Marker(q) != "" || q == TouchSQL || q == NoIdleTimeoutSQL {
		return true // every statement of this package starts with its marker
	}
	for _, p := range ownPrefixes {
		if strings.HasPrefix(q, p) {
			return true
		}
	}
	for _, m := range ownMarks {
		if strings.Contains(q, m) {
			return true
		}
	}
	return false
}

// ownPrefixes start the library's statements that carry no mark near
// their start: the core's prepared statements, and batches, whose key
// arrays (rendered into the text in Inline mode) can push their mark past
// the length pg_stat_activity keeps.
var ownPrefixes = []string{"PREPARE sqllock_", "EXECUTE sqllock_", "DEALLOCATE sqllock_", "SELECT ARRAY(SELECT u.i FROM unnest("}

// ownMarks are in every other statement the library sends on a lock
// session, within its first kilobyte: the owner mark's setting (tries,
// waits, settings), the condition on the backend (unlocks, resets, the
// liveness check), and heldWhere's (tokens, Held, Proclaim).
var ownMarks = []string{markSetting, "WHERE pg_backend_pid() = ", "l.pid = pg_backend_pid()"}

// ElectionPrefix starts the application_name of an election candidate's
// session; the rest is its value.
const ElectionPrefix = "sqllock-election:"

// LeaderSQL answers who holds the exclusive advisory lock whose tag is
// ($1, $2, $3) in the current database: one row (pid, application_name,
// client address, state_change) when a session does, none otherwise. It
// reads that lock's holder only: its row of pg_stat_activity is
// pg_stat_get_activity of its pid alone (the view joins other catalogs),
// and pg_blocking_pids is not called (InspectSQL calls it per waiter).
// Reading pg_locks still copies the server's whole lock table, under all
// of its partition locks: see CandidatesSQL.
const LeaderSQL = markElection + leaderBody

// leaderBody is LeaderSQL without its marker.
const leaderBody = `SELECT coalesce(l.pid, 0), coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
 coalesce(to_jsonb(a) ->> 'state_change', '')
FROM pg_catalog.pg_locks l
LEFT JOIN LATERAL pg_catalog.pg_stat_get_activity(l.pid) AS a ON true
WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock'
 AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
 AND l.classid::int8 = $1::int8 AND l.objid::int8 = $2::int8 AND l.objsubid = $3::int4`

// CandidatesSQL answers, in one row, a digest of the election candidates'
// sessions of the current database: the pid and application_name of
// each session named ElectionPrefix that does not wait for an advisory
// lock (0 when there is none). When a candidate becomes the leader or
// stops being it, the digest changes: an elected candidate takes its
// name (the try that elects it sets it) or stops waiting; a leader that
// resigns drops its name, or its session ends. So an observer reads
// LeaderSQL only when the digest changed, and now and then for what the
// digest does not show: a holder that is no candidate, and, to a role
// that may not see whether other roles' sessions wait (it sees their
// names), the election of a candidate that waited for such a holder.
// It reads pg_stat_activity, which takes no lock-manager lock, and costs
// in proportion to the server's max_connections, not to the locks held.
const CandidatesSQL = markElection + candidatesBody

// candidatesBody is CandidatesSQL without its marker.
const candidatesBody = `SELECT coalesce(hashtextextended(string_agg(s.pid || ' ' || s.application_name, ',' ORDER BY s.pid), 0), 0)
FROM pg_catalog.pg_stat_get_activity(NULL) AS s
WHERE s.datid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
 AND starts_with(s.application_name, '` + ElectionPrefix + `')
 AND (s.wait_event_type IS DISTINCT FROM 'Lock' OR s.wait_event IS DISTINCT FROM 'advisory')`

// ObserveSQL is one ask of Observe, in one statement, so that what it
// answers is one moment's: the candidates' digest (CandidatesSQL), whether
// it read the key's holder (when the digest differs from $4, or $5 asks
// for it), and then the holder as LeaderSQL answers it (pid 0 when none,
// or when not read). The holder is read only then: its subquery's
// condition on the digest is a one-time filter, so pg_locks is not read
// otherwise. Its parameters are LeaderSQL's tag, then $4::int8 and
// $5::bool: see ObserveArgs.
const ObserveSQL = markElection + `WITH c (d) AS MATERIALIZED (` + candidatesBody + `)
SELECT c.d, c.d <> $4::int8 OR $5::bool, coalesce(h.pid, 0), coalesce(h.name, ''), coalesce(h.addr, ''), coalesce(h.since, '')
FROM c LEFT JOIN LATERAL (` + leaderBody + `
 AND (c.d <> $4::int8 OR $5::bool) OFFSET 0) AS h (pid, name, addr, since) ON true`

// CancelWaitSQL takes backend $1, whose client abandoned its wait for an
// advisory lock, out of the wait, and answers where it is:
//
//	0  gone (its session ended)
//	1  not yet at the wait statement (it may still read it from its socket)
//	2  running the wait statement: cancelled now
//	3  done with the wait statement (cancelled, or granted)
//
// The backend is the caller's own abandoned connection, which no one else
// can be using: whatever it is running is that wait statement, recognised
// by the text every wait statement has (WaitSQL's lock_timeout, or
// XactLockSQL's function); the patterns are split so that this statement
// does not match itself on a connection that ran it before.
const CancelWaitSQL = markCancel + `SELECT coalesce((SELECT CASE
   WHEN strpos(a.query, 'set_config(''lock' || '_timeout''') = 0 AND strpos(a.query, 'FROM pg_advisory_xact' || '_lock') = 0 THEN 1
   WHEN a.state <> 'active' THEN 3
   ELSE 2 + 0 * pg_cancel_backend(a.pid)::int END
 FROM pg_catalog.pg_stat_activity a WHERE a.pid = $1::int4), 0)`

// VersionSQL asks which server this is (see supported), and who answers,
// once per connection: (version, pid, the server's start, the backend's
// start), the two starts in microseconds since the epoch (0 when not
// shown). A server started again, or another server reached under the
// same address (a failover), has another start; a backend whose pid was
// reused, another backend start: see KeepAliveSQL.
var VersionSQL = markCheck + `SELECT version(), pg_backend_pid(), ` + serverStart + `,
 coalesce((SELECT ` + micros("a.backend_start") + ` FROM pg_catalog.pg_stat_get_activity(pg_backend_pid()) AS a), 0)`

// TouchSQL keeps a leased session from going idle (see Settings).
const TouchSQL = markKeepAlive + "SELECT 1::int8"

// AliveSQL answers one row on backend pid, and none on another: an answer
// says the session is alive, and holds what it held.
func (m Mode) AliveSQL(pid int64) (string, []any) {
	if m == Inline {
		return markKeepAlive + "SELECT 1::int8 WHERE pg_backend_pid() = " + strconv.FormatInt(pid, 10), nil
	}
	return markKeepAlive + "SELECT 1::int8 WHERE pg_backend_pid() = $1::int4", []any{pid}
}

// NoIdleTimeoutSQL ends a session's lease: its connection is handed to the
// caller, whose statements alone keep it from going idle.
const NoIdleTimeoutSQL = markSession + "SELECT 1::int8 WHERE set_config('idle_session_timeout', '0', false) IS NOT NULL"

// PlainVersionSQL asks only version(), of a server that could not answer
// VersionSQL.
const PlainVersionSQL = markCheck + "SELECT version()"

// serverStart is the server's start, in microseconds since the epoch.
var serverStart = micros("pg_postmaster_start_time()")

// micros returns the SQL of timestamp t in microseconds since the epoch.
func micros(t string) string { return "(extract(epoch FROM " + t + ") * 1000000)::int8" }

// OwnSQL lists the advisory locks, held or awaited, of the session that
// runs it: (pid, classid, objid, objsubid, mode, granted) per lock, and
// one row (pid, then NULLs) when it has none: every answer names the
// backend that gave it.
const OwnSQL = markSession + `SELECT pg_backend_pid(), l.classid::int8, l.objid::int8, l.objsubid::int4, l.mode, l.granted
 FROM (SELECT 1) AS one LEFT JOIN pg_catalog.pg_locks l ON l.locktype = 'advisory' AND l.pid = pg_backend_pid()`

// TokenSQL returns a fencing token for the session-level lock whose tag is
// ($1, $2, $3), taken on the session that holds it, while it holds it: the
// server's transaction counter (txid_current), which only grows, so the
// tokens of successive holders of a key, each taken while it held it, grow
// too. It returns no row when the session does not hold the lock (any
// more).
//
// The counter survives a crash only if the transaction that read it was
// durably committed: a transaction that writes no WAL of its own is
// committed asynchronously (no flush, no wait for a synchronous standby),
// so after a crash restart, or a failover to a synchronous standby, the
// counter could resume below a token already handed out. The statement
// therefore writes a transactional WAL record (a logical message of no
// content, which needs no privilege and no table) and raises
// synchronous_commit to on for its own transaction when the session has it
// off or local: its commit is flushed, and waits for the synchronous
// standbys, before the token reaches the client.
const TokenSQL = markToken + `SELECT CASE WHEN pg_logical_emit_message(true, 'sqllock', '') IS NOT NULL
  AND CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN set_config('synchronous_commit', 'on', true) ELSE '' END IS NOT NULL
 THEN txid_current() END` + heldByMe

// TokenOfSQL is TokenSQL run on another session than the holder's, in a
// transaction of its own: a fencing token for the lock whose tag is ($1,
// $2, $3), held by backend $4, no row when that backend does not hold it.
// A Locker behind a transaction pooler takes its tokens so (its lock
// sessions are transactions kept open, which cannot commit one), and then
// asks the holder's session whether it still holds the lock (HeldSQL):
// the token was then issued while the lock was held.
const TokenOfSQL = markToken + `SELECT CASE WHEN pg_logical_emit_message(true, 'sqllock', '') IS NOT NULL
  AND CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN set_config('synchronous_commit', 'on', true) ELSE '' END IS NOT NULL
 THEN txid_current() END FROM pg_catalog.pg_locks l
 WHERE l.locktype = 'advisory' AND l.granted AND l.pid = $4::int4
  AND l.classid::int8 = $1::int8 AND l.objid::int8 = $2::int8 AND l.objsubid = $3::int4`

// HeldSQL answers one row when the session that runs it holds the
// session-level lock whose tag is ($1, $2, $3), and none otherwise.
const HeldSQL = markToken + `SELECT 1::int8` + heldByMe

// ProclaimSQL returns the statement that names the session that runs it
// name (its application_name, for the session's life or until named
// again), but only when that session holds the session-level lock whose
// tag is ($1, $2, $3): it answers one row then, and none (naming nothing)
// otherwise. name is rendered in hexadecimal, so that no text of it can
// reach the statement as SQL, nor look like a parameter to TagArgs. The
// select list is evaluated only for the row of the held lock.
// With local, the name is set local to the transaction that runs it (a
// pinned session's: see BeginPinnedSQL), and ends with it.
func ProclaimSQL(name string, local bool) string {
	return markElection + "SELECT length(set_config('application_name', convert_from(decode('" + hex.EncodeToString([]byte(name)) + "', 'hex'), 'UTF8'), " + strconv.FormatBool(local) + "))::int8" + heldByMe
}

// heldByMe selects the row of pg_locks of the advisory lock whose tag is
// ($1, $2, $3), granted to the session that runs the statement.
const heldByMe = ` FROM pg_catalog.pg_locks l` + heldWhere

// heldWhere is heldByMe's condition on pg_locks l.
const heldWhere = `
 WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_backend_pid()
  AND l.classid::int8 = $1::int8 AND l.objid::int8 = $2::int8 AND l.objsubid = $3::int4`

// TagArgs returns q (TokenSQL, HeldSQL, LeaderSQL), whose parameters are
// a lock tag ($1 classid, $2 objid, $3 objsubid), with the tag bound, or,
// in Inline mode, rendered into the text (lib/pq spends a round trip
// preparing any statement with parameters).
func (m Mode) TagArgs(q string, classid, objid int64, objsubid int) (string, []any) {
	if m != Inline {
		return q, []any{classid, objid, int64(objsubid)}
	}
	r := strings.NewReplacer("$1::int8", "("+strconv.FormatInt(classid, 10)+")::int8",
		"$2::int8", "("+strconv.FormatInt(objid, 10)+")::int8", "$3::int4", strconv.Itoa(objsubid)+"::int4")
	return r.Replace(q), nil
}

// TokenOfArgs returns TokenOfSQL with its parameters bound, or, in Inline
// mode, rendered into the text: the lock's tag and its holder's backend.
func (m Mode) TokenOfArgs(classid, objid int64, objsubid int, pid int64) (string, []any) {
	q, args := m.TagArgs(TokenOfSQL, classid, objid, objsubid)
	if m != Inline {
		return q, append(args, pid)
	}
	return strings.ReplaceAll(q, "$4::int4", strconv.FormatInt(pid, 10)+"::int4"), nil
}

// ObserveArgs returns ObserveSQL with its parameters bound, or, in
// Inline mode, rendered into the text: the key's tag, the digest last
// read, and whether to read the holder whatever the digest.
func (m Mode) ObserveArgs(classid, objid int64, objsubid int, digest int64, force bool) (string, []any) {
	q, args := m.TagArgs(ObserveSQL, classid, objid, objsubid)
	if m != Inline {
		return q, append(args, digest, force)
	}
	r := strings.NewReplacer("$4::int8", "("+strconv.FormatInt(digest, 10)+")::int8", "$5::bool", strconv.FormatBool(force)+"::bool")
	return r.Replace(q), nil
}

// The statements of a transaction's sliced wait (see the core's
// waitTxSliced): the server's deadlock_timeout, and the savepoint each
// slice is rolled back to when it times out.
const (
	DeadlockTimeoutSQL     = markWait + "SELECT current_setting('deadlock_timeout')"
	SavepointSQL           = markWait + "SAVEPOINT sqllock_wait"
	ReleaseSavepointSQL    = markWait + "RELEASE SAVEPOINT sqllock_wait"
	RollbackToSavepointSQL = markWait + "ROLLBACK TO SAVEPOINT sqllock_wait"
)

// BeginPinnedSQL begins the transaction of a pinned session (a Locker's
// behind a transaction pooler), and CommitPinnedSQL ends it once it holds
// nothing. Read committed: between statements the transaction holds no
// snapshot, so vacuum and CREATE INDEX CONCURRENTLY never wait for it.
const (
	BeginPinnedSQL  = markSession + "BEGIN ISOLATION LEVEL READ COMMITTED"
	CommitPinnedSQL = markSession + "COMMIT"
)

// Waits reports whether q, one of this package's statements, is one of a
// wait's (markers wait and line), which can fail with a lock_timeout, a
// deadlock or a cancel: a pinned session runs it in a savepoint. The
// savepoint's own statements are not.
func Waits(q string) bool {
	switch Marker(q) {
	case markWait, markLine:
		return q != SavepointSQL && q != ReleaseSavepointSQL && q != RollbackToSavepointSQL
	}
	return false
}
