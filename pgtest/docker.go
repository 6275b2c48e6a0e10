package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultImage is the image the Docker path runs unless SQLLOCK_TEST_IMAGE
// names another: the official postgres image, at a pinned major version.
// Any image that honours its contract works (POSTGRES_PASSWORD,
// POSTGRES_USER, POSTGRES_DB; port 5432; a fresh cluster on first start),
// such as the one pgtest/docker/build-image.sh builds without a registry.
const DefaultImage = "postgres:16"

// The labels of the harness's containers: every one carries ownerLabel,
// the pid of the process that started it, so that a later run can tell a
// container left by a dead process from one a running process still uses.
const (
	harnessLabel = "io.github.sqllock.pgtest"
	ownerLabel   = "io.github.sqllock.pgtest.owner"
)

// docker runs the docker command and returns its standard output.
func docker(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", args[0], err, strings.TrimSpace(errb.String()))
	}
	return strings.TrimSpace(out.String()), nil
}

// startDocker runs the image (SQLLOCK_TEST_IMAGE, else DefaultImage)
// through the docker command when an engine answers. The container is
// labelled as the harness's own and removed by Close or, if this process
// ends first, however it ends, by the reaper; containers that earlier,
// dead processes left are removed first.
func startDocker(ctx context.Context) (*Server, error) {
	if _, err := exec.LookPath("docker"); err != nil {
		return nil, fmt.Errorf("no docker command: %w", err)
	}
	if _, err := docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return nil, fmt.Errorf("no Docker engine answers: %w", err)
	}
	RemoveStaleContainers(ctx)
	image := os.Getenv("SQLLOCK_TEST_IMAGE")
	if image == "" {
		image = DefaultImage
	}
	adminPW := randomHex(12)
	id, err := docker(ctx, "run", "-d", "--label", harnessLabel+"=1", "--label", ownerLabel+"="+strconv.Itoa(os.Getpid()),
		"-e", "POSTGRES_PASSWORD="+adminPW, "-p", "127.0.0.1::5432", image)
	if err != nil {
		return nil, fmt.Errorf("%w (SQLLOCK_TEST_IMAGE=%s; with no registry, build one: pgtest/docker/build-image.sh)", err, image)
	}
	reaper := reapContainer(id)
	remove := func() error {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := docker(rctx, "rm", "-f", "-v", id)
		if reaper != nil {
			reaper.Close()
		}
		return err
	}
	addr, err := docker(ctx, "port", id, "5432/tcp")
	if err != nil {
		remove()
		return nil, err
	}
	_, portText, err := net.SplitHostPort(strings.Split(addr, "\n")[0])
	if err != nil {
		remove()
		return nil, fmt.Errorf("pgtest: docker port said %q", addr)
	}
	port, _ := strconv.Atoi(portText)
	s := &Server{Host: "127.0.0.1", Port: port, adminUser: "postgres", adminPassword: adminPW, database: Role, container: id}
	s.closer = remove
	deadline := time.Now().Add(2 * time.Minute)
	for {
		db, err := sql.Open("pgx", s.AdminDSN())
		if err == nil {
			err = db.PingContext(ctx)
			db.Close()
		}
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			logs, _ := docker(context.Background(), "logs", "--tail", "20", id)
			s.Close()
			return nil, fmt.Errorf("pgtest: the container did not accept connections: %v\n%s", err, logs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := s.bootstrap(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// RemoveStaleContainers removes the harness's containers whose owner
// process is gone (left by a test binary that was killed, or that panicked
// before its cleanup), and returns how many it removed. startDocker calls
// it; it never touches a container of a process that still runs.
func RemoveStaleContainers(ctx context.Context) int {
	out, err := docker(ctx, "ps", "-a", "--filter", "label="+harnessLabel, "--format", `{{.ID}} {{.Label "`+ownerLabel+`"}}`)
	if err != nil || out == "" {
		return 0
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		id, owner, _ := strings.Cut(line, " ")
		pid, err := strconv.Atoi(owner)
		if err == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
			continue // its process still runs
		}
		if _, err := docker(ctx, "rm", "-f", "-v", id); err == nil {
			n++
		}
	}
	return n
}

// reapContainer starts a process that removes container id once this
// process is gone, however it ends (see reap), and returns the write end
// of its standard input.
func reapContainer(id string) *os.File {
	return startReaper(`cat >/dev/null; docker rm -f -v "$1" >/dev/null 2>&1`, id)
}

// errNoDocker reports why the Docker path was not taken.
var errNoDocker = errors.New("pgtest: SQLLOCK_TEST_SERVER=local")
