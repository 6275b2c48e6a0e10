package core

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"
	"time"
)

// stubDriver's connections run nothing: boundedRaw's statement is the
// function it is given.
type stubDriver struct{}
type stubConn struct{}

func (stubDriver) Open(string) (driver.Conn, error)  { return stubConn{}, nil }
func (stubConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("stub") }
func (stubConn) Close() error                        { return nil }
func (stubConn) Begin() (driver.Tx, error)           { return nil, errors.New("stub") }

func init() { sql.Register("sqllock-core-stub", stubDriver{}) }

// TestBoundedRawAnswerAtGraceEnd: statements of a blind driver that answer
// around the moment their caller's grace ends (abandonGrace past ctx's
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
	blind := &abandonSet{}
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
			answer := start.Add(20*time.Millisecond + abandonGrace + time.Duration(i%40-20)*50*time.Microsecond)
			err := boundedRaw(ctx, blind, conn, func(any) error {
				time.Sleep(time.Until(answer))
				return nil
			})
			if err != nil && !errors.Is(err, ErrAbandoned) {
				t.Errorf("boundedRaw() = %v", err)
			}
			late <- time.Since(start) - 20*time.Millisecond - abandonGrace
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
