package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run() = %v\n%s", err, out.String())
	}
	s := out.String()
	if strings.Count(s, "applied 3 migration(s)") != 1 || strings.Count(s, "applied 0 migration(s)") != 2 {
		t.Fatalf("want one deploy to apply 3 migrations and two to apply none:\n%s", s)
	}
	if !strings.Contains(s, "schema version: 3") {
		t.Fatalf("want schema version 3:\n%s", s)
	}
}
