// Package testkit holds the measuring helpers that the module's tests and
// benchmarks share: a connector that counts statements, and the
// interleaved-median method every comparison uses (compare.go).
package testkit

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// CountingConnector counts the statements its connections run through
// QueryContext and ExecContext. For statements that each take one round
// trip (sqllock's on pgx, whose extended protocol sends one Sync per
// statement), the count is the number of round trips.
//
// It also counts rows closed more than once (DoubleCloses): lib/pq can
// panic on a second Close under a cancellable context.
type CountingConnector struct {
	driver.Connector
	n, double atomic.Int64
}

// Count returns the statements run so far.
func (c *CountingConnector) Count() int64 { return c.n.Load() }

// DoubleCloses returns how many rows were closed more than once.
func (c *CountingConnector) DoubleCloses() int64 { return c.double.Load() }

// Connect implements driver.Connector.
func (c *CountingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: dc, c: c}, nil
}

type countingConn struct {
	driver.Conn
	c *CountingConnector
}

// ResetSession and IsValid pass the driver's own on: without them,
// database/sql would hand out again a connection the driver has closed
// (pgx closes one whose statement outlived its context).
func (c *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *countingConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.c.n.Add(1)
	rows, err := c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
	if err != nil {
		return nil, err
	}
	return &closeCounting{Rows: rows, double: &c.c.double}, nil
}

type closeCounting struct {
	driver.Rows
	closed bool
	double *atomic.Int64
}

func (r *closeCounting) Close() error {
	if r.closed {
		r.double.Add(1)
		return nil // not passed on: lib/pq would panic
	}
	r.closed = true
	return r.Rows.Close()
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.c.n.Add(1)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

// Waiters returns the sessions that wait for k: those waiting in the
// server for k itself, and those in k's line (holding a ticket of its
// class; see sqltext's tickets).
func Waiters(tb testing.TB, q sqllock.Querier, k sqllock.Key) int {
	tb.Helper()
	class := sqltext.TicketClass(sqlKey(k))
	locks, err := sqllock.Inspect(context.Background(), q, nil)
	if err != nil {
		tb.Fatal(err)
	}
	pids := map[int]bool{}
	for _, l := range locks {
		c, id, pair := l.Key.Pair()
		switch {
		case l.Key == k && !l.Granted:
			pids[l.PID] = true
		case pair && c == class && id != 0 && l.Granted:
			pids[l.PID] = true
		}
	}
	return len(pids)
}

// Blocked returns the sessions that wait in the server (a lock not
// granted, as pg_locks shows it) for k itself or for a ticket of its
// line: a session that holds its Locker's queued callers' places in line
// (tickets; see sqltext's PlaceSQL) waits for nothing, and is not counted
// ([sqllock.Inspect] reports a ticket as a waiter for its key).
func Blocked(tb testing.TB, q sqllock.Querier, k sqllock.Key) int {
	tb.Helper()
	sk := sqlKey(k)
	class := sqltext.TicketClass(sk)
	kc, ko, ks := int64(uint64(sk.V)>>32), int64(uint32(sk.V)), int64(1)
	if sk.Pair {
		kc, ko, ks = int64(uint32(sk.Class)), int64(uint32(sk.ID)), 2
	}
	var n int
	rows, err := q.QueryContext(context.Background(), `SELECT count(DISTINCT pid) FROM pg_catalog.pg_locks
 WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
 AND ((classid::int8 = $1 AND objid::int8 = $2 AND objsubid = $3) OR (classid::int8 = ($4::int8 & 4294967295) AND objsubid = 2 AND objid <> 0))`,
		kc, ko, ks, int64(class))
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	if !rows.Next() || rows.Scan(&n) != nil {
		tb.Fatalf("counting the sessions that wait for %v: %v", k, rows.Err())
	}
	return n
}

// WaitWaiters waits until n sessions wait for k (see Waiters), and fails
// tb after a minute: a ceiling that only ends a test whose waiters never
// come (a loaded machine takes seconds to set a wait up).
func WaitWaiters(tb testing.TB, q sqllock.Querier, k sqllock.Key, n int) {
	tb.Helper()
	const ceiling = time.Minute
	deadline := time.Now().Add(ceiling)
	for {
		waiting := Waiters(tb, q, k)
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d sessions wait for %v after %v, want %d", waiting, k, ceiling, n)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// sqlKey returns k as the statements take it.
func sqlKey(k sqllock.Key) sqltext.Key {
	c, i, pair := k.Pair()
	v, _ := k.Int64()
	return sqltext.Key{Pair: pair, V: v, Class: c, ID: i}
}

// Short reports whether the quick run was asked for: go test -short, and
// not in CI (CI=true), which always runs everything.
func Short() bool { return testing.Short() && os.Getenv("CI") != "true" }

// Long skips tb in the quick run (see Short): the long stress and fault
// tests.
func Long(tb testing.TB) {
	tb.Helper()
	if Short() {
		tb.Skip("long test: skipped under -short (CI runs it)")
	}
}

// LineOrder returns the application_name of every session that holds a
// ticket in k's line (see sqltext's tickets), in ticket order: the order
// in which they arrived by the server's clock. A session that holds two
// tickets is named twice.
func LineOrder(tb testing.TB, db *sql.DB, k sqllock.Key) []string {
	tb.Helper()
	class := sqltext.TicketClass(sqlKey(k))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := db.QueryContext(ctx, `SELECT coalesce(a.application_name, ''),
		((l.objid::int8 + 2147483648) & 4294967295) - 2147483648
		FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
		AND l.classid::int8 = ($1::int8 & 4294967295) AND l.objid <> 0
		AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())`, int64(class))
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	type ticket struct {
		name string
		id   int32
	}
	var ts []ticket
	for rows.Next() {
		var t ticket
		if err := rows.Scan(&t.name, &t.id); err != nil {
			tb.Fatal(err)
		}
		ts = append(ts, t)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	// Ticket ids wrap around: a is earlier than b when b-a is positive
	// as a 32-bit number.
	slices.SortFunc(ts, func(a, b ticket) int { return cmp.Compare(int32(uint32(a.id)-uint32(b.id)), 0) })
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.name
	}
	return names
}
