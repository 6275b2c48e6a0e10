package sqllock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
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

// onDriverConn runs f on conn's driver connection, inside Conn.Raw (which
// gives f exclusive use of it), past poolguard's wrapper if there is one.
//
// sqllock runs its statements on the driver connection because database/sql
// starts a goroutine per query to watch a cancellable context, which costs a
// noticeable part of a lock and unlock cycle; the driver's own cancellation
// still applies. Errors that wrap driver.ErrBadConn make database/sql close
// the connection.
func onDriverConn(conn *sql.Conn, f func(dc any) error) error {
	return conn.Raw(func(dc any) error {
		if g, ok := dc.(unguarded); ok {
			return g.WithoutGuard(func(inner driver.Conn) error { return f(inner) })
		}
		return f(dc)
	})
}

// driverConnOf returns conn's driver connection (nil once conn is closed).
func driverConnOf(conn *sql.Conn) any {
	var d any
	_ = conn.Raw(func(dc any) error { d = dc; return nil })
	return d
}

// errAbandoned reports a statement that outlived its context on a driver
// that does not give up a read when its context ends (lib/pq, on a network
// that stopped answering): the caller got its answer at the context's end,
// and the connection is closed, as discarded, once the statement returns.
// The caller must not use the connection again.
var errAbandoned = errors.New("sqllock: no answer from the server by the end of the context; the connection is discarded when the statement returns")

// abandonGrace is how long past its context's end a statement on a blind
// driver gets before it is abandoned.
const abandonGrace = 250 * time.Millisecond

// abandonSet holds the connections whose statements were abandoned (see
// boundedRaw) until they are closed; a Locker of a blind driver has one.
type abandonSet struct{ conns sync.Map } // *sql.Conn → struct{}

// has reports whether conn was abandoned and is not closed yet: it must
// not be touched (a discard would wait for its statement).
func (a *abandonSet) has(conn *sql.Conn) bool {
	if a == nil {
		return false
	}
	_, ok := a.conns.Load(conn)
	return ok
}

// boundedRaw is onDriverConn, except that for a blind driver (blind is
// non-nil: one that does not give up a read when ctx ends) it returns,
// shortly after ctx ends, whether f has returned or not. Then it returns
// an error wrapping errAbandoned and ctx's error, records conn in blind,
// and f's connection is closed once f returns.
func boundedRaw(ctx context.Context, blind *abandonSet, conn *sql.Conn, f func(dc any) error) error {
	if blind == nil || ctx.Done() == nil {
		return onDriverConn(conn, f)
	}
	_, err := leaveAtEnd(ctx,
		func(left func() bool) (struct{}, error) {
			return struct{}{}, onDriverConn(conn, func(dc any) error {
				err := f(dc)
				if left() {
					return driver.ErrBadConn // database/sql closes the connection
				}
				return err
			})
		},
		func() { blind.conns.Store(conn, struct{}{}) },
		func(struct{}, error) {
			conn.Close()
			blind.conns.Delete(conn)
		})
	return err
}

// getConn is db.Conn, bounded like boundedRaw for a blind driver: lib/pq
// opened with sql.Open dials and logs in with no context at all (about two
// minutes of SYN retries when the server stopped answering). A connection
// that comes after the caller left goes back to the pool.
func getConn(ctx context.Context, blind *abandonSet, db *sql.DB) (*sql.Conn, error) {
	if blind == nil || ctx.Done() == nil {
		return db.Conn(ctx)
	}
	return leaveAtEnd(ctx,
		func(func() bool) (*sql.Conn, error) { return db.Conn(ctx) },
		func() {},
		func(conn *sql.Conn, err error) {
			if err == nil {
				conn.Close()
			}
		})
}

// leaveAtEnd runs work in a goroutine and returns its result, or, when it
// has not returned abandonGrace after ctx ended, an error wrapping
// errAbandoned and ctx's error. Leaving calls onLeave; work can ask whether
// its caller left (left); a result that comes after the caller left goes
// to cleanup. onLeave and cleanup never overlap the decision to leave.
func leaveAtEnd[T any](ctx context.Context, work func(left func() bool) (T, error), onLeave func(), cleanup func(T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	var mu sync.Mutex
	gone := false // guarded by mu: the caller left
	left := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return gone
	}
	res := make(chan result, 1)
	go func() {
		v, err := work(left)
		mu.Lock()
		defer mu.Unlock()
		if gone {
			cleanup(v, err)
			return
		}
		res <- result{v, err}
	}()
	select {
	case r := <-res:
		return r.v, r.err
	case <-ctx.Done():
	}
	select {
	case r := <-res:
		return r.v, r.err
	case <-time.After(abandonGrace):
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-res:
		return r.v, r.err
	default:
		gone = true
		onLeave()
		var zero T
		return zero, fmt.Errorf("%w: %w", errAbandoned, ctx.Err())
	}
}

// call is one single-row statement run on a driver connection: its
// arguments and its row's values live in one allocation, and it is run
// through a method value, so that the hot path allocates twice per
// statement, whatever the number of arguments and columns.
type call struct {
	ctx    context.Context
	q      string
	suffix func(dc any) string
	done   func(dc any)
	args   []driver.NamedValue
	vals   []driver.Value
	argBuf [3]driver.NamedValue
	valBuf [3]driver.Value
}

// driverQuery runs q on a driver connection; errNoFastPath when the driver
// cannot.
func driverQuery(ctx context.Context, dc any, q string, nv []driver.NamedValue) (driver.Rows, error) {
	qc, ok := dc.(driver.QueryerContext)
	if !ok {
		return nil, errNoFastPath
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
	q, suffix := c.q, ""
	if c.suffix != nil {
		suffix = c.suffix(dc)
		q += suffix
	}
	rows, err := driverQuery(c.ctx, dc, q, c.args)
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
	if err != nil {
		return err
	}
	if c.done != nil && suffix != "" {
		c.done(dc)
	}
	return nil
}

// queryRow runs q, which returns one row, on conn and stores its columns in
// dest (each a *bool, *int64 or *sql.NullBool).
func queryRow(ctx context.Context, blind *abandonSet, conn *sql.Conn, q string, args []any, dest ...any) error {
	return queryRowSuffix(ctx, blind, conn, q, nil, nil, args, dest...)
}

// queryRowSuffix is queryRow with suffix(dc) appended to q for the driver
// connection dc it runs on, and done called with dc when the statement,
// with a non-empty suffix, succeeded (both may be nil). Without a fast path, suffix gets nil.
func queryRowSuffix(ctx context.Context, blind *abandonSet, conn *sql.Conn, q string, suffix func(dc any) string, done func(dc any), args []any, dest ...any) error {
	c := &call{ctx: ctx, q: q, suffix: suffix, done: done}
	c.args = namedValues(c.argBuf[:], args)
	err := boundedRaw(ctx, blind, conn, c.run)
	if errors.Is(err, errNoFastPath) {
		if suffix != nil {
			q += suffix(nil)
		}
		return conn.QueryRowContext(ctx, q, args...).Scan(dest...)
	}
	if err != nil {
		return err
	}
	return assign(dest, c.vals)
}

// queryRows runs q on conn and calls row for each row's values (each an
// int64, bool, nil, string or []byte as the driver gives them).
func queryRows(ctx context.Context, blind *abandonSet, conn *sql.Conn, q string, args []any, row func([]driver.Value) error) error {
	nv := namedValues(nil, args)
	err := boundedRaw(ctx, blind, conn, func(dc any) error {
		rows, err := driverQuery(ctx, dc, q, nv)
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
