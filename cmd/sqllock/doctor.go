package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/jackc/pgx/v5"

	"github.com/sqllock/sqllock/internal/core"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// The doctor: what a server, and what stands in front of it, mean for
// sqllock, one finding a line, in plain words, with what to do.

// What sqllock uses when a program sets nothing (options.go's
// defaultKeepAlive and defaultOrphanBound): the doctor weighs the
// server's timeouts against them.
const (
	libKeepAlive   = 5 * time.Second
	libOrphanBound = 30 * time.Second
)

// lease says how sqllock keeps its holders' sessions from timing out:
// the idle timeout it sets on them, and what keeps a live one busier.
var lease = fmt.Sprintf("the orphan bound, %v at its defaults; a holder idle for a third of it gets a statement at the keep-alive's next check, every %v", libOrphanBound, libKeepAlive)

// probeWait bounds each of the doctor's statements.
const probeWait = 10 * time.Second

// Finding statuses.
const (
	statusOK      = "ok"      // nothing to do
	statusNote    = "note"    // worth knowing
	statusWarn    = "warn"    // something to change, or to check
	statusError   = "error"   // sqllock refuses this server, or cannot work here as it is
	statusUnknown = "unknown" // the doctor could not tell
)

// finding is one line of the doctor's report.
type finding struct {
	Name    string         `json:"finding"`
	Status  string         `json:"status"`
	Message string         `json:"message"`
	Values  map[string]any `json:"values,omitempty"`
}

const doctorUsage = "usage: sqllock doctor [--json] [--dsn DSN] [--connect-timeout D]"

const doctorHelpTail = `
It reports, one line each: the server's version and flavour; a hot
standby; a transaction pooler in the way (and the option to use); whether
prepared statements survive (pgx's statement cache); the idle timeouts
that would end a holder; deadlock_timeout; the lock table's headroom.

Exit status:
  0    it could probe (whatever it found)
  64   usage: bad flag
  69   the server cannot be reached
  77   authentication failed
  78   the DSN cannot be parsed
`

func doctorCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sqllock doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON: an array of findings, each with finding, status, message and values")
	dsnFlag := fs.String("dsn", "", "PostgreSQL connection string (default: DATABASE_URL, else PG* variables)")
	connectTimeout := fs.Duration("connect-timeout", defaultConnectTimeout, "give up connecting to the server after this long")
	fs.Usage = func() {
		fmt.Fprintln(stderr, doctorUsage)
		printFlags(stderr, fs)
		fmt.Fprint(stderr, doctorHelpTail)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fail(exitUsage, "")
	}
	if fs.NArg() > 0 {
		return fail(exitUsage, "doctor: unexpected argument %q (%s)", clip(fs.Arg(0), 40), doctorUsage)
	}
	if *connectTimeout <= 0 {
		return fail(exitUsage, "doctor: --connect-timeout must be positive (got %v)", *connectTimeout)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	cfg, err := parseDSN(dsnFrom(*dsnFlag), "sqllock doctor")
	if err != nil {
		return err
	}
	db, err := openConfig(ctx, cfg, *connectTimeout)
	if err != nil {
		return err
	}
	defer db.Close()
	found, err := diagnose(ctx, db, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(found)
	}
	for _, f := range found {
		fmt.Fprintf(stdout, "%-7s %s: %s\n", f.Status, f.Name, f.Message)
	}
	return nil
}

// diagnose probes db's server (cfg is db's configuration) and returns its
// findings, in a fixed order. Its error is an exitError: the server
// stopped answering before it could tell anything.
func diagnose(ctx context.Context, db *sql.DB, cfg *pgx.ConnConfig) ([]finding, error) {
	var found []finding
	add := func(f finding) { found = append(found, f) }

	// The server, and who answers: the first statement tells whether the
	// doctor can probe at all.
	var version string
	err := queryRow(ctx, db, sqltext.DoctorVersionSQL, &version)
	if err != nil && (stmt.ConnectionBroken(err) || ctx.Err() != nil) {
		return nil, fail(exitUnavailable, "doctor: the server stopped answering: %s", redact(oneLine(err)))
	}
	add(serverFinding(version, err))
	who, werr := askServer(ctx, db)
	add(standbyFinding(who, werr))

	pooled, perr := core.DetectPooler(ctx, db)
	rounds := poolerRounds(ctx, cfg)
	pooler := poolerFinding(pooled, perr, rounds, who, werr)
	add(pooler)
	seen := pooler.Values["transaction_pooler"] == true
	add(preparedFinding(rounds, seen, cfg.DefaultQueryExecMode))

	settings, serr := readSettings(ctx, db)
	add(idleSessionFinding(settings, serr, seen))
	add(idleInTxFinding(settings, serr, seen))
	if seen {
		add(finding{Name: "pooler_timeouts", Status: statusNote,
			Message: fmt.Sprintf("a pooler's own timeouts cannot be read through it: check in its configuration that the ones that end an idle client or transaction "+
				"(PgBouncer's client_idle_timeout and idle_transaction_timeout) are 0 or longer than the orphan bound (%v at sqllock's defaults)", libOrphanBound)})
	}
	add(deadlockFinding(settings, serr))
	counts, cerr := countLocks(ctx, db)
	add(lockTableFinding(settings, serr, counts, cerr))
	return found, nil
}

// queryRow runs q (one of sqltext's Doctor statements, with no
// parameters) on db in pgx's simple protocol, so that nothing is
// prepared on a pooler's server sessions, and scans its row.
func queryRow(ctx context.Context, db *sql.DB, q string, dest ...any) error {
	ctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	return db.QueryRowContext(ctx, q, pgx.QueryExecModeSimpleProtocol).Scan(dest...)
}

// serverFinding weighs version(), read with err.
func serverFinding(version string, err error) finding {
	f := finding{Name: "server", Values: map[string]any{"version": printable(version)}}
	if err != nil {
		f.Status = statusUnknown
		f.Message = "could not read version(): " + redact(oneLine(err))
		return f
	}
	short, _, _ := strings.Cut(printable(version), " on ")
	flavour := "postgresql"
	for _, fl := range []struct{ mark, name string }{
		{"CockroachDB", "cockroachdb"}, {"-YB-", "yugabytedb"}, {"Redshift", "redshift"}, {"Materialize", "materialize"}, {"Spanner", "spanner"},
	} {
		if strings.Contains(version, fl.mark) {
			flavour = fl.name
		}
	}
	f.Values["flavour"] = flavour
	major := majorOf(version)
	f.Values["major"] = major
	supported := core.Supported(version)
	f.Values["supported"] = supported == nil
	switch {
	case supported != nil && flavour == "cockroachdb":
		f.Status = statusError
		f.Message = short + ": CockroachDB's advisory lock functions exclude no one (they are there for compatibility only): sqllock refuses it (ErrUnsupportedServer); use a lock of CockroachDB's own (a row in a table, with SELECT ... FOR UPDATE)"
	case supported != nil:
		f.Status = statusError
		f.Message = strings.TrimPrefix(supported.Error(), "sqllock: ") + ": sqllock refuses it (ErrUnsupportedServer)"
		if flavour == "yugabytedb" {
			f.Message += "; YugabyteDB's advisory locks are not PostgreSQL's either (yugabyte#25756)"
		}
	case flavour == "yugabytedb":
		f.Status = statusWarn
		f.Message = short + ": YugabyteDB, whose advisory locks are its own: in 2.25.1, pg_advisory_lock(int, int) let a second session take a key another session held (yugabyte#25756); sqllock is tested on PostgreSQL only: check that your version excludes, for both key forms, before you rely on it"
	case major < 14:
		f.Status = statusNote
		f.Message = fmt.Sprintf("%s: supported; PostgreSQL %d has no idle_session_timeout (14 and later): a holder that stops without exiting (SIGSTOP, a paused VM) keeps its locks until its connection ends", short, major)
	default:
		f.Status = statusOK
		f.Message = short + ": supported"
	}
	return f
}

// majorOf returns the major version of a version() string of
// PostgreSQL's ("PostgreSQL 16.4 ...": 16), or 0.
func majorOf(version string) int {
	rest, ok := strings.CutPrefix(version, "PostgreSQL ")
	if !ok {
		return 0
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	n, _ := strconv.Atoi(rest[:end])
	return n
}

// serverAnswer is what DoctorServerSQL answers, with the port the
// client reached.
type serverAnswer struct {
	recovery bool
	// server is the port the server listens on, as it says (0 over a
	// Unix socket); reached the port the client reached (0: not TCP).
	server, reached int64
}

// askServer asks DoctorServerSQL on a connection of db.
func askServer(ctx context.Context, db *sql.DB) (serverAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	var a serverAnswer
	c, err := db.Conn(ctx)
	if err != nil {
		return a, err
	}
	defer c.Close()
	if err := c.QueryRowContext(ctx, sqltext.DoctorServerSQL, pgx.QueryExecModeSimpleProtocol).Scan(&a.recovery, &a.server); err != nil {
		return a, err
	}
	if addr, ok := remoteAddr(c).(*net.TCPAddr); ok {
		a.reached = int64(addr.Port)
	}
	return a, nil
}

// relayed reports whether something between client and server relays
// the connection: the port the server listens on is not the one the
// client reached.
func (a serverAnswer) relayed() bool { return a.server != 0 && a.reached != 0 && a.server != a.reached }

// standbyFinding weighs pg_is_in_recovery(), asked with err.
func standbyFinding(a serverAnswer, err error) finding {
	f := finding{Name: "standby"}
	if err != nil {
		f.Status = statusUnknown
		f.Message = "could not ask pg_is_in_recovery(): " + redact(oneLine(err))
		return f
	}
	f.Values = map[string]any{"in_recovery": a.recovery}
	if a.recovery {
		f.Status = statusError
		f.Message = "a hot standby (pg_is_in_recovery() is true): a lock taken here excludes only this standby's sessions, never the primary's clients; sqllock refuses it (ErrStandby): connect to the primary (with several hosts in the DSN, target_session_attrs=read-write picks it)"
		return f
	}
	f.Status = statusOK
	f.Message = "a primary (pg_is_in_recovery() is false)"
	return f
}

// poolerFinding weighs the probe a Locker runs (pooled, or perr that kept
// it from asking), the doctor's rounds, and the ports (pp, asked with
// ppErr).
func poolerFinding(pooled, perr error, r roundsOutcome, pp serverAnswer, ppErr error) finding {
	f := finding{Name: "pooler", Values: map[string]any{"rounds": r.rounds}}
	// Each way's evidence, for the record; the message gives the rounds'
	// (in plain words), else the probe's.
	evidence := r.evidence
	f.Values["rounds_evidence"] = r.evidence
	if r.err != nil {
		f.Values["rounds_error"] = redact(oneLine(r.err))
	}
	if pooled != nil {
		pe := strings.TrimPrefix(pooled.Error(), stmt.ErrSessionChanged.Error()+": ")
		pe, _, _ = strings.Cut(pe, ": a transaction-mode pooler")
		f.Values["probe_evidence"] = pe
		if evidence == "" {
			evidence = pe
		}
	}
	if ppErr == nil {
		f.Values["server_port"], f.Values["reached_port"] = pp.server, pp.reached
	}
	if evidence != "" {
		f.Status = statusWarn
		f.Values["transaction_pooler"] = true
		f.Values["evidence"] = evidence
		f.Message = "a transaction pooler is in the way (" + evidence + "): a session-level lock stays on a server session that serves other clients, and excludes no one; " +
			"use sqllock.WithTransactionPooler() (sqllock run --transaction-pooler), or transaction locks (LockTx, InTx); without it, every lock call fails with ErrSessionChanged"
		return f
	}
	f.Values["transaction_pooler"] = false
	if r.err != nil || r.rounds < doctorRounds {
		f.Status = statusUnknown
		f.Message = fmt.Sprintf("could not tell whether a transaction pooler is in the way: %d of %d rounds ran", r.rounds, doctorRounds)
		if r.err != nil {
			f.Message += ": " + redact(oneLine(r.err))
		}
		return f
	}
	f.Status = statusOK
	f.Message = fmt.Sprintf("no transaction pooler: each client connection kept a server session of its own, in the probe a Locker runs and in %d rounds of two client connections in turns", r.rounds)
	if perr != nil {
		f.Values["probe_error"] = redact(oneLine(perr))
		f.Message = fmt.Sprintf("no transaction pooler: each client connection kept a server session of its own in %d rounds of two client connections in turns (the probe a Locker runs could not: %s)", r.rounds, redact(oneLine(perr)))
	}
	if pp.relayed() {
		f.Status = statusNote
		f.Values["relayed"] = true
		f.Message += fmt.Sprintf("; but the server listens on port %d and this connection reached port %d: something relays it (a session-mode pooler, a proxy, a port mapping), "+
			"which session locks work through as long as it keeps one server session per client connection; an idle timeout of its own (PgBouncer's client_idle_timeout) must be 0 or longer than the orphan bound (%v at sqllock's defaults)",
			pp.server, pp.reached, libOrphanBound)
	}
	return f
}

// preparedFinding says whether a statement prepared on a client
// connection survives to its next transaction; mode is the DSN's
// default_query_exec_mode.
func preparedFinding(r roundsOutcome, pooler bool, mode pgx.QueryExecMode) finding {
	f := finding{Name: "prepared_statements", Values: map[string]any{"dsn_exec_mode": modeName(mode)}}
	yours := "this DSN's default_query_exec_mode is " + modeName(mode)
	if mode == pgx.QueryExecModeCacheStatement {
		yours += " (pgx's default): its statement cache is in use"
	}
	switch {
	case r.lost != nil:
		f.Status = statusWarn
		f.Values["survive"] = false
		f.Values["error"] = redact(oneLine(r.lost))
		what := "a statement prepared on a client connection was not there in its next transaction (SQLSTATE 26000)"
		if stmt.SQLState(r.lost) == "42P05" {
			what = "a statement a client connection prepared afresh was there already, left by another client (SQLSTATE 42P05)"
		}
		f.Message = fmt.Sprintf("%s: pgx's statement cache (default_query_exec_mode=cache_statement) fails through this pooler; "+
			"set default_query_exec_mode=exec (or simple_protocol) in the DSN, or turn on the pooler's prepared statement support (PgBouncer 1.21 and later: max_prepared_statements); %s; "+
			"sqllock's own statements there (WithTransactionPooler) go in pgx's simple protocol, and are not affected",
			what, yours)
		if mode != pgx.QueryExecModeCacheStatement {
			f.Status = statusNote
		}
	case pooler && r.moved > 0:
		f.Status = statusOK
		f.Values["survive"] = true
		f.Message = fmt.Sprintf("prepared statements survive through the pooler: a statement prepared on a client connection ran on %d other server sessions (the pooler prepares it there); %s", r.moved, yours)
	case pooler:
		f.Status = statusUnknown
		f.Message = "could not tell: the statement never ran on another server session than the one it was prepared on; " + yours
	case r.err != nil || r.rounds < doctorRounds:
		f.Status = statusUnknown
		f.Message = fmt.Sprintf("could not tell: %d of %d rounds ran", r.rounds, doctorRounds)
	default:
		f.Status = statusOK
		f.Values["survive"] = true
		f.Message = "prepared statements survive: each client connection keeps its server session; " + yours
	}
	return f
}

// modeName returns the name of mode as a DSN's default_query_exec_mode
// gives it.
func modeName(mode pgx.QueryExecMode) string {
	switch mode {
	case pgx.QueryExecModeCacheStatement:
		return "cache_statement"
	case pgx.QueryExecModeCacheDescribe:
		return "cache_describe"
	case pgx.QueryExecModeDescribeExec:
		return "describe_exec"
	case pgx.QueryExecModeExec:
		return "exec"
	case pgx.QueryExecModeSimpleProtocol:
		return "simple_protocol"
	}
	return mode.String()
}

// setting is one row of DoctorSettingsSQL.
type setting struct{ value, unit string }

// readSettings reads DoctorSettingsSQL.
func readSettings(ctx context.Context, db *sql.DB) (map[string]setting, error) {
	ctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	rows, err := db.QueryContext(ctx, sqltext.DoctorSettingsSQL, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	s := map[string]setting{}
	for rows.Next() {
		var name string
		var v setting
		if err := rows.Scan(&name, &v.value, &v.unit); err != nil {
			return nil, err
		}
		s[name] = v
	}
	return s, rows.Err()
}

// duration returns s as a duration: its value in its unit (pg_settings'
// ms, s, min).
func (s setting) duration() (time.Duration, error) {
	n, err := strconv.ParseInt(s.value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number: %q", s.value)
	}
	unit := map[string]time.Duration{"ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[s.unit]
	if unit == 0 {
		return 0, fmt.Errorf("unknown unit %q", s.unit)
	}
	return time.Duration(n) * unit, nil
}

// durationSetting returns setting name of s as a duration: ok false,
// with the finding to report, when it cannot be read.
func durationSetting(name string, s map[string]setting, serr error) (time.Duration, finding, bool) {
	f := finding{Name: name, Status: statusUnknown}
	if serr != nil {
		f.Message = "could not read pg_settings: " + redact(oneLine(serr))
		return 0, f, false
	}
	v, ok := s[name]
	if !ok {
		return 0, f, false // the caller says why
	}
	d, err := v.duration()
	if err != nil {
		f.Message = "could not read " + name + ": " + err.Error()
		return 0, f, false
	}
	return d, f, true
}

// idleSessionFinding weighs idle_session_timeout (PostgreSQL 14 and
// later) against the lease sqllock puts on its lock sessions.
func idleSessionFinding(s map[string]setting, serr error, pooler bool) finding {
	const name = "idle_session_timeout"
	d, f, ok := durationSetting(name, s, serr)
	if !ok {
		if serr == nil && f.Message == "" {
			f.Status = statusNote
			f.Message = "the server has no idle_session_timeout (PostgreSQL 14 and later): no idle session is ended, and nothing ends the session of a holder that stopped without exiting"
		}
		return f
	}
	f.Values = map[string]any{"seconds": d.Seconds()}
	if d == 0 {
		f.Status = statusOK
		f.Message = "0 (off): no idle session is ended"
		return f
	}
	f.Status = statusNote
	f.Message = fmt.Sprintf("%v: the server ends a session idle for %v; sqllock sets its own on each session that holds a lock (%s), so holders are spared; "+
		"idle connections of your pool are ended, and database/sql opens new ones", d, d, lease)
	if pooler {
		f.Message += "; behind a transaction pooler, locks are held inside open transactions, where it does not apply"
	}
	return f
}

// idleInTxFinding weighs idle_in_transaction_session_timeout against
// the lease sqllock puts on the transactions that hold its locks behind a
// transaction pooler.
func idleInTxFinding(s map[string]setting, serr error, pooler bool) finding {
	const name = "idle_in_transaction_session_timeout"
	d, f, ok := durationSetting(name, s, serr)
	if !ok {
		if serr == nil && f.Message == "" {
			f.Message = "the server has no " + name
		}
		return f
	}
	f.Values = map[string]any{"seconds": d.Seconds()}
	if d == 0 {
		f.Status = statusOK
		f.Message = "0 (off): no session idle in a transaction is ended"
		return f
	}
	f.Status = statusNote
	f.Message = fmt.Sprintf("%v: the server ends a session idle in a transaction for %v, and its locks with it: a LockTx or InTx whose work pauses that long loses its lock; ", d, d)
	if pooler {
		f.Message += "behind the pooler, sqllock.WithTransactionPooler holds its locks inside open transactions, each with its own (" + lease + "), so its holders are spared"
	} else {
		f.Message += "sqllock's session-level locks are held outside transactions, and are spared"
	}
	return f
}

// deadlockFinding reports deadlock_timeout and the slice of a Locker's
// waits (half of it).
func deadlockFinding(s map[string]setting, serr error) finding {
	const name = "deadlock_timeout"
	d, f, ok := durationSetting(name, s, serr)
	if !ok {
		if serr == nil && f.Message == "" {
			f.Message = "the server has no " + name
		}
		return f
	}
	slice := max(time.Millisecond, (d / 2).Round(time.Millisecond))
	f.Values = map[string]any{"seconds": d.Seconds(), "slice_seconds": slice.Seconds()}
	f.Status = statusOK
	f.Message = fmt.Sprintf("%v: a Locker waits in statements of %v each (half of it), so a holder's CREATE INDEX CONCURRENTLY never meets a waiter as a deadlock; "+
		"a deadlock among one Session's keys is reported after %v", d, slice, d)
	if d < 20*time.Millisecond {
		f.Status = statusWarn
		f.Message += fmt.Sprintf("; each waiting Locker sends a statement every %v: with many waiters that is steady load (the default is 1s)", slice)
	}
	return f
}

// lockCounts are DoctorLocksSQL's answer: the shared lock table's
// entries in use, and the advisory locks held and awaited.
type lockCounts struct{ used, held, awaited int64 }

// countLocks asks DoctorLocksSQL.
func countLocks(ctx context.Context, db *sql.DB) (lockCounts, error) {
	var n lockCounts
	err := queryRow(ctx, db, sqltext.DoctorLocksSQL, &n.used, &n.held, &n.awaited)
	return n, err
}

// lockTableFinding reports the lock table's size (from s, read with
// serr) and what is in it now (n, counted with nerr).
func lockTableFinding(s map[string]setting, serr error, n lockCounts, nerr error) finding {
	f := finding{Name: "lock_table", Status: statusUnknown}
	if serr != nil {
		f.Message = "could not read pg_settings: " + redact(oneLine(serr))
		return f
	}
	var v [3]int64
	for i, name := range []string{"max_locks_per_transaction", "max_connections", "max_prepared_transactions"} {
		x, err := strconv.ParseInt(s[name].value, 10, 64)
		if err != nil {
			f.Message = "could not read " + name
			return f
		}
		v[i] = x
	}
	size := v[0] * (v[1] + v[2])
	f.Values = map[string]any{"max_locks_per_transaction": v[0], "max_connections": v[1], "max_prepared_transactions": v[2], "size": size}
	room := fmt.Sprintf("room for about %d locks (max_locks_per_transaction %d × (max_connections %d + max_prepared_transactions %d)), for all locks of the server, advisory or not", size, v[0], v[1], v[2])
	if nerr != nil {
		f.Message = room + "; could not count the locks in it: " + redact(oneLine(nerr))
		return f
	}
	f.Values["in_use"], f.Values["advisory_held"], f.Values["advisory_awaited"] = n.used, n.held, n.awaited
	f.Status = statusOK
	f.Message = fmt.Sprintf("%s; in it now: %d, of which %d advisory locks held and %d awaited", room, n.used, n.held, n.awaited)
	if size > 0 && n.used*10 >= size*8 {
		f.Status = statusWarn
		f.Message += "; nearly full: when it is, every lock in the server fails (out of shared memory; sqllock's ErrLockTableFull): raise max_locks_per_transaction (a restart)"
	}
	return f
}
