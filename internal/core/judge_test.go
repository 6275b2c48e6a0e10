package core

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/sqllock/sqllock/internal/core/stmt"
	"github.com/sqllock/sqllock/internal/core/wait"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// TestJudge: every verdict of the one rule book for an acquisition's
// outcome, and the error that goes with it.
func TestJudge(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	live := context.Background()
	what := namer{label: "k"}
	tests := []struct {
		name      string
		ctx       context.Context
		o         wait.Outcome
		standbyOK bool
		pid       int64
		want      verdict
		errs      []error // the error matches each; none: nil
		text      string  // and contains it
	}{
		{name: "granted", ctx: live, o: wait.Outcome{OK: true, PID: 7}, want: granted},
		{name: "held elsewhere", ctx: live, o: wait.Outcome{PID: 7}, want: refused, errs: []error{stmt.ErrNotAcquired}, text: stmt.HeldElsewhere},
		{name: "granted on a standby", ctx: live, o: wait.Outcome{OK: true, Standby: true}, want: unwanted, errs: []error{stmt.ErrStandby}},
		{name: "refused on a standby", ctx: live, o: wait.Outcome{Standby: true}, want: refused, errs: []error{stmt.ErrStandby}},
		{name: "granted on an allowed standby", ctx: live, o: wait.Outcome{OK: true, Standby: true}, standbyOK: true, want: granted},
		{name: "deadlock victim", ctx: live, o: wait.Outcome{Err: sqlState("40P01")}, want: stray, errs: []error{stmt.ErrDeadlock}},
		{name: "full lock table", ctx: live, o: wait.Outcome{Err: sqlState("53200")}, want: stray, errs: []error{stmt.ErrLockTableFull}},
		{name: "lock_timeout", ctx: live, o: wait.Outcome{Err: sqlState("55P03")}, want: uncertain, errs: []error{stmt.ErrNotAcquired}},
		{name: "statement failed", ctx: live, o: wait.Outcome{Err: sqlState("XX000")}, want: uncertain, text: "internal error"},
		{name: "connection lost", ctx: live, o: wait.Outcome{Err: io.ErrUnexpectedEOF}, want: uncertain, errs: []error{io.ErrUnexpectedEOF}},
		{name: "ctx ended, answer not read in time", ctx: cancelled, o: wait.Outcome{OK: true}, want: uncertain, errs: []error{stmt.ErrNotAcquired, context.Canceled}},
		{name: "ctx ended, answer read in time", ctx: cancelled, o: wait.Outcome{OK: true, Certain: true}, want: granted},
		{name: "ctx ended, refusal read in time", ctx: cancelled, o: wait.Outcome{Certain: true}, want: refused, errs: []error{stmt.ErrNotAcquired}},
		{name: "ctx ended, abandoned", ctx: cancelled, o: wait.Outcome{Err: stmt.ErrAbandoned}, want: uncertain, errs: []error{stmt.ErrNotAcquired, stmt.ErrAbandoned}},
		{name: "server ended the wait at the deadline", ctx: live, o: wait.Outcome{Err: wait.ErrDeadline}, want: refused, errs: []error{stmt.ErrNotAcquired, context.DeadlineExceeded}},
		{name: "left the line", ctx: cancelled, o: wait.Outcome{Err: wait.ErrLeft}, want: refused, errs: []error{stmt.ErrNotAcquired, context.Canceled}},
		{name: "another backend answered", ctx: live, o: wait.Outcome{OK: true, PID: 8}, pid: 7, want: uncertain, errs: []error{stmt.ErrSessionChanged}},
		{name: "the expected backend answered", ctx: live, o: wait.Outcome{OK: true, PID: 7}, pid: 7, want: granted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := judge(tt.ctx, tt.o, what, tt.standbyOK, tt.pid)
			if v != tt.want {
				t.Errorf("verdict %d, want %d (error %v)", v, tt.want, err)
			}
			if len(tt.errs) == 0 && tt.text == "" {
				if err != nil {
					t.Errorf("error %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, target := range tt.errs {
				if !errors.Is(err, target) {
					t.Errorf("error %v does not match %v", err, target)
				}
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("error %q does not say %q", err, tt.text)
			}
		})
	}
}

// TestUnlockVerdict: the one rule book for an unlock's answer: confirmed;
// certainly not held (that lock only); uncertain (the session must end),
// lost with the session or not.
func TestUnlockVerdict(t *testing.T) {
	what := namer{label: "k"}
	tests := []struct {
		name      string
		err       error
		released  bool
		uncertain bool
		lost      bool // the error wraps ErrLockLost
		changed   bool // and ErrSessionChanged
	}{
		{name: "released", released: true},
		{name: "not held", lost: true},
		{name: "no row: another backend", err: sql.ErrNoRows, uncertain: true, lost: true, changed: true},
		{name: "session changed", err: stmt.SessionChanged(7, 8), uncertain: true, lost: true, changed: true},
		{name: "connection done", err: sql.ErrConnDone, uncertain: true, lost: true},
		{name: "connection broken", err: io.EOF, uncertain: true, lost: true},
		{name: "terminated", err: sqlState("57P01"), uncertain: true, lost: true},
		{name: "abandoned", err: stmt.ErrAbandoned, uncertain: true},
		{name: "failed", err: sqlState("XX000"), uncertain: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			uncertain, err := unlockVerdict(what, 7, tt.err, tt.released)
			if uncertain != tt.uncertain {
				t.Errorf("uncertain = %v, want %v (%v)", uncertain, tt.uncertain, err)
			}
			if (err == nil) != (tt.released && tt.err == nil) {
				t.Fatalf("error %v", err)
			}
			if err == nil {
				return
			}
			if errors.Is(err, stmt.ErrLockLost) != tt.lost || errors.Is(err, stmt.ErrSessionChanged) != tt.changed {
				t.Errorf("error %v: lost %v, changed %v; want %v, %v", err, errors.Is(err, stmt.ErrLockLost), errors.Is(err, stmt.ErrSessionChanged), tt.lost, tt.changed)
			}
		})
	}
}

// TestBatchDecode: the one decoder of batch statements reads the
// positions not granted; an answer that is not an array literal of
// positions in range, or no row (another backend), is an error and
// grants nothing.
func TestBatchDecode(t *testing.T) {
	keys := []Key{{V: 1}, {Pair: true, Class: 2, ID: 3}, {V: -4}}
	answer := func(lit string, err error) stmt.BatchQuery {
		return func(q string, args []any, dest ...any) error {
			if !strings.Contains(q, "WHERE pg_backend_pid() = 42") {
				t.Errorf("the batch runs on another backend than 42: %s", q)
			}
			if want, _, _ := sqltext.BatchArgs(nil, nil, keys, 1, true); !slices.Equal(args, want) {
				t.Errorf("arguments %v, want %v", args, want)
			}
			*dest[0].(*string) = lit
			return err
		}
	}
	for _, tt := range []struct {
		lit  string
		err  error
		want []bool
		fail error // nil: any error
		ok   bool
	}{
		{lit: "{}", want: []bool{true, true, true}, ok: true},
		{lit: "{2}", want: []bool{true, false, true}, ok: true},
		{lit: "{1,3}", want: []bool{false, true, false}, ok: true},
		{lit: "{4}", want: []bool{false, false, false}},
		{lit: "{0}", want: []bool{false, false, false}},
		{lit: "2", want: []bool{false, false, false}},
		{lit: "{x}", want: []bool{false, false, false}},
		{lit: "", err: sql.ErrNoRows, want: []bool{false, false, false}, fail: stmt.ErrSessionChanged},
		{lit: "{}", err: sqlState("53200"), want: []bool{false, false, false}},
	} {
		got, err := stmt.Batch(sqltext.Bind, answer(tt.lit, tt.err), sqltext.BatchMixed, 1, 42, keys, nil)
		if !slices.Equal(got, tt.want) || (err == nil) != tt.ok || tt.fail != nil && !errors.Is(err, tt.fail) {
			t.Errorf("answer %q (%v): %v, %v; want %v, ok %v", tt.lit, tt.err, got, err, tt.want, tt.ok)
		}
	}
}

// TestClassifications: the core's readings of errors and versions.
func TestClassifications(t *testing.T) {
	for _, tt := range []struct {
		err    error
		broken bool
	}{
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{sqlState("08006"), true},
		{sqlState("57P01"), true},
		{errors.New("write: broken pipe"), true},
		{sqlState("55P03"), false},
		{stmt.NotAcquired("k", io.EOF), false}, // an answer, whatever it wraps
		{stmt.StandbyError("k"), false},
		{errors.New("syntax"), false},
	} {
		if got := stmt.ConnectionBroken(tt.err); got != tt.broken {
			t.Errorf("ConnectionBroken(%v) = %v, want %v", tt.err, got, tt.broken)
		}
	}
	if stmt.SQLState(errors.New("ERROR: deadlock detected")) != "40P01" || stmt.SQLState(errors.New("out of shared memory")) != "53200" || stmt.SQLState(nil) != "" {
		t.Error("SQLState does not read the messages of a driver that exposes no SQLSTATE")
	}
	for code, want := range map[string]error{"40P01": stmt.ErrDeadlock, "53200": stmt.ErrLockTableFull, "55P03": stmt.ErrNotAcquired, "57014": stmt.ErrNotAcquired} {
		if err := stmt.LockError("k", sqlState(code)); !errors.Is(err, want) {
			t.Errorf("lockError(%s) = %v, want %v", code, err, want)
		}
	}
	for v, want := range map[string]int{"PostgreSQL 16.4 on x": 16, "PostgreSQL 9.6.1": 9, "PostgreSQL 17beta1": 17, "MySQL": 0} {
		if got := majorVersion(v); got != want {
			t.Errorf("majorVersion(%q) = %d, want %d", v, got, want)
		}
	}
	if err := stmt.SessionChanged(0, 5); !errors.Is(err, stmt.ErrSessionChanged) || poolerEvidence(err) {
		t.Errorf("sessionChanged(0, 5) = %v: want ErrSessionChanged, and no evidence of a pooler", err)
	}
	if err := stmt.SessionChanged(4, 5); !poolerEvidence(err) || !strings.Contains(err.Error(), "from backend 4 to 5") {
		t.Errorf("sessionChanged(4, 5) = %v: want evidence of a pooler", err)
	}
}
