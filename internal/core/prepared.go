package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
)

// Prepared statements, on a blind driver's shared sessions. A driver whose
// statements with arguments cost two round trips (lib/pq: an unnamed
// prepare, then the execution) gets each key rendered into the text of its
// statement (sqltext.Inline), which the server then parses and plans every
// time: most of such a statement's cost. A shared session that has sent
// preparedAfter of its plain statements (its single-key tries and unlocks,
// its batches) sends them bound instead (sqltext.Bind), each text
// prepared on its connection the first time it is sent (a round trip, once)
// and executed from then on (one round trip, neither parsed nor planned
// again). A session that sends a few statements and idles, a cron job's,
// never prepares one. The statements are closed before the connection goes
// back to the pool: a session leaves as it came.
//
// A prepared statement runs only on the server session it was prepared on:
// one that answers that it does not exist (SQLSTATE 26000) ran on another,
// which a pooler in transaction mode put in the way; nothing ran there, and
// the session ends (ErrSessionChanged).

// preparedAfter is how many plain statements a shared session sends before
// it prepares them.
const preparedAfter = 4

// prepared is one session's prepared statements. Only the runner of the
// session's queue uses it, its statements under connMu (see withConn); the
// session's end closes them, under connMu too.
type prepared struct {
	sent  int                    // plain statements sent so far, up to preparedAfter
	stmts map[string]driver.Stmt // by text, on the session's driver connection
}

// bound reports whether the next plain statement is to be sent bound and
// prepared, and counts it.
func (pr *prepared) bound() bool {
	if pr == nil {
		return false
	}
	if pr.sent < preparedAfter {
		pr.sent++
		return false
	}
	return true
}

// run runs q, with its arguments nv, on dc: prepared on it when q has
// arguments and pr is not nil.
func (pr *prepared) run(ctx context.Context, dc any, q string, nv []driver.NamedValue) (driver.Rows, error) {
	if pr == nil || len(nv) == 0 {
		return driverQuery(ctx, dc, q, nv)
	}
	return pr.query(ctx, dc, q, nv)
}

// query runs q, with its arguments nv, on dc as a statement prepared on it
// (preparing it the first time).
func (pr *prepared) query(ctx context.Context, dc any, q string, nv []driver.NamedValue) (driver.Rows, error) {
	st, ok := pr.stmts[q]
	if !ok {
		pc, ok := dc.(driver.ConnPrepareContext)
		if !ok {
			return driverQuery(ctx, dc, q, nv)
		}
		var err error
		if st, err = pc.PrepareContext(ctx, q); err != nil {
			return nil, err
		}
		if pr.stmts == nil {
			pr.stmts = map[string]driver.Stmt{}
		}
		pr.stmts[q] = st
	}
	sq, ok := st.(driver.StmtQueryContext)
	if !ok {
		return driverQuery(ctx, dc, q, nv)
	}
	rows, err := sq.QueryContext(ctx, nv)
	if SQLState(err) == "26000" {
		// Not the server session it was prepared on: nothing ran.
		return nil, fmt.Errorf("%w (%w)", foreignSession(), err)
	}
	return rows, err
}

// close closes the statements on conn, and reports whether the server
// confirmed it (the connection is otherwise not as it came). ctx bounds it
// (see boundedRaw).
func (pr *prepared) close(ctx context.Context, blind *abandonSet, conn *sql.Conn) error {
	if pr == nil || len(pr.stmts) == 0 {
		return nil
	}
	stmts := pr.stmts
	pr.stmts = nil
	return boundedRaw(ctx, blind, conn, func(any) error {
		var errs []error
		for _, st := range stmts {
			errs = append(errs, st.Close())
		}
		return errors.Join(errs...)
	})
}
