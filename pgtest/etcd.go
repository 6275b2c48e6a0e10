package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Etcd is a single-node etcd server on loopback, with its data in a
// temporary directory: the store a [Patroni] cluster keeps its leader key
// and configuration in.
type Etcd struct {
	// ClientURL is where clients reach it: http://127.0.0.1:port.
	ClientURL string

	dir    string
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
	reaper *os.File
}

// findEtcd returns the path of the etcd server binary.
func findEtcd() (string, error) {
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd", nil
	}
	return "", errors.New("etcd not found on PATH or in /usr/bin (Debian: apt-get install etcd-server)")
}

// NewEtcd starts a single-node etcd server on free loopback ports, and
// waits until it answers. ctx bounds the start. The caller must Close it.
func NewEtcd(ctx context.Context) (*Etcd, error) {
	bin, err := findEtcd()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sqllock-etcd-")
	if err != nil {
		return nil, err
	}
	e := &Etcd{dir: dir}
	e.reaper = reapProcesses(dir)
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if lastErr = e.start(ctx, bin); lastErr == nil {
			return e, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	e.Close()
	return nil, lastErr
}

// start launches etcd on two ports picked now and waits until it is healthy.
func (e *Etcd) start(ctx context.Context, bin string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	client, peer := ports[0], ports[1]
	cu := "http://127.0.0.1:" + strconv.Itoa(client)
	pu := "http://127.0.0.1:" + strconv.Itoa(peer)
	data := filepath.Join(e.dir, "data")
	os.RemoveAll(data) // a failed attempt's
	logf, err := os.OpenFile(filepath.Join(e.dir, "etcd.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "--name", "pgtest", "--data-dir", data,
		"--listen-client-urls", cu, "--advertise-client-urls", cu,
		"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
		"--initial-cluster", "pgtest="+pu, "--initial-cluster-state", "new",
		"--initial-cluster-token", "pgtest-"+randomHex(4),
		"--logger", "zap", "--log-level", "warn")
	cmd.Dir = e.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r, err := hc.Get(cu + "/health"); err == nil {
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode == http.StatusOK && strings.Contains(string(b), `"true"`) {
				e.ClientURL, e.cmd, e.exited = cu, cmd, exited
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("pgtest: etcd exited: %v\n%s", err, tail(filepath.Join(e.dir, "etcd.log")))
		case <-ctx.Done():
			cmd.Process.Kill()
			<-exited
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgtest: etcd was not healthy after 30s\n%s", tail(filepath.Join(e.dir, "etcd.log")))
		}
	}
}

// Addr returns the client address, host:port.
func (e *Etcd) Addr() string { return strings.TrimPrefix(e.ClientURL, "http://") }

// Close kills the server and removes its files. It is safe to call twice.
func (e *Etcd) Close() error {
	if e.cmd != nil {
		e.cmd.Process.Kill()
		<-e.exited
		e.cmd = nil
	}
	err := os.RemoveAll(e.dir)
	if e.reaper != nil {
		e.reaper.Close()
		e.reaper = nil
	}
	return err
}

// StartEtcd starts an etcd server for tb (see [NewEtcd]), skipping tb (or
// failing it when CI=true) when etcd is not installed; it is closed when
// tb ends.
func StartEtcd(tb testing.TB) *Etcd {
	tb.Helper()
	if _, err := findEtcd(); err != nil {
		Unavailable(tb, "etcd", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := NewEtcd(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	return e
}

// reapProcesses starts a reaper (see startReaper) that, once this process
// is gone or the returned file is closed, kills every process whose
// working directory is dir or under it, and removes dir. Patroni and etcd
// run in their directories, and so does every PostgreSQL process (in its
// data directory): the postmaster that Patroni starts is not its child and
// outlives it, and a backend outlives a killed postmaster for a moment.
func reapProcesses(dir string) *os.File {
	return startReaper(`cat >/dev/null
`+killUnderScript+`
for i in 1 2 3 4 5 6 7 8 9 10; do kill_under "$1"; rm -rf "$1" 2>/dev/null; [ -e "$1" ] || exit 0; sleep 0.5; done`, dir)
}

// killUnderScript defines kill_under DIR: SIGKILL to every process whose
// working directory is DIR or under it.
const killUnderScript = `kill_under() {
  for p in /proc/[0-9]*; do
    case "$(readlink "$p/cwd" 2>/dev/null)" in
      "$1"|"$1"/*) kill -9 "${p#/proc/}" 2>/dev/null ;;
    esac
  done
}`
