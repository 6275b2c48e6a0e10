package core

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"
)

// stubPool returns a pool of the stub driver (see blind_test.go) limited
// to limit connections.
func stubPool(t *testing.T, limit int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqllock-core-stub", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(limit)
	return db
}

// waitFor polls cond until it holds, and fails t after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: %s", what)
		}
	}
}

// TestBudgetTakesInOrder: a budget counts at most a quarter of the pool's
// limit; takes that wait for room are served in arrival order, and one
// whose ctx ends leaves the line, counting nothing.
func TestBudgetTakesInOrder(t *testing.T) {
	b := &stmt.Budget{DB: stubPool(t, 4)} // a limit of 1
	if err := b.Take(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b.TryTake() {
		t.Fatal("tryTake with the budget's one connection counted = true, want false")
	}
	done := make(chan string, 3)
	waiting := func(name string, ctx context.Context, n int) {
		t.Helper()
		go func() {
			if err := b.Take(ctx); err != nil {
				done <- name + ": " + err.Error()
				return
			}
			done <- name
		}()
		waitFor(t, name+" waits", func() bool { return b.Waiting() == n })
	}
	ctx, cancel := context.WithCancel(context.Background())
	waiting("first", context.Background(), 1)
	waiting("second", ctx, 2)
	waiting("third", context.Background(), 3)
	cancel()
	if got := <-done; got != "second: "+context.Canceled.Error() {
		t.Fatalf("after the second's ctx ended: %q, want it to leave", got)
	}
	for _, want := range []string{"first", "third"} {
		b.Give()
		if got := <-done; got != want {
			t.Fatalf("a connection given back went to %q, want %q", got, want)
		}
	}
	if n := b.Count(); n != 1 {
		t.Fatalf("count() = %d, want 1", n)
	}
}

// TestBudgetSpares: a connection given back healthy is kept as a spare
// (up to a quarter of the pool's limit), counted, for the next taker; one
// given back unhealthy goes back to the pool; spares go back to the pool
// after stmt.SpareLinger, or at once when flushed; none is kept while the pool
// is at its limit.
func TestBudgetSpares(t *testing.T) {
	db := stubPool(t, 12)
	e := &wait.Engine{DB: db, Budget: &stmt.Budget{DB: db}}
	b := e.Budget
	var conns []*sql.Conn
	for range 3 {
		conn, err := e.TakeConn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	if b.TryTake() {
		t.Fatal("a 4th on a pool of 12: tryTake = true, want false (a limit of 3)")
	}
	for _, conn := range conns[:3] {
		b.Done(conn, true)
	}
	if n, s := b.Count(), b.Spares(); n != 3 || s != 3 {
		t.Fatalf("3 given back: count() = %d, spares() = %d; want 3 and 3", n, s)
	}
	if got := b.TakeSpare(); got != conns[2] {
		t.Fatal("takeSpare did not return the spare kept last")
	}
	b.Done(conns[2], false)
	if n, s := b.Count(), b.Spares(); n != 2 || s != 2 {
		t.Fatalf("one given back unhealthy: count() = %d, spares() = %d; want 2 and 2", n, s)
	}
	if err := conns[2].PingContext(context.Background()); !errors.Is(err, sql.ErrConnDone) {
		t.Fatalf("the unhealthy one: Ping = %v, want sql.ErrConnDone (back to the pool)", err)
	}
	waitFor(t, "the spares went back to the pool", func() bool { return b.Spares() == 0 && b.Count() == 0 })
	if st := db.Stats(); st.InUse != 0 {
		t.Fatalf("with no spare: %d connections in use, want 0", st.InUse)
	}
	for range 2 {
		conn, err := e.TakeConn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b.Done(conn, true)
	}
	b.Flush() // as a Locker closes
	if n, s, inUse := b.Count(), b.Spares(), db.Stats().InUse; n != 0 || s != 0 || inUse != 0 {
		t.Fatalf("2 spares flushed: count() = %d, spares() = %d, %d connections in use; want 0, 0, 0", n, s, inUse)
	}

	full := stubPool(t, 4)
	fb := &stmt.Budget{DB: full}
	var held []*sql.Conn
	for range 4 {
		conn, err := full.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, conn)
	}
	fb.Add()
	fb.Done(held[0], true)
	if n, s := fb.Count(), fb.Spares(); n != 0 || s != 0 {
		t.Fatalf("given back on a pool at its limit: count() = %d, spares() = %d; want 0 and 0 (back to the pool)", n, s)
	}
}

// TestBudgetCountsAbandoned: a blind driver's statement left to finish
// alone keeps its connection counted until the connection is closed.
func TestBudgetCountsAbandoned(t *testing.T) {
	db := stubPool(t, 12)
	b := &stmt.Budget{DB: db}
	blind := &stmt.AbandonSet{Budget: b}
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	answer := make(chan struct{})
	err = stmt.BoundedRaw(ctx, blind, conn, func(any) error { <-answer; return nil })
	if !errors.Is(err, stmt.ErrAbandoned) {
		t.Fatalf("boundedRaw = %v, want ErrAbandoned", err)
	}
	if n := b.Count(); n != 1 {
		t.Fatalf("an abandoned statement under way: count() = %d, want 1", n)
	}
	close(answer)
	waitFor(t, "the abandoned statement's connection was closed and uncounted", func() bool { return b.Count() == 0 && !blind.Has(conn) })
}

// TestBudgetKeepWithinLimit: a connection the budget does not count (a
// waiting session's, once its wait ended) is kept as a spare only while
// the budget has room for one more within its limit: never past it.
func TestBudgetKeepWithinLimit(t *testing.T) {
	db := stubPool(t, 8) // a limit of 2, and 2 spares
	b := &stmt.Budget{DB: db}
	conn := func() *sql.Conn {
		t.Helper()
		c, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for range 2 {
		if err := b.Take(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	c := conn()
	if b.Keep(c) {
		t.Fatalf("Keep with the budget's 2 counted = true (%d counted), want false", b.Count())
	}
	c.Close()
	b.Give()
	c = conn()
	if !b.Keep(c) || b.Count() != 2 || b.Spares() != 1 {
		t.Fatalf("Keep with 1 of 2 counted: %d counted, %d spares; want it kept: 2, 1", b.Count(), b.Spares())
	}
	if got := b.TakeSpare(); got != c {
		t.Fatalf("TakeSpare = %p, want the kept connection %p", got, c)
	}
	c.Close()
	b.Give()
	b.Give()
	if n := b.Count(); n != 0 {
		t.Fatalf("%d counted at the end, want 0", n)
	}
}
