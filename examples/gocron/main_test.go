package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out, 3*time.Second); err != nil {
		t.Fatalf("run() = %v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`runs: (\d+), most at once: (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no summary:\n%s", out.String())
	}
	runs, most := atoi(m[1]), atoi(m[2])
	if runs < 2 || most != 1 {
		t.Fatalf("runs %d, most at once %d; want at least 2 runs, never two at once:\n%s", runs, most, out.String())
	}
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
