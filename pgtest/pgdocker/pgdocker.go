// Package pgdocker is pgtest's Docker path: a throwaway PostgreSQL in a
// container, started through the Docker engine's API with
// github.com/ory/dockertest/v3 (it honours DOCKER_HOST and retries until
// the server answers).
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
//
//	func TestJob(t *testing.T) {
//		db := pgtest.Open(t, "pgx", pgdocker.Start(t).NewDatabase(t))
//		...
//	}
//
// [Start] and [Embedded] follow pgtest's order (SQLLOCK_TEST_DSN, then local
// binaries, then a container; SQLLOCK_TEST_SERVER=docker goes straight to
// the container). The image is SQLLOCK_TEST_IMAGE, default [DefaultImage];
// with no registry, build-image.sh beside this file builds one from a
// Debian suite (bullseye: PostgreSQL 13, bookworm 15, trixie 17, sid 18).
//
// Containers carry a label naming them the harness's own and the pid of
// their owner: [pgtest.Server.Close] removes one, a reaper process removes
// it when its owner exits without Close (a panic, os.Exit, a kill), and
// every start removes those whose owner is gone ([RemoveStale]). Where no
// docker command is installed for the reaper, the container expires after
// [Expiry] instead.
//
// pgdocker is a module of its own so that Docker's client libraries stay
// out of the module graph of programs that use sqllock and pgtest:
//
//	go get github.com/sqllock/sqllock/pgtest/pgdocker
package pgdocker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"

	"github.com/sqllock/sqllock/pgtest"
)

// DefaultImage is the image run unless SQLLOCK_TEST_IMAGE names another:
// the official postgres image, at a pinned major version. Any image that
// honours its contract works (POSTGRES_PASSWORD; port 5432; a fresh
// cluster on first start), such as the ones build-image.sh builds.
const DefaultImage = "postgres:16"

// Expiry is how long a container lives at most when no docker command can
// remove it after its owner dies (the engine kills it then).
const Expiry = time.Hour

// The labels of the harness's containers: every one carries ownerLabel,
// the pid of the process that started it, so that a later run can tell a
// container left by a dead process from one a running process still uses.
const (
	harnessLabel = "io.github.sqllock.pgtest"
	ownerLabel   = "io.github.sqllock.pgtest.owner"
)

// Start returns the test binary's shared server as [pgtest.Start] does,
// with a container as the last resort.
func Start(tb testing.TB) *pgtest.Server {
	tb.Helper()
	return pgtest.StartWith(tb, Provider)
}

// Embedded starts a throwaway server outside tests, as [pgtest.Embedded]
// does, with a container as the last resort. The caller must Close it.
func Embedded(ctx context.Context) (*pgtest.Server, error) {
	return pgtest.EmbeddedWith(ctx, Provider)
}

// Provider runs the image in a container when a Docker engine answers, and
// returns its server once it accepts connections. It is a
// [pgtest.Provider].
func Provider(ctx context.Context) (*pgtest.Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, fmt.Errorf("pgdocker: %w", err)
	}
	if err := pool.Client.PingWithContext(ctx); err != nil {
		return nil, fmt.Errorf("pgdocker: no Docker engine answers: %w", err)
	}
	RemoveStale(ctx)
	image := os.Getenv("SQLLOCK_TEST_IMAGE")
	if image == "" {
		image = DefaultImage
	}
	repo, tag := splitImage(image)
	password := randomHex(12)
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository:   repo,
		Tag:          tag,
		Env:          []string{"POSTGRES_PASSWORD=" + password},
		Labels:       map[string]string{harnessLabel: "1", ownerLabel: strconv.Itoa(os.Getpid())},
		ExposedPorts: []string{"5432/tcp"},
		PortBindings: map[docker.Port][]docker.PortBinding{"5432/tcp": {{HostIP: "127.0.0.1"}}},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = false
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("pgdocker: run %s: %w (with no registry, build the image: pgtest/pgdocker/build-image.sh)", image, err)
	}
	id := res.Container.ID
	reaper := startReaper(id)
	if reaper == nil {
		_ = res.Expire(uint(Expiry / time.Second))
	}
	remove := func() error {
		err := pool.Purge(res)
		if reaper != nil {
			reaper.Close()
		}
		return err
	}
	host, portText, err := net.SplitHostPort(res.GetHostPort("5432/tcp"))
	port, perr := strconv.Atoi(portText)
	if err != nil || perr != nil {
		remove()
		return nil, fmt.Errorf("pgdocker: container %s publishes no port 5432: %q", id, res.GetHostPort("5432/tcp"))
	}
	if host == "" || host == "0.0.0.0" || host == "localhost" {
		host = "127.0.0.1"
	}
	// The engine's retry loop: the entrypoint makes the cluster first.
	pool.MaxWait = 2 * time.Minute
	if err := pool.Retry(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(host, portText), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		remove()
		return nil, fmt.Errorf("pgdocker: container %s: the port never opened: %w", id, err)
	}
	return pgtest.Attach(ctx, host, port, "postgres", password, id, remove)
}

// RemoveStale removes the harness's containers whose owner process is gone
// (left by a test binary that was killed, or that panicked before its
// cleanup), and returns how many it removed. Provider calls it; it never
// touches a container of a process that still runs.
func RemoveStale(ctx context.Context) int {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return 0
	}
	cs, err := pool.Client.ListContainers(docker.ListContainersOptions{
		All: true, Filters: map[string][]string{"label": {harnessLabel}}, Context: ctx,
	})
	if err != nil {
		return 0
	}
	n := 0
	for _, c := range cs {
		pid, err := strconv.Atoi(c.Labels[ownerLabel])
		if err == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
			continue // its process still runs
		}
		err = pool.Client.RemoveContainer(docker.RemoveContainerOptions{ID: c.ID, Force: true, RemoveVolumes: true, Context: ctx})
		if err == nil {
			n++
		}
	}
	return n
}

// startReaper starts a shell that removes container id once this process
// is gone, however it ends: it reads its standard input to the end, and
// only this process holds the write end, which it returns (closing it
// removes the container at once). It returns nil when there is no docker
// command to remove it with.
func startReaper(id string) *os.File {
	if _, err := exec.LookPath("docker"); err != nil {
		return nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", `cat >/dev/null; docker rm -f -v "$1" >/dev/null 2>&1`, "pgdocker-reaper", id)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not stopped by the terminal's Ctrl-C with us
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil
	}
	go cmd.Wait()
	return w
}

// splitImage splits "repo[:tag]" (the repository may name a registry with
// a port) into its repository and tag ("latest" when none).
func splitImage(image string) (repo, tag string) {
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return image, "latest"
	}
	return image[:i], image[i+1:]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
