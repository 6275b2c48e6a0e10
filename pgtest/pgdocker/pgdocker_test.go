package pgdocker_test

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/pgtest/pgdocker"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// TestDockerServer: with SQLLOCK_TEST_SERVER=docker, Start gives a server
// in a container, its ordinary role can connect and is no superuser, and
// the server is one the harness labelled.
func TestDockerServer(t *testing.T) {
	needDocker(t)
	t.Setenv("SQLLOCK_TEST_SERVER", "docker")
	srv := pgdocker.Start(t)
	if srv.ID() == "" && os.Getenv("SQLLOCK_TEST_DSN") == "" {
		t.Fatalf("Start gave a server with no container id")
	}
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	var super bool
	var version int
	if err := db.QueryRow("SELECT current_setting('is_superuser') = 'on', current_setting('server_version_num')::int").Scan(&super, &version); err != nil {
		t.Fatal(err)
	}
	if super {
		t.Fatalf("the test role is a superuser")
	}
	t.Logf("PostgreSQL %d in container %.12s", version, srv.ID())
	if srv.ID() != "" {
		out, err := exec.Command("docker", "inspect", "--format", `{{index .Config.Labels "io.github.sqllock.pgtest"}} {{.HostConfig.PortBindings}}`, srv.ID()).Output()
		if err != nil || !strings.HasPrefix(string(out), "1 ") || !strings.Contains(string(out), "127.0.0.1") {
			t.Fatalf("container labels and ports = %q, %v; want the harness label and a loopback port", out, err)
		}
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
		image = pgdocker.DefaultImage
	}
	err := exec.CommandContext(ctx, "docker", "image", "inspect", image).Run()
	if err == nil {
		return
	}
	if os.Getenv("SQLLOCK_TEST_DOCKER") == "1" || os.Getenv("CI") == "true" {
		t.Fatalf("the Docker path is expected (SQLLOCK_TEST_DOCKER=1 or CI=true) but image %s or the engine is missing: %v", image, err)
	}
	t.Skipf("the Docker path is not available here (no engine, or no image %s; build one with pgtest/pgdocker/build-image.sh): %v", image, err)
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
		image = pgdocker.DefaultImage
	}
	created, err := exec.Command("docker", "create", "--label", "io.github.sqllock.pgtest=1",
		"--label", "io.github.sqllock.pgtest.owner="+strconv.Itoa(dead.Process.Pid), image).Output()
	if err != nil {
		t.Fatal(err)
	}
	stale := strings.TrimSpace(string(created))
	if n := pgdocker.RemoveStale(context.Background()); n < 1 {
		t.Fatalf("RemoveStaleContainers removed %d, want the stale one", n)
	}
	if err := exec.Command("docker", "inspect", stale).Run(); err == nil {
		t.Fatalf("stale container %s is still there", stale)
	}
}
