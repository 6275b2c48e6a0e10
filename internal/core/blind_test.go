package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"
)

// stubDriver's connections run nothing of a server's: stmt.BoundedRaw's
// statement is the function it is given, and a query's rows come 40 ms
// apart, whatever the context (a blind driver on a slow link).
type stubDriver struct{}
type stubConn struct{}
type slowRows struct{ left int }

func (stubDriver) Open(string) (driver.Conn, error)  { return stubConn{}, nil }
func (stubConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("stub") }
func (stubConn) Close() error                        { return nil }
func (stubConn) Begin() (driver.Tx, error)           { return nil, errors.New("stub") }

func init() { sql.Register("sqllock-core-stub", stubDriver{}) }

// TestBoundedRawAnswerAtGraceEnd: statements of a blind driver that answer
// around the moment their caller's grace ends (stmt.AbandonGrace past ctx's
// end) each return to their caller, by the grace's end plus a margin,
// answered or abandoned, and no worker is left stuck.
func TestBoundedRawAnswerAtGraceEnd(t *testing.T) {
	db, err := sql.Open("sqllock-core-stub", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const calls = 200
	db.SetMaxOpenConns(calls)
	blind := &stmt.AbandonSet{}
	var wg sync.WaitGroup
	late := make(chan time.Duration, calls)
	for i := range calls {
		conn, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			start := time.Now()
			// Answers spread over ±1 ms around the grace's end.
			answer := start.Add(20*time.Millisecond + stmt.AbandonGrace + time.Duration(i%40-20)*50*time.Microsecond)
			err := stmt.BoundedRaw(ctx, blind, conn, func(any) error {
				time.Sleep(time.Until(answer))
				return nil
			})
			if err != nil && !errors.Is(err, stmt.ErrAbandoned) {
				t.Errorf("boundedRaw() = %v", err)
			}
			late <- time.Since(start) - 20*time.Millisecond - stmt.AbandonGrace
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("%d of %d calls still running 5 s after their grace ended", calls-len(late), calls)
	}
	close(late)
	var worst time.Duration
	for d := range late {
		worst = max(worst, d)
	}
	if worst > time.Second {
		t.Fatalf("a call returned %v after its grace ended", worst)
	}
	t.Logf("%d calls, the last returned %v after its grace ended", calls, worst)
}

func (stubConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	return &slowRows{left: 15}, nil
}

func (*slowRows) Columns() []string { return []string{"n"} }
func (*slowRows) Close() error      { return nil }
func (r *slowRows) Next(dest []driver.Value) error {
	if r.left == 0 {
		return io.EOF
	}
	time.Sleep(40 * time.Millisecond)
	r.left--
	dest[0] = int64(r.left)
	return nil
}

// TestAbandonedRowsStopAtReturn: a blind driver's statement whose caller
// left (abandoned, its rows still coming) hands no row to the caller's
// function after the call returned: that function writes what the caller
// reads then (a batch's answers).
func TestAbandonedRowsStopAtReturn(t *testing.T) {
	db, err := sql.Open("sqllock-core-stub", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	var returned atomic.Bool
	var afterReturn atomic.Int32
	var got []int64 // written by row, read once the call returned
	err = stmt.QueryRows(ctx, &stmt.AbandonSet{}, conn, "SELECT", nil, func(v []driver.Value) error {
		if returned.Load() {
			afterReturn.Add(1)
		}
		got = append(got, v[0].(int64))
		return nil
	})
	returned.Store(true)
	if !errors.Is(err, stmt.ErrAbandoned) {
		t.Fatalf("queryRows() = %v, want ErrAbandoned", err)
	}
	n := len(got)
	time.Sleep(400 * time.Millisecond) // the rows that would still come
	if a := afterReturn.Load(); a != 0 || len(got) != n {
		t.Fatalf("%d rows handed after the call returned (%d before)", a, n)
	}
	t.Logf("%d rows before the call returned, none after", n)
}
