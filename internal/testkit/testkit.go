// Package testkit holds the measuring helpers that the module's tests and
// benchmarks share: a connector that counts statements, and the
// interleaved-median method every comparison uses (compare.go).
package testkit

import (
	"context"
	"database/sql/driver"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
)

// CountingConnector counts the statements its connections run through
// QueryContext and ExecContext. For statements that each take one round
// trip (sqllock's on pgx, whose extended protocol sends one Sync per
// statement), the count is the number of round trips.
type CountingConnector struct {
	driver.Connector
	n atomic.Int64
}

// Count returns the statements run so far.
func (c *CountingConnector) Count() int64 { return c.n.Load() }

// Connect implements driver.Connector.
func (c *CountingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: dc, n: &c.n}, nil
}

type countingConn struct {
	driver.Conn
	n *atomic.Int64
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	c.n.Add(1)
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.n.Add(1)
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

// WaitWaiters waits until at least n sessions wait for k (as Inspect sees
// them through q), and fails tb after 10 s.
func WaitWaiters(tb testing.TB, q sqllock.Querier, k sqllock.Key, n int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		locks, err := sqllock.Inspect(context.Background(), q, sqllock.WithKeys(k))
		if err != nil {
			tb.Fatal(err)
		}
		waiting := 0
		for _, l := range locks {
			if !l.Granted {
				waiting++
			}
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d sessions wait for %v after 10 s, want %d", waiting, k, n)
		}
		time.Sleep(200 * time.Microsecond)
	}
}
