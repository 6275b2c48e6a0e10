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
		"pgx: advisory locks left: 0; checks ",
		"lib/pq: advisory locks left: 0; checks ",
		"leaks 1, discarded 1",
		`kept 1 advisory lock(s) (key 1001 exclusive held); policy discard; last statement "SELECT pg_advisory_lock(1001)"`,
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}
