package pgtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Standby starts a hot standby of a local server, streaming from it
// (pg_basebackup -R). The caller must Close it.
func (s *Server) Standby(ctx context.Context) (*Server, error) {
	if s.local == nil {
		return nil, errNotLocal
	}
	c, _, err := newCluster(ctx, "standby", func(c *cluster) error {
		return c.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", s.adminUser,
			"-D", c.data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	})
	if err != nil {
		return nil, err
	}
	st := &Server{Host: "127.0.0.1", Port: c.port, adminUser: s.adminUser, adminPassword: s.adminPassword,
		password: s.password, local: c, database: s.database}
	st.closer = c.destroy
	return st, nil
}

// Private starts a server of tb's own (not the shared one), for tests that
// stop or restart it. It is closed when tb ends.
func Private(tb testing.TB) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := startLocal(ctx)
	if err != nil {
		Unavailable(tb, "local PostgreSQL binaries", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// PrivateInPIDNamespace is Private, with the server in a PID namespace of
// its own, as in a container: its backends' pids start from 1, so two such
// servers give the same pids to their sessions in the same order. It needs
// root; without it, it skips (or fails when CI=true).
func PrivateInPIDNamespace(tb testing.TB) *Server {
	tb.Helper()
	if os.Geteuid() != 0 {
		Unavailable(tb, "root (for a PID namespace)", errors.New("not running as root"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := startLocalWith(ctx, true)
	if err != nil {
		Unavailable(tb, "local PostgreSQL binaries in a PID namespace", err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// StartStandby starts a standby of s for tb, skipping (or failing when
// CI=true) when that is impossible; it is closed when tb ends.
func StartStandby(tb testing.TB, s *Server) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := s.Standby(ctx)
	if err != nil {
		Unavailable(tb, "a streaming standby", err)
	}
	tb.Cleanup(func() { st.Close() })
	return st
}

// Bouncer is a PgBouncer in front of a local server.
type Bouncer struct {
	Host string
	Port int
	Mode string // "transaction" or "session"

	s    *Server
	dir  string
	cmd  *exec.Cmd
	done chan error

	closeOnce sync.Once
	closeErr  error // the first Close's result
}

// findPgBouncer returns the path of the pgbouncer binary.
func findPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgbouncer not found on PATH or in /usr/sbin (Debian: apt-get install pgbouncer)")
}

// PgBouncer starts a PgBouncer in mode ("transaction" or "session") in
// front of a local server, with poolSize server connections per database.
// The caller must Close it.
func (s *Server) PgBouncer(ctx context.Context, mode string, poolSize int) (*Bouncer, error) {
	if s.local == nil {
		return nil, errNotLocal
	}
	bin, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sqllock-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &Bouncer{Host: "127.0.0.1", Mode: mode, s: s, dir: dir}
	cred := s.local.cred
	if cred != nil {
		os.Chown(dir, int(cred.Uid), int(cred.Gid))
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if b.Port, err = freePort(); err != nil {
			break
		}
		ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
admin_users = %s
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
logfile = %s
pidfile = %s
`, s.Port, b.Port, filepath.Join(dir, "users.txt"), mode, poolSize, s.adminUser, filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
		users := fmt.Sprintf("%q \"\"\n%q \"\"\n", Role, s.adminUser)
		for name, body := range map[string]string{"pgbouncer.ini": ini, "users.txt": users} {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				return nil, err
			}
		}
		if lastErr = b.start(ctx, bin, cred); lastErr == nil {
			return b, nil
		}
	}
	os.RemoveAll(dir)
	if lastErr == nil {
		lastErr = err
	}
	return nil, lastErr
}

func (b *Bouncer) start(ctx context.Context, bin string, cred *syscall.Credential) error {
	cmd := exec.Command(bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Dir = b.dir
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(b.Host, strconv.Itoa(b.Port)), time.Second)
		if err == nil {
			c.Close()
			b.cmd, b.done = cmd, done
			return nil
		}
		select {
		case err := <-done:
			return fmt.Errorf("pgtest: pgbouncer exited: %v\n%s", err, tail(filepath.Join(b.dir, "pgbouncer.log")))
		case <-ctx.Done():
			cmd.Process.Kill()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			return fmt.Errorf("pgtest: pgbouncer did not listen in 20s")
		}
	}
}

// DSNFor returns a URL for Role on database db through the bouncer.
func (b *Bouncer) DSNFor(db string) string {
	return dsn(Role, b.s.password, b.Host, b.Port, db)
}

// Admin runs command on the bouncer's admin console (its "pgbouncer"
// database), as the server's superuser: KILL db (drop every client and
// server connection of db at once; its new clients wait for RESUME db),
// RESUME db, RECONNECT db (close each server connection of db once it is
// released), RELOAD, and the SHOW commands (whose rows it drops).
func (b *Bouncer) Admin(ctx context.Context, command string) error {
	// The console speaks only the simple query protocol.
	db, err := sql.Open("pgx", dsn(b.s.adminUser, b.s.adminPassword, b.Host, b.Port, "pgbouncer")+"&default_query_exec_mode=simple_protocol")
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, command)
	return err
}

// Close stops the bouncer and removes its files. It may be called more
// than once (StartPgBouncer's cleanup calls it too): later calls return
// the first one's result.
func (b *Bouncer) Close() error {
	b.closeOnce.Do(func() { b.closeErr = b.close() })
	return b.closeErr
}

func (b *Bouncer) close() error {
	if b.cmd != nil {
		b.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-b.done:
		case <-time.After(5 * time.Second):
			b.cmd.Process.Kill()
			<-b.done
		}
	}
	return os.RemoveAll(b.dir)
}

// StartPgBouncer starts a PgBouncer for tb (see Server.PgBouncer), skipping
// (or failing when CI=true) when PgBouncer is missing; it is closed when tb
// ends.
func StartPgBouncer(tb testing.TB, s *Server, mode string, poolSize int) *Bouncer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := s.PgBouncer(ctx, mode, poolSize)
	if err != nil {
		Unavailable(tb, "PgBouncer", err)
	}
	tb.Cleanup(func() { b.Close() })
	return b
}
