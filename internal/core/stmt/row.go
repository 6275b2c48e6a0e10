package stmt

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
)

// errNoFastPath makes a query fall back to database/sql's own methods.
var errNoFastPath = errors.New("sqllock: driver has no QueryerContext")

// unguarded is implemented by poolguard's connection wrapper: statements
// run through WithoutGuard do not make the connection suspect. sqllock's own
// statements need no check, because a Lock's connection returns to the pool
// only after a confirmed unlock.
type unguarded interface {
	WithoutGuard(f func(driver.Conn) error) error
}

// OnDriverConn runs f on conn's driver connection, inside Conn.Raw (which
// gives f exclusive use of it), past poolguard's wrapper if there is one.
//
// sqllock runs its statements on the driver connection because database/sql
// starts a goroutine per query to watch a cancellable context, which costs a
// noticeable part of a lock and unlock cycle; the driver's own cancellation
// still applies. Errors that wrap driver.ErrBadConn make database/sql close
// the connection.
func OnDriverConn(conn *sql.Conn, f func(dc any) error) error {
	return conn.Raw(func(dc any) error {
		if g, ok := dc.(unguarded); ok {
			return g.WithoutGuard(func(inner driver.Conn) error { return f(inner) })
		}
		return f(dc)
	})
}

// DriverConnOf returns conn's driver connection (nil once conn is closed).
func DriverConnOf(conn *sql.Conn) any {
	var d any
	_ = conn.Raw(func(dc any) error { d = dc; return nil })
	return d
}

// call is one single-row statement run on a driver connection: its
// arguments and its row's values live in it, and it is run through a
// method value bound once, so that, taken from calls, the hot path
// allocates nothing of its own per statement, whatever the number of
// arguments and columns.
type call struct {
	ctx    context.Context
	prep   *Prepared // see Via.Prep
	q      string
	args   []driver.NamedValue
	vals   []driver.Value
	argBuf [3]driver.NamedValue
	valBuf [4]driver.Value
	runFn  func(dc any) error // run, bound once
}

// driverQuery runs q on a driver connection; errNoFastPath when the driver
// cannot.
func driverQuery(ctx context.Context, dc any, q string, nv []driver.NamedValue) (driver.Rows, error) {
	qc, ok := dc.(driver.QueryerContext)
	if !ok {
		return nil, errNoFastPath
	}
	if opt, ok := simpleOption(dc); ok {
		nv = withOption(opt, nv) // a pinned session's, on pgx (see the core's pinned.go)
	}
	rows, err := qc.QueryContext(ctx, q, nv)
	if errors.Is(err, driver.ErrSkip) {
		return nil, errNoFastPath
	}
	return rows, err
}

// namedValues returns args as driver arguments, in buf when they fit.
func namedValues(buf []driver.NamedValue, args []any) []driver.NamedValue {
	nv := buf[:0]
	for i, a := range args {
		nv = append(nv, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	return nv
}

// run runs the statement on the driver connection dc and reads its row.
func (c *call) run(dc any) error {
	rows, err := c.prep.run(c.ctx, dc, c.q, c.args)
	if err != nil {
		return err
	}
	if n := len(rows.Columns()); n <= len(c.valBuf) {
		c.vals = c.valBuf[:n]
	} else {
		c.vals = make([]driver.Value, n)
	}
	err = rows.Next(c.vals)
	cerr := rows.Close()
	if err == io.EOF {
		err = sql.ErrNoRows
	}
	if err == nil {
		err = cerr
	}
	return err
}

// calls are spare calls, each with its run method bound once: a statement
// takes one and gives it back, and allocates none (but one abandoned on a
// blind driver, which keeps it).
var calls = sync.Pool{New: func() any {
	c := &call{}
	c.runFn = c.run
	return c
}}

// Via is how a statement reaches a connection's driver.
type Via struct {
	Blind *AbandonSet // non-nil for a blind driver (see BoundedRaw)
	// Prep, when not nil, runs statements with arguments as statements
	// prepared on the connection (see prepared.go).
	Prep *Prepared
}

// QueryRow runs q, which returns one row, on conn and stores its columns in
// dest (each a *bool, *int64, *string, *sql.NullBool, or skip).
func QueryRow(ctx context.Context, blind *AbandonSet, conn *sql.Conn, q string, args []any, dest ...any) error {
	return QueryRowVia(ctx, Via{Blind: blind}, conn, q, args, dest...)
}

// QueryRowVia is QueryRow, the statement sent as v says.
func QueryRowVia(ctx context.Context, v Via, conn *sql.Conn, q string, args []any, dest ...any) error {
	blind := v.Blind
	c := calls.Get().(*call)
	c.ctx, c.prep, c.q = ctx, v.Prep, q
	c.args = namedValues(c.argBuf[:], args)
	err := BoundedRaw(ctx, blind, conn, c.runFn)
	if errors.Is(err, errNoFastPath) {
		if n := len(dest) - 1; n >= 0 && dest[n] == any(SkipRest) {
			dest = dest[:n] // the statement answers what is read
		}
		err = conn.QueryRowContext(ctx, q, args...).Scan(dest...)
	} else if err == nil {
		err = Assign(dest, c.vals)
	}
	// A blind driver's abandoned statement outlives the call (see
	// BoundedRaw): it keeps its call.
	if !errors.Is(err, ErrAbandoned) {
		*c = call{runFn: c.runFn}
		calls.Put(c)
	}
	return err
}

// skipColumn is a destination that ignores its column (the settings' text
// of a lock statement).
type skipColumn struct{}

// Scan implements sql.Scanner, for drivers without the fast path.
func (skipColumn) Scan(any) error { return nil }

// Skip is the destination of a column that is not read.
var Skip skipColumn

// restColumns, last among a row's destinations, reads the columns before
// it and ignores any after them: a statement whose shorter form (on a
// session set up already) answers fewer columns, read where a stand-in
// (sqllockmock) answers every form alike.
type restColumns struct{}

// SkipRest is the one restColumns.
var SkipRest restColumns

// QueryRows runs q on conn and calls row for each row's values (each an
// int64, bool, nil, string or []byte as the driver gives them).
func QueryRows(ctx context.Context, blind *AbandonSet, conn *sql.Conn, q string, args []any, row func([]driver.Value) error) error {
	return QueryRowsVia(ctx, Via{Blind: blind}, conn, q, args, row)
}

// QueryRowsVia is QueryRows, the statement sent as v says.
func QueryRowsVia(ctx context.Context, v Via, conn *sql.Conn, q string, args []any, row func([]driver.Value) error) error {
	blind := v.Blind
	nv := namedValues(nil, args)
	var g *rowGuard
	if blind != nil && ctx.Done() != nil {
		// A blind driver's statement may be abandoned (see BoundedRaw)
		// and read on: its rows stop reaching row once the call returned.
		g = &rowGuard{row: row}
		row = g.call
	}
	err := BoundedRaw(ctx, blind, conn, func(dc any) error {
		rows, err := v.Prep.run(ctx, dc, q, nv)
		if err != nil {
			return err
		}
		// Rows are closed exactly once: lib/pq's Close, called twice under
		// a cancellable context, can panic.
		vals := make([]driver.Value, len(rows.Columns()))
		for {
			err := rows.Next(vals)
			if err == io.EOF {
				return rows.Close()
			}
			if err == nil {
				err = row(vals)
			}
			if err != nil {
				rows.Close()
				return err
			}
		}
	})
	if g != nil && errors.Is(err, ErrAbandoned) {
		g.leave()
	}
	if !errors.Is(err, errNoFastPath) {
		return err
	}
	rows, err := conn.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	dv := make([]driver.Value, len(cols))
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		for i, v := range vals {
			dv[i] = v
		}
		if err := row(dv); err != nil {
			return err
		}
	}
	return rows.Err()
}

// rowGuard hands an abandoned statement's rows to row only until its
// caller left: row writes into what the caller reads once the call
// returned.
type rowGuard struct {
	mu   sync.Mutex
	row  func([]driver.Value) error
	left bool
}

// call is row, until leave.
func (g *rowGuard) call(v []driver.Value) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.left {
		return ErrAbandoned
	}
	return g.row(v)
}

// leave stops the rows, after any row being handed.
func (g *rowGuard) leave() {
	g.mu.Lock()
	g.left = true
	g.mu.Unlock()
}

func Assign(dest []any, vals []driver.Value) error {
	if n := len(dest) - 1; n >= 0 && dest[n] == any(SkipRest) && len(vals) >= n {
		dest, vals = dest[:n], vals[:n]
	}
	if len(dest) != len(vals) {
		return fmt.Errorf("sqllock: statement returned %d columns, want %d", len(vals), len(dest))
	}
	for i, v := range vals {
		switch d := dest[i].(type) {
		case *bool:
			b, ok := v.(bool)
			if !ok {
				return fmt.Errorf("sqllock: column %d is %T, want bool", i+1, v)
			}
			*d = b
		case *sql.NullBool:
			if err := d.Scan(v); err != nil {
				return err
			}
		case skipColumn:
		case *string:
			switch t := v.(type) {
			case string:
				*d = t
			case []byte:
				*d = string(t)
			default:
				return fmt.Errorf("sqllock: column %d is %T, want text", i+1, v)
			}
		case *int64:
			switch n := v.(type) {
			case int64:
				*d = n
			case int32:
				*d = int64(n)
			default:
				return fmt.Errorf("sqllock: column %d is %T, want an integer", i+1, v)
			}
		default:
			return fmt.Errorf("sqllock: cannot scan into %T", d)
		}
	}
	return nil
}
