package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/sqllock/sqllock"
)

// runFlags are the flags of "sqllock run", after flock(1) where they fit.
type runFlags struct {
	nonblock     bool
	timeout      time.Duration
	shared       bool
	conflictCode int
	crc32        bool
	dsn          string
	onLost       time.Duration
	keepAlive    time.Duration
	quiet        bool
}

func runCmd(args []string, stderr io.Writer) error {
	var f runFlags
	fs := flag.NewFlagSet("sqllock run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sqllock run [flags] KEY -- COMMAND [ARGS...]")
		fs.PrintDefaults()
	}
	for _, n := range []string{"n", "nonblock"} {
		fs.BoolVar(&f.nonblock, n, false, "do not wait: if the lock is held elsewhere, exit with the conflict code")
	}
	for _, n := range []string{"w", "timeout"} {
		fs.DurationVar(&f.timeout, n, 0, "wait at most this long (e.g. 30s), then exit with the conflict code")
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
	fs.DurationVar(&f.keepAlive, "keep-alive", sqllock.DefaultKeepAlive, "how often to check that the lock is still held")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fail(exitUsage, "")
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return fail(exitUsage, "run: missing KEY (usage: sqllock run [flags] KEY -- COMMAND [ARGS...])")
	}
	keyText, rest := rest[0], rest[1:]
	if len(rest) > 0 && rest[0] == "--" {
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return fail(exitUsage, "run: missing COMMAND after -- (usage: sqllock run [flags] KEY -- COMMAND [ARGS...])")
	}
	if f.conflictCode < 0 || f.conflictCode > 255 {
		return fail(exitUsage, "run: --conflict-exit-code must be 0 to 255")
	}
	k, err := keyOf(keyText, f.crc32)
	if err != nil {
		return fail(exitUsage, "run: %v", err)
	}

	// Signals: while waiting they abort the wait; while COMMAND runs they
	// are forwarded to it.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := connect(ctx, dsnFrom(f.dsn), "sqllock run: "+keyText)
	if err != nil {
		return err
	}
	defer db.Close()
	locker := sqllock.New(db, sqllock.WithKeepAlive(f.keepAlive))

	lk, err := acquire(ctx, locker, k, f, sigs)
	if err != nil {
		if errors.Is(err, sqllock.ErrNotAcquired) {
			msg := ""
			if !f.quiet {
				msg = fmt.Sprintf("lock %s is held elsewhere; not running %s", keyText, rest[0])
				if f.timeout > 0 && !f.nonblock {
					msg = fmt.Sprintf("lock %s still held elsewhere after %v; not running %s", keyText, f.timeout, rest[0])
				}
			}
			return fail(f.conflictCode, "%s", msg)
		}
		var ee *exitError
		if errors.As(err, &ee) {
			return err
		}
		return fail(exitSoftware, "lock %s: %s", keyText, strings.TrimPrefix(err.Error(), "sqllock: "))
	}

	status, lost := supervise(lk, rest, f, sigs, stderr)
	uerr := lk.Unlock(context.Background())
	switch {
	case lost:
		if !f.quiet {
			fmt.Fprintf(stderr, "sqllock: lock %s was lost while %s ran (%v); it was stopped\n", keyText, rest[0], lk.Err())
		}
		return fail(exitLost, "")
	case errors.Is(uerr, sqllock.ErrLockLost):
		if !f.quiet {
			fmt.Fprintf(stderr, "sqllock: lock %s was not held when %s ended: %v\n", keyText, rest[0], uerr)
		}
		return fail(exitLost, "")
	case uerr != nil:
		fmt.Fprintf(stderr, "sqllock: warning: unlock %s: %v\n", keyText, uerr)
	}
	if status != 0 {
		return fail(status, "")
	}
	return nil
}

// acquire takes the lock as the flags say. A signal while waiting aborts
// the wait.
func acquire(ctx context.Context, l *sqllock.Locker, k sqllock.Key, f runFlags, sigs <-chan os.Signal) (*sqllock.Lock, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var interrupted os.Signal
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case s := <-sigs:
			interrupted = s
			cancel()
		case <-stop:
		}
	}()
	if f.timeout > 0 && !f.nonblock {
		var tcancel context.CancelFunc
		ctx, tcancel = context.WithTimeout(ctx, f.timeout)
		defer tcancel()
	}
	var lk *sqllock.Lock
	var err error
	switch {
	case f.nonblock && f.shared:
		lk, err = l.TryRLock(ctx, k)
	case f.nonblock:
		lk, err = l.TryLock(ctx, k)
	case f.shared:
		lk, err = l.RLock(ctx, k)
	default:
		lk, err = l.Lock(ctx, k)
	}
	if err != nil && errors.Is(err, context.Canceled) {
		if s, ok := interrupted.(syscall.Signal); ok {
			return nil, fail(128+int(s), "interrupted by %v while waiting for the lock", s)
		}
	}
	return lk, err
}

// supervise runs COMMAND while the lock is held. It returns COMMAND's exit
// status, and lost = true when the lock was lost (COMMAND was then stopped
// with SIGTERM, and SIGKILL after the grace period).
func supervise(lk *sqllock.Lock, argv []string, f runFlags, sigs <-chan os.Signal, stderr io.Writer) (status int, lost bool) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// Outside a terminal (cron, systemd), COMMAND gets a process group of
	// its own, and signals go to the whole group: stopping a shell script
	// also stops what it started. At a terminal, COMMAND stays in the
	// foreground group so that it can read the terminal.
	group := !isTerminal(os.Stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "sqllock: cannot run %s: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound, false
		}
		return exitCannotRun, false
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
			if lost && group {
				syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever COMMAND left behind
			}
			return exitStatus(cmd.ProcessState), lost
		case s := <-sigs:
			signal(s)
		case <-lostC:
			lostC = nil
			lost = true
			signal(syscall.SIGTERM)
			kill = time.After(f.onLost)
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
		return sqllock.CRC32(text), nil
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
