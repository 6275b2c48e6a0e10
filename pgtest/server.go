package pgtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the harness's own connections
)

// Role is the ordinary (non-superuser) role tests connect as.
const Role = "sqllock"

// Server is a running PostgreSQL server.
type Server struct {
	Host string
	Port int

	password      string // of Role
	adminPassword string // of the superuser; empty for an external server
	adminUser     string
	database      string // Role's default database

	external string // SQLLOCK_TEST_DSN, when that is what this is
	local    *cluster
	closer   func() error
	id       string // what runs a Provider's server (a container's id), else ""

	mu    sync.Mutex
	dbSeq int
	free  []string // databases handed back as they were made, for NewDatabase
	// fresh is the fingerprint of a new database (see pristine); freshMu
	// guards it.
	freshMu sync.Mutex
	fresh   string
	closed  bool
}

// DSN returns a URL for Role on its default database.
func (s *Server) DSN() string { return s.DSNFor(s.database) }

// DSNFor returns a URL for Role on database db.
func (s *Server) DSNFor(db string) string {
	if s.external != "" {
		u, err := url.Parse(s.external)
		if err == nil && u.Scheme != "" {
			u.Path = "/" + db
			return u.String()
		}
		return s.external + " dbname=" + db
	}
	return dsn(Role, s.password, s.Host, s.Port, db)
}

// AdminDSN returns a URL for a superuser on the default database (the role of
// SQLLOCK_TEST_DSN for an external server).
func (s *Server) AdminDSN() string {
	if s.external != "" {
		return s.external
	}
	return dsn(s.adminUser, s.adminPassword, s.Host, s.Port, "postgres")
}

// AdminDSNFor returns a superuser URL for database db.
func (s *Server) AdminDSNFor(db string) string {
	u, err := url.Parse(s.AdminDSN())
	if err != nil || u.Scheme == "" {
		return s.AdminDSN() + " dbname=" + db
	}
	u.Path = "/" + db
	return u.String()
}

// DatabaseOf returns the database name in a URL DSN.
func DatabaseOf(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// BinDir returns the directory of a local server's PostgreSQL programs
// (pgbench, psql, ...), or "" for another kind of server.
func (s *Server) BinDir() string {
	if s.local == nil {
		return ""
	}
	return s.local.bin
}

// SocketDir returns the Unix socket directory of a local server, or "".
func (s *Server) SocketDir() string {
	if s.local == nil {
		return ""
	}
	return s.local.sock
}

// Addr returns host:port.
func (s *Server) Addr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// ID returns what runs a server that a [Provider] started (a Docker
// container's id, for package pgdocker's), or "" for other servers.
func (s *Server) ID() string { return s.id }

// Local reports whether the server is a throwaway cluster this package runs
// itself (and so can restart, front with PgBouncer or follow with a standby).
func (s *Server) Local() bool { return s.local != nil }

func dsn(user, password, host string, port int, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(user, password),
		Host:     net.JoinHostPort(host, strconv.Itoa(port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// Close stops the server and removes its files. It is safe to call twice.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	if s.closer != nil {
		return s.closer()
	}
	return nil
}

// Admin opens a superuser connection pool. The caller closes it.
func (s *Server) Admin() (*sql.DB, error) { return sql.Open("pgx", s.AdminDSN()) }

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// A Provider starts a server when neither SQLLOCK_TEST_DSN nor local
// binaries give one, or when SQLLOCK_TEST_SERVER=docker asks for it: the
// module github.com/sqllock/sqllock/pgtest/pgdocker provides Docker
// containers. It builds its Server with [Attach].
type Provider func(ctx context.Context) (*Server, error)

// Embedded starts a throwaway server outside tests (for the examples): the
// server of SQLLOCK_TEST_DSN, else a local cluster. The caller must Close
// it. [EmbeddedWith] adds a Provider, such as Docker.
func Embedded(ctx context.Context) (*Server, error) { return EmbeddedWith(ctx, nil) }

// EmbeddedWith is [Embedded] with p as the last resort: the server of
// SQLLOCK_TEST_DSN, else a local cluster, else p's. SQLLOCK_TEST_SERVER
// picks one path: "local" only local binaries, "docker" only p.
func EmbeddedWith(ctx context.Context, p Provider) (*Server, error) {
	if d := os.Getenv("SQLLOCK_TEST_DSN"); d != "" {
		return external(ctx, d)
	}
	var lerr, derr error = errNoLocal, errNoProvider
	mode := os.Getenv("SQLLOCK_TEST_SERVER")
	switch mode {
	case "docker":
		// The provider's path, even where local binaries exist.
	case "local", "":
		s, err := startLocal(ctx)
		if err == nil {
			return s, nil
		}
		lerr = err
	default:
		return nil, fmt.Errorf("pgtest: SQLLOCK_TEST_SERVER=%q: want local or docker (or unset: local, else docker)", mode)
	}
	if mode != "local" && p != nil {
		s, err := p(ctx)
		if err == nil {
			return s, nil
		}
		derr = err
	}
	return nil, fmt.Errorf("pgtest: no PostgreSQL available.\n  local binaries: %v\n  docker: %v\n"+
		"Install PostgreSQL (Debian: apt-get install postgresql), or set SQLLOCK_TEST_DSN to a server whose role may create databases "+
		"(with Docker: go run github.com/sqllock/sqllock/pgtest/pgdocker/cmd/pgdocker@latest -superuser prints one)", lerr, derr)
}

// errNoLocal reports why the local path was not taken.
var errNoLocal = errors.New("pgtest: SQLLOCK_TEST_SERVER=docker")

// errNoProvider reports why the Docker path was not taken.
var errNoProvider = errors.New("not in this package: use github.com/sqllock/sqllock/pgtest/pgdocker (pgdocker.Start), or SQLLOCK_TEST_DSN")

// Attach returns the Server of a fresh PostgreSQL cluster that a
// [Provider] started: reachable at host:port as the superuser user with
// password, run by id (a container's id, say). It creates the ordinary
// role [Role] and its database there. Close calls closeFn, which stops and
// removes what runs the server; Attach calls it too when it fails.
func Attach(ctx context.Context, host string, port int, user, password, id string, closeFn func() error) (*Server, error) {
	s := &Server{Host: host, Port: port, adminUser: user, adminPassword: password, database: Role, id: id, closer: closeFn}
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
			s.Close()
			return nil, fmt.Errorf("pgtest: the server at %s did not accept connections: %w", s.Addr(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := s.bootstrap(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// DatabaseURL returns the DSN in DATABASE_URL when it is set; otherwise it
// starts a throwaway server with Embedded, says so on w, and returns its
// DSN. Call stop when done with the database. The examples use it, so that
// "go run" works with no setup.
func DatabaseURL(ctx context.Context, w io.Writer) (dsn string, stop func(), err error) {
	if d := os.Getenv("DATABASE_URL"); d != "" {
		return d, func() {}, nil
	}
	fmt.Fprintln(w, "DATABASE_URL is unset: starting a throwaway PostgreSQL...")
	srv, err := Embedded(ctx)
	if err != nil {
		return "", nil, err
	}
	return srv.DSN(), func() { srv.Close() }, nil
}

func external(ctx context.Context, d string) (*Server, error) {
	db, err := sql.Open("pgx", d)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	var cur string
	if err := db.QueryRowContext(ctx, "SELECT current_database()").Scan(&cur); err != nil {
		return nil, fmt.Errorf("pgtest: SQLLOCK_TEST_DSN: %w", err)
	}
	s := &Server{external: d, database: cur}
	// Its address, for a Proxy in front of it (a TCP host only).
	if cfg, err := pgconn.ParseConfig(d); err == nil && !strings.HasPrefix(cfg.Host, "/") {
		s.Host, s.Port = cfg.Host, int(cfg.Port)
	}
	return s, nil
}

// cluster is a PostgreSQL data directory this package runs.
type cluster struct {
	bin     string // directory with initdb, postgres, pg_basebackup
	base    string // temporary directory holding everything
	data    string
	sock    string
	logPath string
	port    int
	cred    *syscall.Credential // nil: run as ourselves
	reaper  *os.File            // write end of the reaper's stdin (see reap)
	ns      *namespace          // nil: the server listens on 127.0.0.1
	pidns   bool                // postgres runs in a PID namespace of its own

	mu     sync.Mutex
	cmd    *exec.Cmd  // guarded by mu
	exited chan error // guarded by mu; receives cmd.Wait's result once
}

// findBin returns the directory of the newest PostgreSQL server binaries.
func findBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	sort.Slice(matches, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(matches[j]))))
		return vi > vj
	})
	if len(matches) > 0 {
		return filepath.Dir(matches[0]), nil
	}
	return "", errors.New("initdb not found on PATH or under /usr/lib/postgresql/*/bin")
}

// credential returns who the server runs as: ourselves, or, as root, the
// postgres user (else nobody), since PostgreSQL refuses to run as root.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root and neither a postgres nor a nobody user exists")
}

func startLocal(ctx context.Context) (*Server, error) {
	return startLocalWith(ctx, false)
}

// startLocalWith is startLocal, the server in a PID namespace of its own
// when pidns is set.
func startLocalWith(ctx context.Context, pidns bool) (*Server, error) {
	c, adminPW, err := newCluster(ctx, "primary", nil, withPIDNamespace(pidns))
	if err != nil {
		return nil, err
	}
	s := &Server{Host: "127.0.0.1", Port: c.port, adminUser: "postgres", adminPassword: adminPW, local: c, database: Role}
	s.closer = c.destroy
	if err := s.bootstrap(ctx); err != nil {
		c.destroy()
		return nil, err
	}
	return s, nil
}

// clusterRoot is the directory for clusters' files: memory (/dev/shm),
// when it has room and TMPDIR names no other place, else the temporary
// directory. Tests create and drop a database each, hundreds of
// files every time: on a disk file system the server then spends much of
// its time finding inodes for them (ext4's search skips recently deleted
// ones), in memory almost none.
func clusterRoot() string {
	const room = 4 << 30 // a cluster and its databases need far less
	if os.Getenv("TMPDIR") != "" {
		return ""
	}
	var st syscall.Statfs_t
	if syscall.Statfs("/dev/shm", &st) != nil || st.Bavail*uint64(st.Bsize) < room {
		return ""
	}
	if f, err := os.CreateTemp("/dev/shm", "sqllock-pg-probe-"); err == nil {
		f.Close()
		os.Remove(f.Name())
		return "/dev/shm"
	}
	return ""
}

// newCluster makes a data directory (initdb, or init(c) when given) and
// starts postgres on a free port.
func newCluster(ctx context.Context, name string, init func(c *cluster) error, opts ...clusterOption) (*cluster, string, error) {
	bin, err := findBin()
	if err != nil {
		return nil, "", err
	}
	cred, err := credential()
	if err != nil {
		return nil, "", err
	}
	base, err := os.MkdirTemp(clusterRoot(), "sqllock-pg-"+name+"-")
	if err != nil {
		return nil, "", err
	}
	c := &cluster{bin: bin, base: base, data: filepath.Join(base, "data"), sock: filepath.Join(base, "sock"),
		logPath: filepath.Join(base, "postgres.log"), cred: cred}
	for _, o := range opts {
		o(c)
	}
	c.reaper = reap(base, c.ns)
	if err := os.Mkdir(c.sock, 0o700); err != nil {
		c.destroy()
		return nil, "", err
	}
	if cred != nil {
		for _, p := range []string{base, c.sock} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				c.destroy()
				return nil, "", err
			}
		}
	}
	adminPW := randomHex(12)
	if init != nil {
		err = init(c)
	} else {
		pwfile := filepath.Join(base, "pw")
		if err = os.WriteFile(pwfile, []byte(adminPW+"\n"), 0o600); err == nil && cred != nil {
			err = os.Chown(pwfile, int(cred.Uid), int(cred.Gid))
		}
		if err == nil {
			err = c.run(ctx, "initdb", "-D", c.data, "-U", "postgres", "-E", "UTF8", "--no-sync",
				"--auth-local=trust", "--auth-host=trust", "--pwfile="+pwfile)
		}
	}
	if err == nil && c.ns != nil {
		// Clients reach a namespaced server from the host's end of the
		// veth pair, not from loopback.
		err = appendFile(filepath.Join(c.data, "pg_hba.conf"), "host all all "+c.ns.hostAddr+"/32 trust\n")
	}
	if err != nil {
		c.destroy()
		return nil, "", err
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		c.port, err = freePort()
		if err != nil {
			c.destroy()
			return nil, "", err
		}
		if lastErr = c.start(ctx); lastErr == nil {
			return c, adminPW, nil
		}
	}
	c.destroy()
	return nil, "", lastErr
}

// clusterOption sets a cluster up before it first starts.
type clusterOption func(c *cluster)

// inNamespace makes the server listen in network namespace ns.
func inNamespace(ns *namespace) clusterOption { return func(c *cluster) { c.ns = ns } }

// withPIDNamespace runs the server in a PID namespace of its own, when on.
func withPIDNamespace(on bool) clusterOption { return func(c *cluster) { c.pidns = on } }

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// run runs one of the PostgreSQL programs as the cluster's user.
func (c *cluster) run(ctx context.Context, prog string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, prog), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.base
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: %s: %w\n%s", prog, err, out)
	}
	return nil
}

// start launches postgres on c.port and waits until it accepts connections.
func (c *cluster) start(ctx context.Context) error {
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	args := []string{"-D", c.data, "-p", strconv.Itoa(c.port), "-k", c.sock,
		"-c", "listen_addresses=" + c.host(),
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB",
		"-c", "wal_level=replica", "-c", "max_wal_senders=4", "-c", "hot_standby=on",
		"-c", "log_min_messages=warning", "-c", "logging_collector=off",
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if c.pidns {
		// As in a container: the server's processes, and so its backend
		// pids, are numbered from 1 in a namespace of their own.
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	if c.ns != nil {
		// nsenter enters the namespace as root, then becomes the cluster's
		// user and runs postgres (the same process: stop still signals it).
		// The parent-death signal does not survive the change of user: the
		// reaper stops the server instead (see reap).
		cmd = exec.Command("nsenter", append([]string{"--net=" + c.ns.path(), "--setuid", strconv.Itoa(int(c.cred.Uid)),
			"--setgid", strconv.Itoa(int(c.cred.Gid)), "--", filepath.Join(c.bin, "postgres")}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.base
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(c.host(), strconv.Itoa(c.port)), time.Second)
		if err == nil {
			conn.Close()
			if c.ready(ctx) {
				break
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("pgtest: postgres exited: %v\n%s", err, tail(c.logPath))
		case <-ctx.Done():
			cmd.Process.Kill()
			<-exited
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgtest: postgres did not start in 60s\n%s", tail(c.logPath))
		}
	}
	c.mu.Lock()
	c.cmd, c.exited = cmd, exited
	c.mu.Unlock()
	return nil
}

// host is the address the server listens on.
func (c *cluster) host() string {
	if c.ns != nil {
		return c.ns.serverAddr
	}
	return "127.0.0.1"
}

// ready reports whether the server accepts queries (not only TCP).
func (c *cluster) ready(ctx context.Context) bool {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_isready"), "-q", "-h", c.host(), "-p", strconv.Itoa(c.port), "-t", "1")
	return cmd.Run() == nil
}

// stop shuts the server down (fast mode) and waits for it to exit.
func (c *cluster) stop() error { return c.stopWith(syscall.SIGINT) }

// stopWith stops the server with sig (SIGINT: fast shutdown; SIGQUIT:
// immediate, as a crash) and waits for it to exit.
func (c *cluster) stopWith(sig syscall.Signal) error {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.cmd, c.exited = nil, nil
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	return nil
}

func (c *cluster) destroy() error {
	err := c.stop()
	if c.base != "" {
		os.RemoveAll(c.base)
	}
	if c.ns != nil {
		c.ns.remove()
	}
	if c.reaper != nil {
		c.reaper.Close()
	}
	return err
}

// reap starts a process that cleans up after the cluster in dir once this
// process is gone, however it ends (no Close, a panic, os.Exit, SIGKILL): it
// stops the server if it still runs (a server in a network namespace has
// no parent-death signal), removes the namespace, if any, and removes dir,
// retrying while the server lets go of it. It returns the write end of the
// reaper's standard input (see startReaper).
func reap(dir string, ns *namespace) *os.File {
	nsName, hostIf := "", ""
	if ns != nil {
		nsName, hostIf = ns.name, ns.hostIf
	}
	return startReaper(`cat >/dev/null
pid=$(head -1 "$1/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null
if [ -n "$2" ]; then ip netns del "$2" 2>/dev/null; ip link del "$3" 2>/dev/null; fi
for i in 1 2 3 4 5 6 7 8 9 10; do rm -rf "$1" 2>/dev/null; [ -e "$1" ] || exit 0; sleep 0.5; done`, dir, nsName, hostIf)
}

// startReaper starts a shell running script with args once this process
// is gone: the script starts by reading its standard input to the end,
// and only this process holds the write end, which it returns (closing it
// runs the script at once; nil when no shell could be started).
func startReaper(script string, args ...string) *os.File {
	r, w, err := os.Pipe()
	if err != nil {
		return nil
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", append([]string{"-c", script, "pgtest-reaper"}, args...)...)
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not stopped by the terminal's Ctrl-C with us
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil
	}
	go cmd.Wait()
	return w
}

// tail returns the end of the file at path, for error messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// bootstrap creates Role and its database on a fresh server.
func (s *Server) bootstrap(ctx context.Context) error {
	s.password = randomHex(12)
	db, err := s.Admin()
	if err != nil {
		return err
	}
	defer db.Close()
	stmts := []string{
		`CREATE ROLE ` + Role + ` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '` + s.password + `'`,
		`CREATE DATABASE ` + Role + ` OWNER ` + Role,
	}
	for _, q := range stmts {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("pgtest: bootstrap: %w", err)
		}
	}
	return nil
}

// Stop shuts a local server down (fast mode: sessions are ended), keeping
// its data; Restart brings it back on the same port.
func (s *Server) Stop() error {
	if s.local == nil {
		return errNotLocal
	}
	return s.local.stop()
}

// Restart starts a server stopped with Stop, on the same port.
func (s *Server) Restart(ctx context.Context) error {
	if s.local == nil {
		return errNotLocal
	}
	if err := s.local.stop(); err != nil {
		return err
	}
	return s.local.start(ctx)
}

// Crash stops a local server as a crash would (immediate shutdown: no
// checkpoint, every session ended at once, WAL not yet written lost) and
// starts it again on the same port, where it recovers from its WAL.
func (s *Server) Crash(ctx context.Context) error {
	if s.local == nil {
		return errNotLocal
	}
	if err := s.local.stopWith(syscall.SIGQUIT); err != nil {
		return err
	}
	return s.local.start(ctx)
}

var errNotLocal = errors.New("pgtest: only a local throwaway cluster can be stopped, restarted, replicated or fronted by PgBouncer")
