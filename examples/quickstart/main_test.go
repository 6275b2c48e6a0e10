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

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestQuickstart runs the program as the README prints it: once with the
// lock free (it does the work), once with the lock held elsewhere (it
// backs out).
func TestQuickstart(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	bin := build(t)
	run := func() string {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
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
	cmd := exec.Command(build(t))
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

// build builds the program and returns its path.
func build(t *testing.T) string {
	t.Helper()
	bin := t.TempDir() + "/quickstart"
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
