package pgtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestJob is how an integration test of yours uses the harness.
func TestJob(t *testing.T) {
	db := pgtest.Open(t, "pgx", pgtest.Start(t).NewDatabase(t))
	var ok bool
	if err := db.QueryRowContext(context.Background(), "SELECT pg_try_advisory_xact_lock(42)").Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_try_advisory_xact_lock = %v, %v", ok, err)
	}
}

// TestOrdinaryRole: tests connect as a role without superuser rights.
func TestOrdinaryRole(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	var user string
	var super bool
	if err := db.QueryRow("SELECT current_user, usesuper FROM pg_user WHERE usename = current_user").Scan(&user, &super); err != nil {
		t.Fatal(err)
	}
	if user != pgtest.Role || super {
		t.Fatalf("tests run as %q (superuser %v), want the ordinary role %q", user, super, pgtest.Role)
	}
	if !strings.Contains(srv.DSN(), "127.0.0.1") && srv.Local() {
		t.Fatalf("DSN %q", srv.DSN())
	}
}

// TestNewDatabaseIsolated: each test's database is its own and is dropped
// at the end.
func TestNewDatabaseIsolated(t *testing.T) {
	srv := pgtest.Start(t)
	var name string
	t.Run("inner", func(t *testing.T) {
		dsn := srv.NewDatabase(t)
		name = pgtest.DatabaseOf(dsn)
		db := pgtest.Open(t, "pgx", dsn)
		if _, err := db.Exec("CREATE TABLE t (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	admin, err := srv.Admin()
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var n int
	if err := admin.QueryRow("SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database %s still exists after its test: %d, %v", name, n, err)
	}
}

// TestNoLeftoversWithoutClose: a program that starts a throwaway server and
// exits without closing it (as a test binary without pgtest.Run does) leaves
// no data directory behind.
func TestNoLeftoversWithoutClose(t *testing.T) {
	cmd := exec.Command("go", "run", "./testdata/leaver") // with local binaries, whatever this binary's server is
	cmd.Env = append(os.Environ(), "SQLLOCK_TEST_SERVER=local")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("leaver: %v", err)
	}
	base := filepath.Dir(strings.TrimPrefix(strings.TrimSpace(string(out)), "dir "))
	if !strings.Contains(base, "sqllock-pg-") {
		t.Fatalf("leaver printed %q", out)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(base); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists 15 s after its program exited", base)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// needDocker skips t unless a Docker engine answers and the image to run
// exists here (no registry is assumed). In CI, .ci/run builds the image
// and sets SQLLOCK_TEST_DOCKER=1 when an engine answers: then both are
// required, and their absence fails t.
func needDocker(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	image := os.Getenv("SQLLOCK_TEST_IMAGE")
	if image == "" {
		image = pgtest.DefaultImage
	}
	err := exec.CommandContext(ctx, "docker", "image", "inspect", image).Run()
	if err == nil {
		return
	}
	if os.Getenv("SQLLOCK_TEST_DOCKER") == "1" {
		t.Fatalf("the Docker path is expected (SQLLOCK_TEST_DOCKER=1) but image %s or the engine is missing: %v", image, err)
	}
	t.Skipf("the Docker path is not available here (no engine, or no image %s; build one with pgtest/docker/build-image.sh): %v", image, err)
}

// TestDockerNoStrayContainers: a program that starts a server through the
// Docker path and exits without closing it (as a test binary that panics
// does) leaves no container behind, and containers that dead processes
// left are removed by the next start.
func TestDockerNoStrayContainers(t *testing.T) {
	needDocker(t)
	cmd := exec.Command("go", "run", "./testdata/leaver")
	cmd.Env = append(os.Environ(), "SQLLOCK_TEST_SERVER=docker")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("leaver: %v", err)
	}
	id, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "container ")
	if !ok {
		t.Fatalf("leaver printed %q, want its container", out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := exec.Command("docker", "inspect", id).Run(); err != nil {
			break // gone
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %s still exists 30 s after its program exited", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A container whose owner is dead (a reaper that never ran: the
	// machine lost power) is removed by the next start.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	image := os.Getenv("SQLLOCK_TEST_IMAGE")
	if image == "" {
		image = pgtest.DefaultImage
	}
	created, err := exec.Command("docker", "create", "--label", "io.github.sqllock.pgtest=1",
		"--label", "io.github.sqllock.pgtest.owner="+strconv.Itoa(dead.Process.Pid), image).Output()
	if err != nil {
		t.Fatal(err)
	}
	stale := strings.TrimSpace(string(created))
	if n := pgtest.RemoveStaleContainers(context.Background()); n < 1 {
		t.Fatalf("RemoveStaleContainers removed %d, want the stale one", n)
	}
	if err := exec.Command("docker", "inspect", stale).Run(); err == nil {
		t.Fatalf("stale container %s is still there", stale)
	}
}
