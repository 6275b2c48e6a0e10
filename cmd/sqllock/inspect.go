package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
)

func inspectCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sqllock inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON (one array per listing)")
	watch := fs.Duration("watch", 0, "list again every `INTERVAL` (e.g. 2s) until interrupted")
	regFile := fs.String("registry", "", "`FILE` of lock names: one NAME [KEY] per line (KEY defaults to the hash of NAME)")
	dsnFlag := fs.String("dsn", "", "PostgreSQL connection string (default: DATABASE_URL, else PG* variables)")
	strandedFor := fs.Duration("stranded", 0, "list only the locks whose holder has run nothing (idle, or idle in a transaction) for longer than `D` (e.g. 5m), with its client address; sqllock's own lock sessions are never listed (see sqllock break)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fail(exitUsage, "")
	}
	if fs.NArg() > 0 {
		return fail(exitUsage, "inspect: unexpected argument %q", fs.Arg(0))
	}
	strandedOnly := false
	fs.Visit(func(fl *flag.Flag) { strandedOnly = strandedOnly || fl.Name == "stranded" })
	if *strandedFor < 0 {
		return fail(exitUsage, "inspect: --stranded must not be negative (got %v)", *strandedFor)
	}
	var reg *sqllock.Registry
	if *regFile != "" {
		var err error
		if reg, err = loadRegistry(*regFile); err != nil {
			return fail(exitUsage, "inspect: %v", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	db, err := connect(ctx, dsnFrom(*dsnFlag), "sqllock inspect", defaultConnectTimeout)
	if err != nil {
		return err
	}
	defer db.Close()
	for {
		var locks []sqllock.HeldLock
		var strandedLocks []examined
		var hidden, own int
		if strandedOnly {
			strandedLocks, hidden, own, err = stranded(ctx, db, reg, *strandedFor)
		} else {
			locks, err = sqllock.Inspect(ctx, db, reg)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fail(exitUnavailable, "inspect: %v", err)
		}
		if *watch > 0 && !*asJSON {
			if isTerminalWriter(stdout) {
				fmt.Fprint(stdout, "\033[H\033[2J") // clear the screen: only a terminal has one
			}
			fmt.Fprintf(stdout, "%s  every %v\n\n", time.Now().Format(time.RFC3339), *watch)
		}
		switch {
		case strandedOnly && *asJSON:
			err = printStrandedJSON(stdout, strandedLocks)
		case strandedOnly:
			err = printStranded(stdout, strandedLocks, *strandedFor, *regFile != "", hidden, own)
		case *asJSON:
			err = printJSON(stdout, locks)
		default:
			err = printTable(stdout, locks, *regFile != "")
		}
		if err != nil || *watch <= 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*watch):
		}
	}
}

// jsonLock is the JSON form of one lock.
type jsonLock struct {
	Key             string     `json:"key"`
	Form            string     `json:"form"` // "bigint" or "pair"
	Bigint          *int64     `json:"bigint,omitempty"`
	Class           *int32     `json:"class,omitempty"`
	ID              *int32     `json:"id,omitempty"`
	Name            string     `json:"name,omitempty"`
	Mode            string     `json:"mode"`  // "exclusive" or "shared"
	State           string     `json:"state"` // "held", "waiting", or an election's "leader" and "candidate"
	WaitingSince    *time.Time `json:"waiting_since,omitempty"`
	PID             int        `json:"pid"`
	ApplicationName string     `json:"application_name"`
	ClientAddr      string     `json:"client_addr"` // "" over a Unix socket, or when hidden
	SessionState    string     `json:"session_state"`
	Query           string     `json:"query"`
	QueryHidden     bool       `json:"query_hidden"`
	BlockedBy       []int      `json:"blocked_by"`
	Semaphore       string     `json:"semaphore,omitempty"`    // the semaphore whose slot the key is (registry)
	IdleSeconds     *float64   `json:"idle_seconds,omitempty"` // --stranded: how long the holder has run nothing
}

func toJSON(l sqllock.HeldLock) jsonLock {
	j := jsonLock{Key: l.Key.String(), Name: l.Name, Mode: mode(l), State: state(l), PID: l.PID,
		ApplicationName: l.ApplicationName, ClientAddr: l.ClientAddr, SessionState: l.State, Query: l.Query, QueryHidden: l.Hidden, BlockedBy: l.BlockedBy,
		Semaphore: l.Semaphore}
	if v, ok := l.Key.Int64(); ok {
		j.Form, j.Bigint = "bigint", &v
	} else if c, id, ok := l.Key.Pair(); ok {
		j.Form, j.Class, j.ID = "pair", &c, &id
	}
	if !l.WaitStart.IsZero() {
		ws := l.WaitStart
		j.WaitingSince = &ws
	}
	if j.BlockedBy == nil {
		j.BlockedBy = []int{}
	}
	return j
}

func printJSON(w io.Writer, locks []sqllock.HeldLock) error { return printJSONIdle(w, locks, nil) }

// printJSONIdle prints locks as JSON, each with its idle time when idle
// has one per lock.
func printJSONIdle(w io.Writer, locks []sqllock.HeldLock, idle []time.Duration) error {
	out := make([]jsonLock, 0, len(locks))
	for i, l := range locks {
		j := toJSON(l)
		if idle != nil {
			s := idle[i].Seconds()
			j.IdleSeconds = &s
		}
		out = append(out, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func mode(l sqllock.HeldLock) string {
	if l.Shared {
		return "shared"
	}
	return "exclusive"
}

// electionPrefix starts the application_name of an Election candidate's
// session, as sqllock's Election documents it.
const electionPrefix = "sqllock-election:"

func state(l sqllock.HeldLock) string {
	_, candidate := strings.CutPrefix(l.ApplicationName, electionPrefix)
	switch {
	case l.Granted && candidate:
		return "leader" // an Election's: APPLICATION shows its value
	case l.Granted:
		return "held"
	case candidate:
		return "candidate"
	}
	return "waiting"
}

func printTable(w io.Writer, locks []sqllock.HeldLock, names bool) error {
	if len(locks) == 0 {
		_, err := fmt.Fprintln(w, "no advisory locks in this database")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "KEY\tFORM\t"
	if names {
		header += "NAME\t"
	}
	fmt.Fprintln(tw, header+"MODE\tSTATE\tFOR\tPID\tAPPLICATION\tSESSION\tBLOCKED BY\tQUERY")
	hidden := 0
	printed := map[string]bool{}
	for _, l := range locks {
		if l.Semaphore != "" {
			// A semaphore's slots are one row: how many are held, by whom.
			if !printed[l.Semaphore] {
				printed[l.Semaphore] = true
				fmt.Fprintln(tw, semaphoreRow(l.Semaphore, locks, names))
			}
			continue
		}
		form := "bigint"
		if _, _, pair := l.Key.Pair(); pair {
			form = "pair"
		}
		row := l.Key.String() + "\t" + form + "\t"
		if names {
			row += dash(printable(l.Name)) + "\t"
		}
		wait := "-"
		if !l.Granted && !l.WaitStart.IsZero() {
			wait = time.Since(l.WaitStart).Round(time.Millisecond).String()
		}
		blocked := make([]string, len(l.BlockedBy))
		for i, p := range l.BlockedBy {
			blocked[i] = strconv.Itoa(p)
		}
		q := l.Query
		if label, ok := sqltext.Label(q); ok {
			q = label // one of sqllock's own statements: what it does, not its text
		}
		if l.Hidden {
			hidden++
			q = "(hidden)"
		}
		row += fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s", mode(l), state(l), wait, l.PID,
			dash(printable(l.ApplicationName)), dash(printable(l.State)), dash(strings.Join(blocked, ",")), short(q, 60))
		fmt.Fprintln(tw, row)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if hidden > 0 {
		fmt.Fprintf(w, "\n%d lock(s) belong to sessions of other roles: their queries are hidden (insufficient privilege; pg_read_all_stats shows them)\n", hidden)
	}
	return nil
}

// semaphoreRow is the table row of semaphore name: its slots held, the
// holders' pids and applications, and how many wait.
func semaphoreRow(name string, locks []sqllock.HeldLock, names bool) string {
	held, waiting := 0, 0
	var pids, apps []string
	for _, l := range locks {
		if l.Semaphore != name {
			continue
		}
		if !l.Granted {
			waiting++
			continue
		}
		held++
		pids = append(pids, strconv.Itoa(l.PID))
		if a := printable(l.ApplicationName); a != "" && !slices.Contains(apps, a) {
			apps = append(apps, a)
		}
	}
	row := "slots\tsemaphore\t"
	if names {
		row += printable(name) + "\t"
	}
	state := fmt.Sprintf("%d held", held)
	if waiting > 0 {
		state += fmt.Sprintf(", %d waiting", waiting)
	}
	return row + fmt.Sprintf("semaphore\t%s\t-\t%s\t%s\t-\t-\t-", state, strings.Join(pids, ","), dash(strings.Join(apps, ",")))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// short returns s on one line, control characters escaped, cut to at most
// n characters.
func short(s string, n int) string {
	s = printable(strings.Join(strings.Fields(s), " "))
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// isTerminalWriter reports whether w is a terminal.
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminal(f)
}

// loadRegistry reads a registry file: one `NAME [KEY]` per line (or `NAME
// slots=N` for a semaphore); blank lines and lines starting with # are
// skipped; KEY defaults to Hash(NAME).
func loadRegistry(path string) (*sqllock.Registry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reg := sqllock.NewRegistry()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, keyText := line, ""
		if i := strings.IndexFunc(line, unicode.IsSpace); i >= 0 {
			name, keyText = line[:i], line[i:]
		}
		k := sqllock.Hash(name)
		if slotsText, ok := strings.CutPrefix(strings.TrimSpace(keyText), "slots="); ok {
			slots, err := strconv.Atoi(slotsText)
			if err == nil {
				err = reg.RegisterSemaphore(name, slots)
			}
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %v", path, n, err)
			}
			continue
		}
		if keyText = strings.TrimSpace(keyText); keyText != "" {
			if k, err = sqllock.ParseKey(keyText); err != nil {
				return nil, fmt.Errorf("%s:%d: %v", path, n, err)
			}
		}
		if err := reg.Register(name, k); err != nil {
			return nil, fmt.Errorf("%s:%d: %v", path, n, err)
		}
	}
	return reg, sc.Err()
}
