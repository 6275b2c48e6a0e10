package sqltext

import (
	"encoding/hex"
	"strconv"
	"strings"
)

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
