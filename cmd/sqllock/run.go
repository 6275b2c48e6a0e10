package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
)

// runFlags are the flags of "sqllock run", after flock(1) where they fit.
type runFlags struct {
	nonblock       bool
	timeout        time.Duration
	shared         bool
	conflictCode   int
	crc32          bool
	dsn            string
	onLost         time.Duration
	keepAlive      time.Duration
	orphanBound    time.Duration
	keepAliveSet   bool // the flag was given (else sqllock's default)
	orphanBoundSet bool
	holdAtLeast    time.Duration
	holdAtMost     time.Duration // 0: no bound
	slots          int
	connectTimeout time.Duration
	quiet          bool
	// txPooler: a transaction pooler is in the way
	// (sqllock.WithTransactionPooler).
	txPooler bool
}

// runSpec is a parsed "sqllock run" command line.
type runSpec struct {
	f       runFlags
	keyText string
	key     sqllock.Key
	argv    []string // COMMAND and its arguments
}

// defaultConnectTimeout bounds connecting to the server.
const defaultConnectTimeout = 15 * time.Second

// maxHoldAtLeast is the longest --hold-at-least: the longest window
// Lock.UnlockAfter takes (7 days), refused before anything runs rather
// than after COMMAND.
const maxHoldAtLeast = 7 * 24 * time.Hour

const runUsage = "usage: sqllock run [flags] KEY -- COMMAND [ARGS...]"

// runHelpTail is the end of run's -h: exit codes and examples.
const runHelpTail = `
Exit status:
  COMMAND's  COMMAND ran, the lock held throughout
  1          held elsewhere (-n) or the wait timed out (-w); see -E
  64         usage: bad flag, KEY, missing COMMAND, settings that do not fit
  69         the server cannot be reached
  70         another lock error (standby, unsupported server, deadlock)
  75         the lock was lost while COMMAND ran (COMMAND was stopped)
  124        COMMAND ran past --hold-at-most (COMMAND was stopped)
  77         authentication failed
  78         the DSN cannot be parsed
  126, 127   COMMAND cannot be run, or is not found
  128+N      COMMAND was killed by signal N, or run got signal N

Examples:
  sqllock run -n cron:reindex -- ./reindex.sh      # skip if another run holds it
  sqllock run -w 5m migrate -- ./migrate up       # wait up to 5 minutes
  sqllock run --slots 3 exports -- ./export.sh    # at most 3 at once, fleet-wide
`

// printRunUsage prints run's usage: each flag once, with its short and
// long names together, then the exit codes and examples.
func printRunUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, runUsage)
	printFlags(w, fs)
	fmt.Fprint(w, runHelpTail)
}

// printFlags prints the flags of fs under "Flags:": each flag once, with
// its short and long names together (-n, --nonblock), sorted by long name.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "\nFlags:")
	var order []string
	names := map[string][]string{}
	first := map[string]*flag.Flag{}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := names[f.Usage]; !ok {
			order = append(order, f.Usage)
			first[f.Usage] = f
		}
		names[f.Usage] = append(names[f.Usage], f.Name)
	})
	sort.SliceStable(order, func(i, j int) bool { return longest(names[order[i]]) < longest(names[order[j]]) })
	for _, u := range order {
		ns := names[u]
		sort.Slice(ns, func(i, j int) bool { return len(ns[i]) < len(ns[j]) })
		for i, n := range ns {
			if len(n) == 1 {
				ns[i] = "-" + n
			} else {
				ns[i] = "--" + n
			}
		}
		arg, usage := flag.UnquoteUsage(first[u])
		line := "  " + strings.Join(ns, ", ")
		if arg != "" {
			line += " " + strings.ToUpper(arg)
		}
		if d := first[u].DefValue; d != "" && d != "0" && d != "0s" && d != "false" {
			usage += " (default " + d + ")"
		}
		fmt.Fprintf(w, "%s\n      %s\n", line, usage)
	}
}

// longest returns the longest of names, which sorts a flag by its long name.
func longest(names []string) string {
	l := ""
	for _, n := range names {
		if len(n) > len(l) {
			l = n
		}
	}
	return l
}

func runFlagSet(f *runFlags, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sqllock run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { printRunUsage(stderr, fs) }
	for _, n := range []string{"n", "nonblock"} {
		fs.BoolVar(&f.nonblock, n, false, "do not wait: if the lock is held elsewhere, exit with the conflict code")
	}
	for _, n := range []string{"w", "timeout"} {
		fs.DurationVar(&f.timeout, n, 0, "wait at most this long (e.g. 30s), connecting included, then exit with the conflict code")
	}
	for _, n := range []string{"s", "shared"} {
		fs.BoolVar(&f.shared, n, false, "take the lock in shared mode")
	}
	for _, n := range []string{"E", "conflict-exit-code"} {
		fs.IntVar(&f.conflictCode, n, 1, "exit status when the lock is held elsewhere or the wait timed out")
	}
	for _, n := range []string{"q", "quiet"} {
		fs.BoolVar(&f.quiet, n, false, "print nothing when backing out or losing the lock")
	}
	fs.BoolVar(&f.crc32, "crc32", false, "hash a KEY name with CRC-32 (Python's zlib.crc32) instead of FNV-1a")
	fs.StringVar(&f.dsn, "dsn", "", "PostgreSQL connection string (default: DATABASE_URL, else PG* variables)")
	fs.DurationVar(&f.onLost, "on-lost", 10*time.Second, "if the lock is lost, SIGTERM COMMAND, then SIGKILL it after this grace period")
	fs.DurationVar(&f.keepAlive, "keep-alive", 0, "how often to check that the lock is still held (default: sqllock's, 5s; 0: never)")
	fs.DurationVar(&f.orphanBound, "orphan-bound", 0, "if this host dies or is cut off, the server frees the lock after this long (default: sqllock's, 30s; 0: the server's TCP settings, hours)")
	fs.IntVar(&f.slots, "slots", 0, "a semaphore: at most N runs of KEY at once, fleet-wide (KEY is its name)")
	fs.DurationVar(&f.holdAtLeast, "hold-at-least", 0, "keep the lock until at least this long after it was taken, even when COMMAND ends sooner (run once per tick across machines)")
	fs.DurationVar(&f.holdAtMost, "hold-at-most", 0, "stop COMMAND once this long has passed since the lock was taken (SIGTERM, then SIGKILL after --on-lost), and release the lock as it ends")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", defaultConnectTimeout, "give up connecting to the server after this long")
	fs.BoolVar(&f.txPooler, "transaction-pooler", false, "hold the lock through a transaction-mode pooler (PgBouncer with pool_mode=transaction, Supavisor, a pooled endpoint): sqllock.WithTransactionPooler(); sqllock doctor tells whether one is in the way")
	return fs
}

// parseRun reads a "sqllock run" command line. Flags come before KEY; a
// KEY may be negative (-5, -1,2), which the flag package alone would take
// for a flag.
func parseRun(args []string, stderr io.Writer) (runSpec, error) {
	var sp runSpec
	fs := runFlagSet(&sp.f, stderr)
	n := flagsEnd(fs, args)
	if err := fs.Parse(args[:n]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return sp, errHelp
		}
		return sp, fail(exitUsage, "")
	}
	rest := append(fs.Args(), args[n:]...)
	if len(rest) == 0 || rest[0] == "--" {
		return sp, fail(exitUsage, "run: missing KEY (%s)", runUsage)
	}
	sp.keyText, rest = rest[0], rest[1:]
	switch {
	case len(rest) > 0 && rest[0] == "--":
		rest = rest[1:]
	case len(rest) > 0 && strings.HasPrefix(rest[0], "-"):
		return sp, fail(exitUsage, "run: %q after KEY: flags go before KEY (%s)", clip(rest[0], 40), runUsage)
	}
	if len(rest) == 0 {
		return sp, fail(exitUsage, "run: missing COMMAND after -- (%s)", runUsage)
	}
	sp.argv = rest
	f := sp.f
	slotsGiven, atMostGiven := false, false
	fs.Visit(func(fl *flag.Flag) {
		slotsGiven = slotsGiven || fl.Name == "slots"
		atMostGiven = atMostGiven || fl.Name == "hold-at-most"
		sp.f.keepAliveSet = sp.f.keepAliveSet || fl.Name == "keep-alive"
		sp.f.orphanBoundSet = sp.f.orphanBoundSet || fl.Name == "orphan-bound"
	})
	f = sp.f
	switch {
	case f.conflictCode < 0 || f.conflictCode > 255:
		return sp, fail(exitUsage, "run: --conflict-exit-code must be 0 to 255")
	case f.timeout < 0:
		return sp, fail(exitUsage, "run: -w/--timeout must not be negative (got %v)", f.timeout)
	case f.keepAlive < 0:
		return sp, fail(exitUsage, "run: --keep-alive must not be negative (got %v; 0 turns it off)", f.keepAlive)
	case f.onLost < 0:
		return sp, fail(exitUsage, "run: --on-lost must not be negative (got %v)", f.onLost)
	case f.connectTimeout <= 0:
		return sp, fail(exitUsage, "run: --connect-timeout must be positive (got %v)", f.connectTimeout)
	case f.slots < 0 || f.slots > 1024 || slotsGiven && f.slots == 0:
		return sp, fail(exitUsage, "run: --slots must be 1 to 1024 (got %d)", f.slots)
	case f.slots > 0 && f.shared:
		return sp, fail(exitUsage, "run: --slots and --shared do not go together")
	case f.holdAtLeast < 0 || f.holdAtLeast > maxHoldAtLeast:
		return sp, fail(exitUsage, "run: --hold-at-least must be from 0 to %v (got %v)", maxHoldAtLeast, f.holdAtLeast)
	case atMostGiven && f.holdAtMost <= 0:
		return sp, fail(exitUsage, "run: --hold-at-most must be positive (got %v)", f.holdAtMost)
	case atMostGiven && f.holdAtMost < f.holdAtLeast:
		return sp, fail(exitUsage, "run: --hold-at-most %v is shorter than --hold-at-least %v", f.holdAtMost, f.holdAtLeast)
	case f.orphanBound < 0:
		return sp, fail(exitUsage, "run: --orphan-bound must not be negative (got %v; 0 turns it off)", f.orphanBound)
	}
	if err := sqllock.CheckOptions(f.lockerOptions()...); err != nil {
		return sp, fail(exitUsage, "run: %s (--keep-alive, --orphan-bound)", strings.TrimPrefix(err.Error(), "sqllock: "))
	}
	k, err := keyOf(sp.keyText, f.crc32)
	if err != nil {
		return sp, fail(exitUsage, "run: %v", err)
	}
	sp.key = k
	return sp, nil
}

// lockerOptions are the Locker's options the flags ask for.
func (f runFlags) lockerOptions() []sqllock.Option {
	// One lock per process: a session of its own (nothing to share).
	opts := []sqllock.Option{sqllock.WithHolders(), sqllock.WithDedicatedSessions()}
	if f.keepAliveSet { // else sqllock's default, fitted to the orphan bound
		opts = append(opts, sqllock.WithKeepAlive(f.keepAlive))
	}
	if f.orphanBoundSet {
		opts = append(opts, sqllock.WithOrphanBound(f.orphanBound))
	}
	if f.txPooler {
		opts = append(opts, sqllock.WithTransactionPooler())
	}
	return opts
}

// errHelp reports that -h was asked for (usage already printed).
var errHelp = errors.New("help")

// flagsEnd returns how many leading arguments are flags (with their
// values): it stops at "--", at the first argument that is not a flag, and
// at a negative key such as -5 or -1,2.
func flagsEnd(fs *flag.FlagSet, args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			return i
		}
		if _, err := sqllock.ParseKey(a); err == nil {
			return i // a negative key
		}
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		fl := fs.Lookup(name)
		if fl == nil {
			continue // fs.Parse reports it
		}
		if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
			i++ // the flag's value
		}
	}
	return len(args)
}

func runCmd(args []string, stderr io.Writer) error {
	sp, err := parseRun(args, stderr)
	if errors.Is(err, errHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	f, keyText, cmdName := sp.f, sp.keyText, sp.argv[0]

	// Signals: while connecting or waiting they abort with 128+N; while
	// COMMAND runs they are forwarded to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if f.timeout > 0 && !f.nonblock {
		// -w bounds connecting and waiting together.
		var tcancel context.CancelFunc
		ctx, tcancel = context.WithTimeout(ctx, f.timeout)
		defer tcancel()
	}
	ictx, in := interruptible(ctx, sigs)
	defer func() {
		if in != nil {
			in.release()
		}
	}()

	db, err := connect(ictx, dsnFrom(f.dsn), "sqllock run: "+keyText, f.connectTimeout)
	if s := in.signal(); s != nil {
		if db != nil {
			db.Close()
		}
		return fail(128+int(s.(syscall.Signal)), "interrupted by %v while connecting", s)
	}
	if err != nil {
		if ctx.Err() != nil && !f.nonblock && f.timeout > 0 {
			return fail(f.conflictCode, "%s", quietMsg(f.quiet, "could not connect within -w %v; not running %s", f.timeout, cmdName))
		}
		return err
	}
	defer db.Close()
	locker := sqllock.New(db, f.lockerOptions()...)

	lk, err := acquire(ictx, locker, sp, f)
	if s := in.signal(); s != nil && err != nil {
		return fail(128+int(s.(syscall.Signal)), "interrupted by %v while waiting for the lock", s)
	}
	if err != nil {
		if errors.Is(err, sqllock.ErrNotAcquired) {
			by := heldBy(err)
			if f.timeout > 0 && !f.nonblock {
				return fail(f.conflictCode, "%s", quietMsg(f.quiet, "lock %s still held elsewhere after %v%s; not running %s", keyText, f.timeout, by, cmdName))
			}
			return fail(f.conflictCode, "%s", quietMsg(f.quiet, "lock %s is held elsewhere%s; not running %s", keyText, by, cmdName))
		}
		msg := strings.TrimPrefix(err.Error(), "sqllock: ")
		if errors.Is(err, sqllock.ErrSessionChanged) && !f.txPooler {
			msg += " (sqllock run: --transaction-pooler; sqllock doctor tells what is in the way)"
		}
		return fail(exitSoftware, "lock %s: %s", keyText, msg)
	}

	in.release() // from here on, signals are COMMAND's
	in = nil
	status, lost, bounded, sig := supervise(lk, sp.argv, f, sigs, stderr)
	// The hold window (--hold-at-least) lives in this process, and only
	// after a COMMAND that ran to its end with the lock held throughout: a
	// COMMAND stopped by a signal holds no window; a signal during the
	// window ends it (released at once, exit 128+N); a loss during the
	// window ends it too, but COMMAND's run was whole (its status, with a
	// warning).
	windowed := f.holdAtLeast > 0 && !lost && !bounded && sig == nil && stillHeld(db, lk)
	if windowed {
		if err := lk.UnlockAfter(f.holdAtLeast); err == nil {
			select {
			case <-lk.Done():
			case sig = <-sigs:
			}
		}
	}
	uerr := lk.Unlock(context.Background())
	if errors.Is(uerr, sqllock.ErrReleased) {
		uerr = nil // released at the end of the window
		if lerr := lk.Err(); errors.Is(lerr, sqllock.ErrLockLost) {
			uerr = lerr
		}
	}
	switch {
	case lost:
		if !f.quiet {
			fmt.Fprintf(stderr, "sqllock: lock %s was lost while %s ran (%s); it was stopped\n", keyText, cmdName, oneLine(lk.Err()))
		}
		return fail(exitLost, "")
	case errors.Is(uerr, sqllock.ErrLockLost) && windowed:
		if !f.quiet {
			fmt.Fprintf(stderr, "sqllock: warning: lock %s was lost during the hold window, after %s ended (%s); another run may start before the window's end\n",
				keyText, cmdName, oneLine(uerr))
		}
	case errors.Is(uerr, sqllock.ErrLockLost):
		if !f.quiet {
			fmt.Fprintf(stderr, "sqllock: lock %s was lost before %s ended (%s)\n", keyText, cmdName, oneLine(uerr))
		}
		return fail(exitLost, "")
	case uerr != nil:
		fmt.Fprintf(stderr, "sqllock: warning: unlock %s: %s\n", keyText, oneLine(uerr))
	}
	if bounded {
		if !f.quiet {
			fmt.Fprintf(stderr, "sqllock: %s ran past --hold-at-most %v; it was stopped, and lock %s released\n", cmdName, f.holdAtMost, keyText)
		}
		return fail(exitBound, "")
	}
	if windowed && sig != nil {
		return fail(128+int(sig.(syscall.Signal)), "interrupted by %v during the hold window; the lock was released", sig)
	}
	if status != 0 {
		return fail(status, "")
	}
	return nil
}

// stillHeld reports whether the server shows lk held by its backend now
// (bounded to a few seconds): COMMAND has ended, and a hold window starts
// only for a run whose lock was held to the end.
func stillHeld(db *sql.DB, lk *sqllock.Lock) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs, err := sqllock.Inspect(ctx, db, nil, lk.Key())
	if err != nil {
		return false
	}
	for _, h := range hs {
		if h.Granted && h.PID == lk.PID() {
			return true
		}
	}
	return false
}

// heldBy describes the holder a refused lock's error carries: " (by pid
// N, application "x", client ADDR, since T)", or "" when unknown.
func heldBy(err error) string {
	var held *sqllock.HeldError
	if !errors.As(err, &held) {
		return ""
	}
	for _, h := range held.Holders {
		if !h.Granted {
			continue
		}
		s := fmt.Sprintf(" (by pid %d", h.PID)
		if h.ApplicationName != "" {
			s += fmt.Sprintf(", application %q", printable(h.ApplicationName))
		}
		if h.ClientAddr != "" {
			s += ", client " + h.ClientAddr
		}
		if !h.Since.IsZero() {
			s += ", since " + h.Since.Format(time.RFC3339)
		}
		return s + ")"
	}
	return ""
}

// quietMsg formats a message, or returns "" under -q.
func quietMsg(quiet bool, format string, args ...any) string {
	if quiet {
		return ""
	}
	return fmt.Sprintf(format, args...)
}

// interrupter ends a context at the first signal, until released.
type interrupter struct {
	mu   sync.Mutex
	sig  os.Signal // guarded by mu
	stop chan struct{}
	done chan struct{}
}

// interruptible returns a context that ends when parent does or at the
// first signal from sigs, and the interrupter that saw it.
func interruptible(parent context.Context, sigs <-chan os.Signal) (context.Context, *interrupter) {
	ctx, cancel := context.WithCancel(parent)
	in := &interrupter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(in.done)
		select {
		case s := <-sigs:
			in.mu.Lock()
			in.sig = s
			in.mu.Unlock()
			cancel()
		case <-in.stop:
		}
	}()
	return ctx, in
}

// signal returns the signal that ended the context, or nil.
func (in *interrupter) signal() os.Signal {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.sig
}

// release stops watching: later signals are for whoever reads sigs next.
func (in *interrupter) release() {
	close(in.stop)
	<-in.done
}

// acquire takes the lock as the flags say; ctx ends the wait.
func acquire(ctx context.Context, l *sqllock.Locker, sp runSpec, f runFlags) (*sqllock.Lock, error) {
	k := sp.key
	switch {
	case f.slots > 0 && f.nonblock:
		return l.Semaphore(sp.keyText, f.slots).TryAcquire(ctx)
	case f.slots > 0:
		return l.Semaphore(sp.keyText, f.slots).Acquire(ctx)
	case f.nonblock && f.shared:
		return l.TryRLock(ctx, k)
	case f.nonblock:
		return l.TryLock(ctx, k)
	case f.shared:
		return l.RLock(ctx, k)
	default:
		return l.Lock(ctx, k)
	}
}

// supervise runs COMMAND while the lock is held. It returns COMMAND's exit
// status, lost = true when the lock was lost, bounded = true when COMMAND
// ran past --hold-at-most (either way COMMAND was then stopped with
// SIGTERM, and SIGKILL after the grace period), and the last signal run
// got and forwarded to COMMAND, if any. The lock is released by the
// caller, once COMMAND has ended: a COMMAND stopped at its bound never
// runs beside the next holder.
func supervise(lk *sqllock.Lock, argv []string, f runFlags, sigs <-chan os.Signal, stderr io.Writer) (status int, lost, bounded bool, sig os.Signal) {
	// The bound counts from the lock's grant, which was just now.
	var bound <-chan time.Time
	if f.holdAtMost > 0 {
		t := time.NewTimer(f.holdAtMost)
		defer t.Stop()
		bound = t.C
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Outside a terminal (cron, systemd), COMMAND gets a process group of
	// its own, and signals go to the whole group: stopping a shell script
	// also stops what it started. At a terminal, COMMAND stays in the
	// foreground group so that it can read the terminal.
	group := !isTerminal(os.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	// COMMAND must not outlive the lock's holder: if run dies (even by
	// SIGKILL), its session ends and the lock is free, so the kernel stops
	// COMMAND too where it can (Linux).
	dieWithParent(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "sqllock: cannot run %s: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound, false, false, nil
		}
		return exitCannotRun, false, false, nil
	}
	signal := func(s os.Signal) {
		if group {
			syscall.Kill(-cmd.Process.Pid, s.(syscall.Signal))
		} else {
			cmd.Process.Signal(s)
		}
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	lostC := lk.Done()
	var kill <-chan time.Time
	for {
		select {
		case <-done:
			if (lost || bounded) && group {
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever COMMAND left behind
			}
			return exitStatus(cmd.ProcessState), lost, bounded, sig
		case s := <-sigs:
			sig = s
			signal(s)
		case <-lostC:
			lostC = nil
			lost = true
			if kill == nil {
				signal(syscall.SIGTERM)
				kill = time.After(f.onLost)
			}
		case <-bound:
			bound = nil
			bounded = true
			if kill == nil {
				signal(syscall.SIGTERM)
				kill = time.After(f.onLost)
			}
		case <-kill:
			signal(syscall.SIGKILL)
		}
	}
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// keyOf reads KEY: a number or pair as ParseKey reads them, otherwise a
// name to hash. Text that looks like a number but is not a valid one is an
// error rather than a name.
func keyOf(text string, crc bool) (sqllock.Key, error) {
	t := strings.TrimSpace(text)
	if t == "" {
		return sqllock.Key{}, errors.New("empty KEY")
	}
	if k, err := sqllock.ParseKey(t); err == nil {
		return k, nil
	} else if looksNumeric(t) {
		return sqllock.Key{}, errors.New(strings.TrimPrefix(err.Error(), "sqllock: "))
	}
	if crc {
		return interop.CRC32(text), nil
	}
	return sqllock.Hash(text), nil
}

// looksNumeric reports whether s is made only of what keys are written
// with: digits, signs, commas, parentheses and spaces.
func looksNumeric(s string) bool {
	digits := false
	for _, r := range s {
		switch {
		case r >= '0' && r <= '9':
			digits = true
		case strings.ContainsRune("+-,() ", r):
		default:
			return false
		}
	}
	return digits || strings.ContainsAny(s, "(),")
}
