package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	// The demo re-executes its own binary as candidates: here, the test
	// binary, which then runs as a candidate.
	for i, a := range os.Args {
		if a == "-candidate" && i+1 < len(os.Args) {
			os.Args = append([]string{os.Args[0]}, os.Args[i:]...)
			flag.CommandLine = flag.NewFlagSet(os.Args[0], flag.ExitOnError)
			main()
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run() = %v\n%s", err, out.String())
	}
	s := out.String()
	m := regexp.MustCompile(`leadership moved from candidate (\d) to candidate (\d)`).FindStringSubmatch(s)
	if m == nil || m[1] == m[2] || !strings.Contains(s, "lost leadership") {
		t.Fatalf("want leadership to move after the kill:\n%s", s)
	}
}
