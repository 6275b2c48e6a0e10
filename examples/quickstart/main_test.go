package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// asProgram, set in a process's environment, makes this test binary run
// as the program: the tests run it so, rather than build it (a link of
// the program took most of the quick run's time here on a loaded machine).
const asProgram = "QUICKSTART_AS_PROGRAM"

func TestMain(m *testing.M) {
	if os.Getenv(asProgram) != "" {
		main()
		os.Exit(0)
	}
	os.Exit(pgtest.Run(m))
}

// TestQuickstart runs the program as the README prints it: once with the
// lock free (it does the work), once with the lock held elsewhere (it
// backs out).
func TestQuickstart(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	run := func() string {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), asProgram+"=1", "DATABASE_URL="+dsn)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("quickstart: %v\n%s", err, out.String())
		}
		return out.String()
	}
	if out := run(); !strings.Contains(out, "reindexing posts") {
		t.Fatalf("with the lock free: %q", out)
	}
	lk, err := sqllock.New(pgtest.Open(t, "pgx", dsn)).Lock(context.Background(), sqllock.Hash("cron:reindex_posts"))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(context.Background())
	if out := run(); !strings.Contains(out, "another reindex is running: skipping") {
		t.Fatalf("with the lock held: %q", out)
	}
}

// TestQuickstartNoSetup runs the program as README.md says every example
// runs, `go run ./examples/quickstart` with DATABASE_URL unset: it starts
// a throwaway PostgreSQL and does the work (it failed, connecting to the
// default socket).
func TestQuickstartNoSetup(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = []string{asProgram + "=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "reindexing posts") {
		t.Fatalf("quickstart without DATABASE_URL: %v\n%s", err, out)
	}
}
