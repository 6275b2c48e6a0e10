package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Stranded locks: advisory locks held by a session that has run nothing
// for a while (idle, or idle in a transaction), left by a program that
// took them by hand and went quiet (psql, a pooled connection of another
// library). A Locker's own lock sessions are never stranded: their last
// statement is the library's (see sqltext.Own), and their keep-alive and
// lease watch them.

// examined is a granted lock and what its holder's session shows.
type examined struct {
	h    sqllock.HeldLock
	idle time.Duration // how long the session has been in its state, by the server's clock
	// why it is not stranded, whatever its idle time; "" when it may be.
	why string
}

// examine judges the holder of the granted lock h, at the server's time
// now.
func examine(h sqllock.HeldLock, now time.Time) examined {
	e := examined{h: h}
	if !h.Since.IsZero() {
		e.idle = max(now.Sub(h.Since), 0)
	}
	switch {
	case h.PID == 0:
		e.why = "a prepared transaction holds it (COMMIT PREPARED or ROLLBACK PREPARED ends it)"
	case h.Hidden:
		e.why = "a session of another role, which this role may not examine (pg_read_all_stats may)"
	case h.State == "":
		e.why = "its session shows no state (it ended as it was read)"
	case sqltext.Own(h.Query):
		e.why = "a lock session of sqllock (its last statement is sqllock's): its Locker's keep-alive watches it; stop that process instead"
	case !slices.Contains(sqltext.IdleStates, h.State):
		e.why = fmt.Sprintf("its session is not idle (%s)", h.State)
	}
	return e
}

// serverNow reads the server's clock: idle times are the server's, whatever
// this machine's clock says.
func serverNow(ctx context.Context, db *sql.DB) (time.Time, error) {
	var now time.Time
	err := db.QueryRowContext(ctx, sqltext.ClockSQL).Scan(&now)
	return now, err
}

// stranded reads the locks of the database and returns those whose holder
// has been idle longer than d (and is not sqllock's), and how many granted
// locks it could not examine (other roles' sessions) and left as
// sqllock's own.
func stranded(ctx context.Context, db *sql.DB, reg *sqllock.Registry, d time.Duration) (out []examined, hidden, own int, err error) {
	now, err := serverNow(ctx, db)
	if err != nil {
		return nil, 0, 0, err
	}
	locks, err := sqllock.Inspect(ctx, db, reg)
	if err != nil {
		return nil, 0, 0, err
	}
	for _, h := range locks {
		if !h.Granted {
			continue
		}
		e := examine(h, now)
		switch {
		case h.Hidden:
			hidden++
		case e.why != "" && sqltext.Own(h.Query):
			if e.idle > d {
				own++
			}
		case e.why == "" && e.idle > d:
			out = append(out, e)
		}
	}
	return out, hidden, own, nil
}

// printStranded prints the stranded locks as a table.
func printStranded(w io.Writer, locks []examined, d time.Duration, names bool, hidden, own int) error {
	if len(locks) == 0 {
		fmt.Fprintf(w, "no stranded advisory locks in this database (held by a session idle for more than %v)\n", d)
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		header := "KEY\tFORM\t"
		if names {
			header += "NAME\t"
		}
		fmt.Fprintln(tw, header+"MODE\tPID\tAPPLICATION\tCLIENT\tSESSION\tIDLE\tWAITERS\tQUERY")
		for _, e := range locks {
			l := e.h
			form := "bigint"
			if _, _, pair := l.Key.Pair(); pair {
				form = "pair"
			}
			row := l.Key.String() + "\t" + form + "\t"
			if names {
				row += dash(printable(l.Name)) + "\t"
			}
			row += fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s", mode(l), l.PID, dash(printable(l.ApplicationName)), dash(l.ClientAddr),
				l.State, e.idle.Round(time.Second), l.Waiters, short(l.Query, 60))
			fmt.Fprintln(tw, row)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if own > 0 {
		fmt.Fprintf(w, "\n%d lock(s) on sessions of sqllock, idle that long, are not listed: their Locker's keep-alive watches them\n", own)
	}
	if hidden > 0 {
		fmt.Fprintf(w, "\n%d lock(s) belong to sessions of other roles, which this role may not examine (insufficient privilege; pg_read_all_stats may)\n", hidden)
	}
	return nil
}

// printStrandedJSON prints the stranded locks as inspect --json does, with
// client_addr and idle_seconds.
func printStrandedJSON(w io.Writer, locks []examined) error {
	out := make([]sqllock.HeldLock, len(locks))
	idle := make([]time.Duration, len(locks))
	for i, e := range locks {
		out[i], idle[i] = e.h, e.idle
	}
	return printJSONIdle(w, out, idle)
}

const breakUsage = "usage: sqllock break [flags] KEY"

// breakHelpTail is the end of break's -h.
const breakHelpTail = `
break terminates the backend that holds KEY (pg_terminate_backend), so
that the server frees the lock, only when that backend has run nothing for
--idle-at-least, is named --application, and is not one of sqllock's own
lock sessions. Without --yes it only prints what it would do.

Exit status:
  0    (--yes) the holders were terminated and the lock is free; (dry run) a holder passes the guards
  1    KEY is not held, or no holder passes the guards: nothing was done
  64   usage: bad flag, bad KEY, --yes without --application
  69   the server cannot be reached
  70   a termination failed, or the lock is still held after it

Examples:
  sqllock break --idle-at-least 10m cron:reindex                        # dry run: who holds it, what would be done
  sqllock break --idle-at-least 10m --application psql --yes cron:reindex
`

// breakFlags are the flags of "sqllock break".
type breakFlags struct {
	idleAtLeast    time.Duration
	application    string
	applicationSet bool
	yes            bool
	crc32          bool
	dsn            string
}

func breakCmd(args []string, stdout, stderr io.Writer) error {
	var f breakFlags
	fs := flag.NewFlagSet("sqllock break", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, breakUsage)
		printFlags(stderr, fs)
		fmt.Fprint(stderr, breakHelpTail)
	}
	fs.DurationVar(&f.idleAtLeast, "idle-at-least", time.Minute, "terminate only a holder that has run nothing for at least this long")
	fs.StringVar(&f.application, "application", "", "terminate only a holder whose application_name is exactly `NAME` (required with --yes; '' for none)")
	fs.BoolVar(&f.yes, "yes", false, "terminate; without it, only print what would be done")
	fs.BoolVar(&f.crc32, "crc32", false, "hash a KEY name with CRC-32 (Python's zlib.crc32) instead of FNV-1a")
	fs.StringVar(&f.dsn, "dsn", "", "PostgreSQL connection string (default: DATABASE_URL, else PG* variables)")
	// Flags before and after KEY; a KEY may be negative (-5), which the
	// flag package alone would take for a flag.
	n := flagsEnd(fs, args)
	if err := fs.Parse(args[:n]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fail(exitUsage, "")
	}
	rest := append(fs.Args(), args[n:]...)
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return fail(exitUsage, "break: missing KEY (%s)", breakUsage)
	}
	keyText := rest[0]
	if err := fs.Parse(rest[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fail(exitUsage, "")
	}
	if fs.NArg() > 0 {
		return fail(exitUsage, "break: unexpected argument %q (%s)", clip(fs.Arg(0), 40), breakUsage)
	}
	fs.Visit(func(fl *flag.Flag) { f.applicationSet = f.applicationSet || fl.Name == "application" })
	switch {
	case f.idleAtLeast < 0:
		return fail(exitUsage, "break: --idle-at-least must not be negative (got %v)", f.idleAtLeast)
	case f.yes && !f.applicationSet:
		return fail(exitUsage, "break: --yes needs --application NAME: the holder's application_name, as the dry run shows it")
	}
	k, err := keyOf(keyText, f.crc32)
	if err != nil {
		return fail(exitUsage, "break: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	db, err := connect(ctx, dsnFrom(f.dsn), "sqllock break: "+keyText, defaultConnectTimeout)
	if err != nil {
		return err
	}
	defer db.Close()
	now, err := serverNow(ctx, db)
	if err != nil {
		return fail(exitUnavailable, "break: %v", err)
	}
	locks, err := sqllock.Inspect(ctx, db, nil, k)
	if err != nil {
		return fail(exitUnavailable, "break: %v", err)
	}
	var held []examined
	for _, h := range locks {
		if h.Granted {
			held = append(held, examine(h, now))
		}
	}
	if len(held) == 0 {
		return fail(1, "lock %s is not held: nothing to do", keyText)
	}
	var chosen []examined
	for _, e := range held {
		why := e.why
		switch {
		case why != "":
		case e.idle < f.idleAtLeast:
			why = fmt.Sprintf("its session has been %s for %v, less than --idle-at-least %v", e.h.State, e.idle.Round(time.Millisecond), f.idleAtLeast)
		case f.applicationSet && e.h.ApplicationName != f.application:
			why = fmt.Sprintf("its application_name is %q, not --application %q", printable(e.h.ApplicationName), printable(f.application))
		}
		verdict := "would terminate it"
		switch {
		case why != "":
			verdict = "leaving it: " + why
		case f.yes:
			verdict = "terminating it"
		case !f.applicationSet:
			verdict = fmt.Sprintf("would terminate it with --application %s --yes", shellQuote(e.h.ApplicationName))
		}
		fmt.Fprintf(stdout, "lock %s held by %s: %s\n", keyText, describe(e), verdict)
		if why == "" {
			chosen = append(chosen, e)
		}
	}
	if len(chosen) == 0 {
		return fail(1, "no holder of lock %s passes the guards: nothing was done", keyText)
	}
	if !f.yes {
		fmt.Fprintln(stdout, "dry run: nothing was done")
		return nil
	}
	classid, objid, subid := tagOf(k)
	var gone []int
	for _, e := range chosen {
		var ok bool
		err := db.QueryRowContext(ctx, sqltext.BreakSQL, e.h.PID, classid, objid, subid, e.h.Since,
			strconv.FormatInt(f.idleAtLeast.Microseconds(), 10)+" microseconds", f.application).Scan(&ok)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			fmt.Fprintf(stdout, "backend %d ran a statement (or ended) since it was read: left alone\n", e.h.PID)
		case err != nil:
			return fail(exitSoftware, "break: terminating backend %d: %s", e.h.PID, oneLine(err))
		case !ok:
			return fail(exitSoftware, "break: the server did not terminate backend %d (it had ended, or is not a backend)", e.h.PID)
		default:
			fmt.Fprintf(stdout, "terminated backend %d\n", e.h.PID)
			gone = append(gone, e.h.PID)
		}
	}
	if len(gone) == 0 {
		return fail(1, "no holder of lock %s was terminated", keyText)
	}
	// The server frees the lock as the backend exits, a moment later.
	deadline := time.Now().Add(5 * time.Second)
	for {
		locks, err := sqllock.Inspect(ctx, db, nil, k)
		if err != nil {
			return fail(exitUnavailable, "break: %v", err)
		}
		var still []string
		for _, h := range locks {
			if h.Granted && slices.Contains(gone, h.PID) {
				still = append(still, strconv.Itoa(h.PID))
			}
		}
		if len(still) == 0 {
			fmt.Fprintf(stdout, "lock %s: freed by backend%s %s\n", keyText, plural(len(gone)), joinInts(gone))
			return nil
		}
		if time.Now().After(deadline) {
			return fail(exitSoftware, "break: lock %s is still held by backend %s 5s after it was terminated", keyText, strings.Join(still, ","))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// describe names the holder e: its backend, application, client and idle
// time.
func describe(e examined) string {
	s := fmt.Sprintf("backend %d (application %q", e.h.PID, printable(e.h.ApplicationName))
	if e.h.ClientAddr != "" {
		s += ", client " + e.h.ClientAddr
	}
	if e.h.State != "" {
		s += fmt.Sprintf(", %s for %v", e.h.State, e.idle.Round(time.Millisecond))
	}
	return s + ")"
}

// tagOf returns how pg_locks stores key k: classid, objid (unsigned 32-bit
// halves), objsubid (1 for a bigint key, 2 for a pair).
func tagOf(k sqllock.Key) (classid, objid int64, objsubid int) {
	if v, ok := k.Int64(); ok {
		return int64(uint64(v) >> 32), int64(uint32(v)), 1
	}
	c, id, _ := k.Pair()
	return int64(uint32(c)), int64(uint32(id)), 2
}

// shellQuote quotes s for a shell command line.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:/@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(printable(s), "'", `'\''`) + "'"
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
