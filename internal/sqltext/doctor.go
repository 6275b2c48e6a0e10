package sqltext

import "strings"

// The statements of the doctor command (sqllock doctor): what it reads of
// the server, and the rounds that tell a transaction pooler by who
// answers and by what a client connection prepared.

// markDoctor marks the doctor's statements.
const markDoctor = markPrefix + "doctor" + markSuffix

// DoctorVersionSQL asks version() alone: a server that only looks like
// PostgreSQL may lack the functions of DoctorServerSQL.
const DoctorVersionSQL = markDoctor + "SELECT version()"

// DoctorServerSQL asks whether the server is a standby, and the port it
// listens on (0 over a Unix socket): a port other than the one the
// client reached says something relays the connection.
const DoctorServerSQL = markDoctor + "SELECT pg_is_in_recovery(), coalesce(inet_server_port(), 0)::int8"

// DoctorSettings are the settings DoctorSettingsSQL reads.
var DoctorSettings = []string{
	"deadlock_timeout",
	"idle_in_transaction_session_timeout",
	"idle_session_timeout",
	"max_connections",
	"max_locks_per_transaction",
	"max_prepared_transactions",
}

// DoctorSettingsSQL reads DoctorSettings as the session sees them (a
// role's and a database's own values included): (name, setting, unit)
// rows; a setting the server does not have (idle_session_timeout before
// PostgreSQL 14) has no row.
var DoctorSettingsSQL = markDoctor + "SELECT name, setting, coalesce(unit, '') FROM pg_catalog.pg_settings WHERE name IN ('" +
	strings.Join(DoctorSettings, "', '") + "')"

// DoctorLocksSQL counts the server's locks now: the entries of the shared
// lock table (fast-path locks take none), the advisory locks held, and
// the advisory locks awaited, in every database.
const DoctorLocksSQL = markDoctor + `SELECT count(*) FILTER (WHERE NOT l.fastpath),
 count(*) FILTER (WHERE l.locktype = 'advisory' AND l.granted),
 count(*) FILTER (WHERE l.locktype = 'advisory' AND NOT l.granted)
FROM pg_catalog.pg_locks l`

// DoctorRoundSQL returns the statement of a pooler round: ($1, pid,
// backend start in microseconds since the epoch). nonce, a few letters
// and digits of the caller's, makes the text one no other run sent: a
// driver that caches prepared statements by their text prepares it
// afresh, on whichever server session runs it.
func DoctorRoundSQL(nonce string) string {
	return markDoctor + "SELECT $1::int8, pg_backend_pid(), coalesce((SELECT " + micros("a.backend_start") +
		" FROM pg_catalog.pg_stat_get_activity(pg_backend_pid()) AS a), 0) /* " + clean(nonce) + " */"
}

// DoctorPinSQL returns the statement with which a second client
// connection, in a transaction, pins a server session and says which:
// (pid, backend start), as DoctorRoundSQL; nonce as there.
func DoctorPinSQL(nonce string) string {
	return markDoctor + "SELECT pg_backend_pid(), coalesce((SELECT " + micros("a.backend_start") +
		" FROM pg_catalog.pg_stat_get_activity(pg_backend_pid()) AS a), 0) /* pin " + clean(nonce) + " */"
}

// clean keeps the letters and digits of s: nothing of it can end a
// comment.
func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, s)
}
