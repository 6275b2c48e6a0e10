package sqltext

import (
	"strconv"
	"strings"
)

// Settings are what a lock session needs of its own session: keep-alive
// probes (Idle seconds, then Count probes every Interval seconds) and
// UserTimeoutMs (tcp_user_timeout) for the orphan bound, 0 to leave them;
// application_name AppName, "" to leave it; and, on PostgreSQL 14 and
// later (Major), idle_session_timeout (IdleTimeoutMs: the lease; 0: off)
// and client_connection_check_interval.
type Settings struct {
	Idle, Interval, Count int
	UserTimeoutMs         int
	AppName               string
	ForceAppName          bool // set AppName even over one the session has
	IdleTimeoutMs         int  // idle_session_timeout of a holding session (the lease); 0: off
	Major                 int
	// Local: the session is a transaction kept open (behind a transaction
	// pooler): every setting is local to it, and ends with it, and the
	// lease is its idle_in_transaction_session_timeout (any major).
	Local bool
}

// Tune returns the SQL expression that applies s on the session that
// evaluates it, as text. Keep-alive probes end an idle session whose client
// vanished; tcp_user_timeout ends one whose client vanished before
// acknowledging the server's last answer (there, probes never start);
// client_connection_check_interval makes a waiting session notice a
// vanished client; idle_session_timeout is the lease (or off: a session
// that holds a lock is idle by design, and no reaper may take it), because
// a session
// that holds a lock is idle by design. The settings that PostgreSQL 14
// introduced are left out for older majors (a test of the version in the
// statement would cost more than all the settings).
func (s Settings) Tune() string {
	// The session's owner mark, o.m of the statement (see Statements).
	set := func(name, value string) string { return setTo(name, value, s.Local) }
	exprs := []string{"set_config('" + markSetting + "', o.m, " + strconv.FormatBool(s.Local) + ")"}
	switch {
	case s.Local:
		exprs = append(exprs, set("idle_in_transaction_session_timeout", strconv.Itoa(s.IdleTimeoutMs)))
	case s.Major >= 14:
		exprs = append(exprs, set("idle_session_timeout", strconv.Itoa(s.IdleTimeoutMs)))
	}
	if s.Idle > 0 {
		exprs = append(exprs,
			set("tcp_keepalives_idle", strconv.Itoa(s.Idle)),
			set("tcp_keepalives_interval", strconv.Itoa(s.Interval)),
			set("tcp_keepalives_count", strconv.Itoa(s.Count)),
			set("tcp_user_timeout", strconv.Itoa(s.UserTimeoutMs)))
		if s.Major >= 14 {
			exprs = append(exprs, set("client_connection_check_interval", strconv.Itoa(s.Interval)+"s"))
		}
	}
	switch {
	case s.AppName != "" && s.ForceAppName:
		exprs = append(exprs, set("application_name", s.AppName))
	case s.AppName != "":
		// Only when the session has none (set on the DSN, say): it is never
		// overwritten. (A wait statement names its session for the wait's
		// length first: see Waiting.)
		exprs = append(exprs, "CASE WHEN current_setting('application_name') IN ('', '"+s.AppName+"') THEN "+set("application_name", s.AppName)+" END")
	}
	return concat(exprs)
}

// Waiting returns the SQL expression that names a waiting session with
// AppName, as a holding one is named: set local to the wait statement, the
// name lasts as long as the wait and leaves with it (granted, the
// statement's Tune then sets it for the session). A forced AppName (an
// election's candidates) replaces the session's own; another one is set
// only on a session that has none. "" when there is no AppName.
func (s Settings) Waiting() string {
	switch {
	case s.AppName == "":
		return ""
	case s.ForceAppName:
		return "set_config('application_name', '" + s.AppName + "', true)"
	}
	return "CASE WHEN current_setting('application_name') = '' THEN set_config('application_name', '" + s.AppName + "', true) END"
}

// Untune returns the SQL expression that sets back what Tune applied:
// set_config with a NULL value resets a setting to the value the session
// started with (what RESET does).
func (s Settings) Untune() string {
	exprs := []string{setBack(markSetting)}
	switch {
	case s.Local:
		exprs = append(exprs, setBack("idle_in_transaction_session_timeout"))
	case s.Major >= 14:
		exprs = append(exprs, setBack("idle_session_timeout"))
	}
	if s.Idle > 0 {
		exprs = append(exprs, setBack("tcp_keepalives_idle"), setBack("tcp_keepalives_interval"), setBack("tcp_keepalives_count"), setBack("tcp_user_timeout"))
		if s.Major >= 14 {
			exprs = append(exprs, setBack("client_connection_check_interval"))
		}
	}
	if s.AppName != "" {
		exprs = append(exprs, setBack("application_name"))
	}
	return concat(exprs)
}

// setTo renders a set_config, local to the transaction when local is
// set, else session-level; value is this package's own text (numbers, or
// an application name checked by the caller to hold no quote or
// backslash).
func setTo(name, value string, local bool) string {
	return "set_config('" + name + "', '" + value + "', " + strconv.FormatBool(local) + ")"
}

func setBack(name string) string { return "set_config('" + name + "', NULL, false)" }

// concat joins text expressions into one that is never NULL.
func concat(exprs []string) string {
	if len(exprs) == 0 {
		return "''"
	}
	return "concat(" + strings.Join(exprs, ", ") + ")"
}
