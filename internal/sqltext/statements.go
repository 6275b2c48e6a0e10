package sqltext

import (
	"fmt"
	"strconv"
	"strings"
)

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
