package core

import (
	"database/sql"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// scratch is what a session's single-key statements are built from and
// read into, made once per session, so that such a statement allocates
// nothing of its own. Used by one caller at a time.
type scratch struct {
	args [4]any // a statement's arguments
	keys [1]Key // a single unlock's key

	// The answers: an unlock's (ok); a try's (got), and, on a session
	// not set up yet, its backend (gotPid) and whether that is a standby.
	ok      bool
	got     sql.NullBool
	gotPid  int64
	standby bool

	mark, pid any   // the session's mark and pid as arguments, made once
	pidOf     int64 // the pid in pid

	// A batch's operations by kind (run), and the keys of its statement
	// of many (runTries, runMixed): kept for the next batch, emptied.
	tries, unlocks, alives []*op
	batchKeys              []Key
	batch                  stmt.BatchBufs // a batch statement's parts
	one                    [1]*op         // runSole's batch
}

// markArg returns mark (the session's, which never changes) as an
// argument.
func (sc *scratch) markArg(mark string) any {
	if sc.mark == nil {
		sc.mark = mark
	}
	return sc.mark
}

// pidArg returns pid as an argument, made again only when it changed.
func (sc *scratch) pidArg(pid int64) any {
	if sc.pid == nil || sc.pidOf != pid {
		sc.pid, sc.pidOf = pid, pid
	}
	return sc.pid
}
