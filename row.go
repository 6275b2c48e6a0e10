package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
)

// errNoFastPath makes queryRow fall back to database/sql's QueryRowContext.
var errNoFastPath = errors.New("sqllock: driver has no QueryerContext")

// queryRow runs q, which returns one row, on conn and stores its columns in
// dest (each a *bool, *int64 or *sql.NullBool).
//
// It runs the query on the driver connection itself, inside Conn.Raw, when
// the driver offers QueryerContext: database/sql would start a goroutine per
// query to watch a cancellable context, which costs about a fifth of a lock
// and unlock cycle; the driver's own cancellation still applies. Errors that
// wrap driver.ErrBadConn make database/sql close the connection.
func queryRow(ctx context.Context, conn *sql.Conn, q string, args []any, dest ...any) error {
	err := conn.Raw(func(dc any) error {
		if g, ok := dc.(unguarded); ok {
			return g.WithoutGuard(func(inner driver.Conn) error { return queryDriver(ctx, inner, q, args, dest) })
		}
		return queryDriver(ctx, dc, q, args, dest)
	})
	if errors.Is(err, errNoFastPath) {
		return conn.QueryRowContext(ctx, q, args...).Scan(dest...)
	}
	return err
}

// unguarded is implemented by poolguard's connection wrapper: statements
// run through WithoutGuard do not make the connection suspect. sqllock's own
// statements need no check, because a Lock's connection returns to the pool
// only after a confirmed unlock.
type unguarded interface {
	WithoutGuard(f func(driver.Conn) error) error
}

func queryDriver(ctx context.Context, dc any, q string, args []any, dest []any) error {
	qc, ok := dc.(driver.QueryerContext)
	if !ok {
		return errNoFastPath
	}
	nv := make([]driver.NamedValue, len(args))
	for i, a := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
	}
	rows, err := qc.QueryContext(ctx, q, nv)
	if errors.Is(err, driver.ErrSkip) {
		return errNoFastPath
	}
	if err != nil {
		return err
	}
	vals := make([]driver.Value, len(rows.Columns()))
	err = rows.Next(vals)
	cerr := rows.Close()
	if err == io.EOF {
		err = sql.ErrNoRows
	}
	if err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return assign(dest, vals)
}

func assign(dest []any, vals []driver.Value) error {
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

// queryRows runs q on conn and calls row for each row's values (each an
// int64, bool, nil, string or []byte as the driver gives them). Like
// queryRow, it runs on the driver connection when it can.
func queryRows(ctx context.Context, conn *sql.Conn, q string, args []any, row func([]driver.Value) error) error {
	run := func(dc any) error {
		qc, ok := dc.(driver.QueryerContext)
		if !ok {
			return errNoFastPath
		}
		nv := make([]driver.NamedValue, len(args))
		for i, a := range args {
			nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
		}
		rows, err := qc.QueryContext(ctx, q, nv)
		if errors.Is(err, driver.ErrSkip) {
			return errNoFastPath
		}
		if err != nil {
			return err
		}
		defer rows.Close()
		vals := make([]driver.Value, len(rows.Columns()))
		for {
			if err := rows.Next(vals); err == io.EOF {
				return rows.Close()
			} else if err != nil {
				return err
			}
			if err := row(vals); err != nil {
				return err
			}
		}
	}
	err := conn.Raw(func(dc any) error {
		if g, ok := dc.(unguarded); ok {
			return g.WithoutGuard(func(inner driver.Conn) error { return run(inner) })
		}
		return run(dc)
	})
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
