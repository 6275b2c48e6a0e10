// Command sqllock is flock(1) for PostgreSQL: it holds a PostgreSQL advisory
// lock while a command runs, so that a cron job runs once across many
// machines. It also lists the advisory locks of a database (those left by
// idle sessions too), frees a lock left by an idle session, and prints
// the key of a name.
//
//	sqllock run [flags] KEY -- COMMAND [ARGS...]
//	sqllock inspect [--json] [--watch INTERVAL] [--registry FILE] [--stranded D]
//	sqllock break [--idle-at-least D] [--application NAME] [--yes] KEY
//	sqllock key NAME
//	sqllock doctor [--json] [--dsn DSN] [--connect-timeout D]
//	sqllock version (or --version)
//
// KEY is a number (123), a pair (1,2), or a name, hashed with sqllock.Hash
// (or with CRC-32 under --crc32, to share locks with Python code that uses
// zlib.crc32). The connection comes from --dsn, else DATABASE_URL, else the
// libpq environment variables (PGHOST, PGPORT, PGUSER, PGPASSWORD,
// PGDATABASE, ...).
//
// Exit status of run: COMMAND's own status; the conflict code (-E, default
// 1) when the lock is held elsewhere (-n) or the wait timed out (-w); 75 when
// the lock was lost while COMMAND ran (COMMAND was stopped); 124 when
// COMMAND ran past --hold-at-most (COMMAND was stopped); 64 for a usage
// error (bad flag, bad key text, no command); 69 when the server cannot be
// reached; 70 for any other lock error; 78 for a bad DSN; 126 and 127 when
// COMMAND cannot be run or is not found; 128+N when COMMAND was killed by
// signal N.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// Exit statuses (sysexits.h where one fits).
const (
	exitUsage       = 64  // EX_USAGE
	exitUnavailable = 69  // EX_UNAVAILABLE: server unreachable
	exitSoftware    = 70  // EX_SOFTWARE: other lock errors
	exitLost        = 75  // EX_TEMPFAIL: the lock was lost while COMMAND ran
	exitNoPerm      = 77  // EX_NOPERM: authentication failed
	exitConfig      = 78  // EX_CONFIG: bad DSN
	exitBound       = 124 // COMMAND ran past --hold-at-most (timeout(1)'s status)
	exitCannotRun   = 126
	exitNotFound    = 127
)

// exitError carries an exit status and a one-line message.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

const usage = `usage:
  sqllock run [flags] KEY -- COMMAND [ARGS...]   hold the lock KEY while COMMAND runs
  sqllock inspect [flags]                        list the advisory locks of the database
  sqllock break [flags] KEY                      free a lock left by an idle session (dry run without --yes)
  sqllock key NAME                               print the keys of NAME and the SQL to use them
  sqllock doctor [flags]                         probe the server and what is in front of it: what to use
  sqllock version                                print sqllock's version (also --version)

KEY is a number (123), a pair (1,2), or a name (hashed; --crc32 for zlib.crc32).
The connection: --dsn, else DATABASE_URL, else the PG* environment variables.
Run "sqllock COMMAND -h" for the flags of each command.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// version returns the version of the module sqllock was built from, as
// the build recorded it (info, ok are debug.ReadBuildInfo's): v1.2.3 for
// go install ...@v1.2.3, a pseudo-version or "(devel)" for a build from a
// working tree, and "(devel)" when the build recorded none.
func version(info *debug.BuildInfo, ok bool) string {
	if !ok || info == nil || info.Main.Version == "" {
		return "(devel)"
	}
	return info.Main.Version
}

// run dispatches a command line and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	var err error
	switch args[0] {
	case "run":
		err = runCmd(args[1:], stderr)
	case "inspect":
		err = inspectCmd(args[1:], stdout, stderr)
	case "break":
		err = breakCmd(args[1:], stdout, stderr)
	case "key":
		err = keyCmd(args[1:], stdout, stderr)
	case "doctor":
		err = doctorCmd(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "version", "--version", "-version":
		if len(args) > 1 {
			fmt.Fprintf(stderr, "sqllock: %s: unexpected argument %q\n", args[0], args[1])
			return exitUsage
		}
		fmt.Fprintln(stdout, "sqllock "+version(debug.ReadBuildInfo()))
		return 0
	default:
		fmt.Fprintf(stderr, "sqllock: unknown command %q\n%s", args[0], usage)
		return exitUsage
	}
	var ee *exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintln(stderr, "sqllock: "+ee.msg)
		}
		return ee.code
	default:
		fmt.Fprintln(stderr, "sqllock: "+err.Error())
		return exitSoftware
	}
}
