package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func TestRun(t *testing.T) {
	pgtest.Start(t) // fails in CI, skips elsewhere, when no PostgreSQL can be had
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run() = %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{
		"sqllock.acquisitions{sqllock.outcome=acquired} = 1",
		"sqllock.acquisitions{sqllock.outcome=not_acquired} = 2",
		"sqllock.locks.held{} = 0",
		"spans: 3",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}
