package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, 300*time.Millisecond); err != nil {
		t.Fatalf("run() = %v\n%s", err, out.String())
	}
	s := out.String()
	if n := strings.Count(s, "doing work"); n != 1 {
		t.Fatalf("%d runs did the work, want 1:\n%s", n, s)
	}
	if n := strings.Count(s, "skipping"); n != 2 {
		t.Fatalf("%d runs skipped, want 2:\n%s", n, s)
	}
	m := regexp.MustCompile(`Results: \[(\w+) (\w+) (\w+)\]`).FindStringSubmatch(s)
	if m == nil || strings.Count(strings.Join(m[1:], " "), "true") != 1 {
		t.Fatalf("want Results with exactly one true:\n%s", s)
	}
}
