package pgtest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Patroni is a PostgreSQL cluster run by Patroni on this machine, for
// tests of what clients see when the primary changes: a single-node etcd
// holds its leader key, and each node (PostgreSQL and its Patroni) has a
// directory, a PostgreSQL port and a REST API port of its own on
// 127.0.0.1. Its timings are scaled down (see [WithTimings]) and fsync is
// off: it is throwaway.
//
// Clients reach the primary through a multi-host DSN ([Patroni.DSN] for
// pgx, [Patroni.KeywordDSN] for lib/pq and pgx). Faults: a switchover
// ([Patroni.Switchover]), a host's death ([Patroni.KillHost]), a
// PostgreSQL crash ([Patroni.CrashPostgres]) and a stalled replication
// link ([Patroni.StallReplication]). [Patroni.Primary],
// [Patroni.WaitPrimary] and [Patroni.WaitHealthy] tell where the cluster
// is.
//
// A Patroni is safe for concurrent use; after Close its methods fail.
type Patroni struct {
	etcd   *Etcd
	nodes  []*Node
	base   string
	scope  string
	cfg    patroniConfig
	reaper *os.File
	bin    string // the patroni program
	pgBin  string
	cred   *syscall.Credential
	// Every node's roles: the superuser's name and password, and [Role]'s.
	adminUser, adminPassword, password string

	closeMu sync.Mutex
	closed  bool // guarded by closeMu
}

// Node is one member of a [Patroni] cluster: a PostgreSQL server on Host
// and Port, run by Patroni, whose REST API listens on APIPort.
type Node struct {
	Name    string
	Host    string
	Port    int // PostgreSQL's
	APIPort int // Patroni's REST API

	p    *Patroni
	dir  string
	data string
	log  string

	mu     sync.Mutex
	cmd    *exec.Cmd  // guarded by mu; nil once the host is killed
	exited chan error // guarded by mu; receives cmd.Wait's result once
}

// PatroniOption configures [NewPatroni] and [StartPatroni].
type PatroniOption interface{ apply(*patroniConfig) }

type patroniOption func(*patroniConfig)

func (f patroniOption) apply(c *patroniConfig) { f(c) }

type patroniConfig struct {
	nodes                    int
	sync                     bool
	ttl, loopWait, retryWait time.Duration
}

// WithSynchronousMode turns on Patroni's synchronous_mode: the primary's
// commits wait for one synchronous standby, and only that standby may be
// promoted.
func WithSynchronousMode() PatroniOption {
	return patroniOption(func(c *patroniConfig) { c.sync = true })
}

// WithNodes sets the number of nodes (default 3; at least 1).
func WithNodes(n int) PatroniOption {
	return patroniOption(func(c *patroniConfig) { c.nodes = n })
}

// WithTimings sets Patroni's ttl, loop_wait and retry_timeout, in whole
// seconds, with loop_wait + 2 × retry_timeout ≤ ttl (Patroni's rule).
// The default, 10 s, 1 s and 4 s, fails over from a dead primary in about
// 10 seconds; Patroni's own defaults, 30 s, 10 s and 10 s, in 25 to 30.
// Later Patroni releases document minimums (ttl 20 s,
// retry_timeout 3 s).
func WithTimings(ttl, loopWait, retryTimeout time.Duration) PatroniOption {
	return patroniOption(func(c *patroniConfig) { c.ttl, c.loopWait, c.retryWait = ttl, loopWait, retryTimeout })
}

func (c patroniConfig) validate() error {
	if c.nodes < 1 {
		return fmt.Errorf("pgtest: WithNodes(%d): want at least 1", c.nodes)
	}
	for _, d := range []time.Duration{c.ttl, c.loopWait, c.retryWait} {
		if d < time.Second || d%time.Second != 0 {
			return fmt.Errorf("pgtest: WithTimings(%v, %v, %v): want whole seconds, at least 1", c.ttl, c.loopWait, c.retryWait)
		}
	}
	if c.loopWait+2*c.retryWait > c.ttl {
		return fmt.Errorf("pgtest: WithTimings(%v, %v, %v): Patroni wants loop_wait + 2 × retry_timeout ≤ ttl", c.ttl, c.loopWait, c.retryWait)
	}
	return nil
}

// findPatroni returns the path of the patroni program.
func findPatroni() (string, error) {
	if p, err := exec.LookPath("patroni"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/patroni"); err == nil {
		return "/usr/bin/patroni", nil
	}
	return "", errors.New("patroni not found on PATH or in /usr/bin (Debian: apt-get install patroni)")
}

// errClosed is returned by the methods of a closed Patroni.
var errClosed = errors.New("pgtest: the Patroni cluster is closed")

// StartPatroni starts a Patroni cluster for tb (see [NewPatroni]) and
// removes it when tb ends: every process killed, every file removed,
// whether tb passed or not (when it failed, the end of each node's Patroni
// log is logged first). Without Patroni, etcd or the PostgreSQL server
// binaries it skips tb, or fails it when CI=true.
func StartPatroni(tb testing.TB, opts ...PatroniOption) *Patroni {
	tb.Helper()
	for _, find := range []struct {
		what string
		f    func() (string, error)
	}{{"Patroni", findPatroni}, {"etcd", findEtcd}, {"local PostgreSQL binaries (for Patroni)", findBin}} {
		if _, err := find.f(); err != nil {
			Unavailable(tb, find.what, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := NewPatroni(ctx, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("pgtest: Patroni logs:\n%s", p.logTails())
		}
		if err := p.Close(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return p
}

// NewPatroni starts etcd and a Patroni cluster of 3 nodes (see the
// options), waits until one node is the primary and every other streams
// from it (in synchronous mode, one of them synchronously), and creates the
// ordinary role [Role] and its database. ctx bounds the start (a minute is
// plenty). The caller must Close it.
func NewPatroni(ctx context.Context, opts ...PatroniOption) (*Patroni, error) {
	cfg := patroniConfig{nodes: 3, ttl: 10 * time.Second, loopWait: time.Second, retryWait: 4 * time.Second}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bin, err := findPatroni()
	if err != nil {
		return nil, err
	}
	pgBin, err := findBin()
	if err != nil {
		return nil, err
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	// A port picked free can be taken before Patroni or PostgreSQL binds
	// it (by another program on the machine): then start again, on others.
	for attempt := 1; ; attempt++ {
		base, err := os.MkdirTemp("", "sqllock-patroni-")
		if err != nil {
			return nil, err
		}
		if r, err := filepath.EvalSymlinks(base); err == nil {
			base = r // as the kernel names the processes' working directories
		}
		p := &Patroni{base: base, scope: "pgtest-" + randomHex(4), cfg: cfg, bin: bin, pgBin: pgBin, cred: cred,
			adminUser: "postgres", adminPassword: randomHex(12)}
		p.reaper = reapProcesses(base)
		err = p.start(ctx)
		if err == nil {
			return p, nil
		}
		tails := p.logTails()
		p.Close()
		if !errors.Is(err, errPortTaken) || attempt == 3 || ctx.Err() != nil {
			return nil, fmt.Errorf("%w\n%s", err, tails)
		}
	}
}

// errPortTaken is start's error when a node could not bind its port.
var errPortTaken = errors.New("pgtest: a Patroni node's port was taken")

func (p *Patroni) start(ctx context.Context) error {
	if cred := p.cred; cred != nil {
		if err := os.Chown(p.base, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	var err error
	if p.etcd, err = NewEtcd(ctx); err != nil {
		return err
	}
	replPassword := randomHex(12)
	ports, err := freePorts(2 * p.cfg.nodes)
	if err != nil {
		return err
	}
	for i := 1; i <= p.cfg.nodes; i++ {
		n := &Node{Name: "node" + strconv.Itoa(i), Host: "127.0.0.1", p: p, Port: ports[2*i-2], APIPort: ports[2*i-1]}
		n.dir = filepath.Join(p.base, n.Name)
		n.data = filepath.Join(n.dir, "data")
		n.log = filepath.Join(n.dir, "patroni.log")
		if err := p.writeConfig(n, replPassword); err != nil {
			return err
		}
		p.nodes = append(p.nodes, n)
	}
	for _, n := range p.nodes {
		if err := n.startPatroni(); err != nil {
			return err
		}
	}
	var prim *Node
	if err := p.waitStarting(ctx, func(ctx context.Context) (err error) { prim, err = p.WaitPrimary(ctx, nil); return err }); err != nil {
		return err
	}
	s := prim.server()
	if err := s.bootstrap(ctx); err != nil {
		return err
	}
	p.password = s.password
	return p.waitStarting(ctx, p.WaitHealthy)
}

// waitStarting runs wait (WaitPrimary or WaitHealthy) while the nodes
// start, and returns errPortTaken, ending the wait, as soon as a node's
// log says it could not bind its port, or an error when a Patroni exits.
func (p *Patroni) waitStarting(ctx context.Context, wait func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- wait(ctx) }()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(200 * time.Millisecond):
		}
		var err error
		for _, n := range p.nodes {
			if strings.Contains(tail(n.log), "Address already in use") {
				err = fmt.Errorf("%w: %s (%s, API %d)", errPortTaken, n, n.Addr(), n.APIPort)
				break
			}
			n.mu.Lock()
			exited := n.exited
			n.mu.Unlock()
			select {
			case e := <-exited:
				exited <- e // for Close
				err = fmt.Errorf("pgtest: %s's Patroni exited: %v", n, e)
			default:
			}
		}
		if err != nil {
			cancel()
			<-done
			return err
		}
	}
}

// writeConfig writes node n's Patroni configuration (JSON, which is YAML).
func (p *Patroni) writeConfig(n *Node, replPassword string) error {
	sock := filepath.Join(n.dir, "sock")
	for _, d := range []string{n.dir, sock} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
		if p.cred != nil {
			if err := os.Chown(d, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
				return err
			}
		}
	}
	secs := func(d time.Duration) int { return int(d / time.Second) }
	api := net.JoinHostPort(n.Host, strconv.Itoa(n.APIPort))
	pg := net.JoinHostPort(n.Host, strconv.Itoa(n.Port))
	conf := map[string]any{
		"scope":     p.scope,
		"namespace": "/pgtest/",
		"name":      n.Name,
		"restapi":   map[string]any{"listen": api, "connect_address": api},
		"etcd3":     map[string]any{"hosts": []string{p.etcd.Addr()}},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl": secs(p.cfg.ttl), "loop_wait": secs(p.cfg.loopWait), "retry_timeout": secs(p.cfg.retryWait),
				"maximum_lag_on_failover": 16 << 20,
				"synchronous_mode":        p.cfg.sync,
				"postgresql": map[string]any{
					"use_pg_rewind": false, // it needs full_page_writes
					"use_slots":     true,
					"parameters": map[string]any{
						"fsync": "off", "full_page_writes": "off",
						// On, not pgtest's usual off: synchronous replication
						// waits only for commits that wait for their flush.
						"synchronous_commit": "on",
						"max_connections":    200, "shared_buffers": "32MB",
						"wal_level": "replica", "hot_standby": "on",
						"max_wal_senders": 10, "max_replication_slots": 10,
						"wal_keep_size": "64MB", "log_min_messages": "warning",
					},
				},
			},
			"initdb": []any{map[string]string{"encoding": "UTF8"}, map[string]string{"locale": "C"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen": pg, "connect_address": pg,
			"data_dir": n.data, "bin_dir": p.pgBin,
			// Without pg_rewind, a replica that received WAL past the new
			// primary's fork point (an asynchronous one can be ahead of the
			// synchronous standby that was promoted) cannot follow it: it
			// is rebuilt from the new primary instead of left behind.
			"remove_data_directory_on_diverged_timelines": true,
			"pgpass": filepath.Join(n.dir, "pgpass"),
			"authentication": map[string]any{
				"superuser":   map[string]string{"username": p.adminUser, "password": p.adminPassword},
				"replication": map[string]string{"username": "replicator", "password": replPassword},
			},
			"parameters": map[string]any{"unix_socket_directories": sock},
			"pg_hba": []string{
				"local all all trust",
				"host all all 127.0.0.1/32 trust",
				"host replication all 127.0.0.1/32 trust",
			},
			"basebackup": []any{map[string]string{"checkpoint": "fast"}, "no-sync"},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(n.dir, "patroni.yml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	if p.cred != nil {
		return os.Chown(path, int(p.cred.Uid), int(p.cred.Gid))
	}
	return nil
}

// startPatroni starts the node's Patroni, which starts (or creates) its
// PostgreSQL.
func (n *Node) startPatroni() error {
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.p.bin, filepath.Join(n.dir, "patroni.yml"))
	cmd.Dir = n.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC", "HOME="+n.dir, "TMPDIR="+n.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: n.p.cred, Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("pgtest: start patroni: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); logf.Close() }()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	return nil
}

// Nodes returns the cluster's nodes, dead or alive, in a fixed order.
func (p *Patroni) Nodes() []*Node { return append([]*Node(nil), p.nodes...) }

// Etcd returns the cluster's etcd.
func (p *Patroni) Etcd() *Etcd { return p.etcd }

// Scope returns the cluster's name in Patroni (its scope).
func (p *Patroni) Scope() string { return p.scope }

// DSN returns a multi-host URL for [Role] on its database, with
// target_session_attrs=read-write: a new connection goes to whichever
// node is the primary. pgx takes it; lib/pq does not (it reads the hosts
// of a URL as one host name): use [Patroni.KeywordDSN] there.
func (p *Patroni) DSN() string { return p.DSNFor(Role) }

// DSNFor is [Patroni.DSN] for database db.
func (p *Patroni) DSNFor(db string) string { return p.url(Role, p.password, db) }

// AdminDSN is [Patroni.DSN] for the superuser, on database postgres.
func (p *Patroni) AdminDSN() string { return p.url(p.adminUser, p.adminPassword, "postgres") }

func (p *Patroni) url(user, password, db string) string {
	hosts := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		hosts[i] = net.JoinHostPort(n.Host, strconv.Itoa(n.Port))
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(user, password), Host: strings.Join(hosts, ","),
		Path: "/" + db, RawQuery: "sslmode=disable&connect_timeout=5&target_session_attrs=read-write"}
	return u.String()
}

// KeywordDSN returns the keyword form of [Patroni.DSN] (host=h1,h2,h3
// port=p1,p2,p3 ... target_session_attrs=read-write): lib/pq and pgx both
// take it.
func (p *Patroni) KeywordDSN() string { return p.KeywordDSNFor(Role) }

// KeywordDSNFor is [Patroni.KeywordDSN] for database db.
func (p *Patroni) KeywordDSNFor(db string) string {
	hosts := make([]string, len(p.nodes))
	ports := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		hosts[i], ports[i] = n.Host, strconv.Itoa(n.Port)
	}
	return fmt.Sprintf("host=%s port=%s user=%s password=%s dbname=%s sslmode=disable connect_timeout=5 target_session_attrs=read-write",
		strings.Join(hosts, ","), strings.Join(ports, ","), Role, p.password, db)
}

// server returns a Server for n (for its DSNs).
func (n *Node) server() *Server {
	return &Server{Host: n.Host, Port: n.Port, adminUser: n.p.adminUser, adminPassword: n.p.adminPassword,
		password: n.p.password, database: Role}
}

// DSN returns a URL for [Role] on its database on this node only.
func (n *Node) DSN() string { return n.server().DSN() }

// DSNFor returns a URL for [Role] on database db on this node only.
func (n *Node) DSNFor(db string) string { return n.server().DSNFor(db) }

// AdminDSN returns a superuser URL for this node only.
func (n *Node) AdminDSN() string { return n.server().AdminDSN() }

// Addr returns host:port of the node's PostgreSQL.
func (n *Node) Addr() string { return net.JoinHostPort(n.Host, strconv.Itoa(n.Port)) }

// APIURL returns the base URL of the node's Patroni REST API.
func (n *Node) APIURL() string { return "http://" + net.JoinHostPort(n.Host, strconv.Itoa(n.APIPort)) }

// String returns the node's name.
func (n *Node) String() string {
	if n == nil {
		return "<none>"
	}
	return n.Name
}

// Alive reports whether the node's host is up: false after KillHost.
func (n *Node) Alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// live returns the nodes whose host is up.
func (p *Patroni) live() []*Node {
	var out []*Node
	for _, n := range p.nodes {
		if n.Alive() {
			out = append(out, n)
		}
	}
	return out
}

func (p *Patroni) isClosed() bool {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	return p.closed
}

// apiClient asks Patroni's REST API; each request is bounded by its
// context.
var apiClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// api sends a request to the node's REST API and returns the status code
// and body.
func (n *Node) api(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, n.APIURL()+path, r)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := apiClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// check returns whether GET path on the node's REST API answers 200
// (Patroni's health checks: /primary, /replica, /sync), within a second.
func (n *Node) check(ctx context.Context, path string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	code, _, err := n.api(ctx, http.MethodGet, path, nil)
	return err == nil && code == http.StatusOK
}

// Primary returns the node that leads the cluster now, as Patroni's REST
// API says (GET /primary answers 200 on the leader only), or an error
// when no node does (during a failover, say). ctx bounds the requests.
func (p *Patroni) Primary(ctx context.Context) (*Node, error) {
	if p.isClosed() {
		return nil, errClosed
	}
	for _, n := range p.live() {
		if n.check(ctx, "/primary") {
			return n, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("pgtest: no Patroni node is the primary now")
}

// WaitPrimary waits until a node other than not (nil: any node) is the
// primary, by Patroni's REST API, and accepts writes (pg_is_in_recovery()
// is false there), and returns it. It returns ctx's error when ctx ends
// first.
func (p *Patroni) WaitPrimary(ctx context.Context, not *Node) (*Node, error) {
	var last error
	for {
		n, err := p.Primary(ctx)
		if errors.Is(err, errClosed) {
			return nil, err
		}
		if err == nil && n == not {
			err = fmt.Errorf("pgtest: %s is still the primary", n)
		}
		if err == nil {
			if err = n.writable(ctx); err == nil {
				return n, nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pgtest: waiting for a new primary: %w (last: %v)", ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// writable returns nil when the node's PostgreSQL is a primary.
func (n *Node) writable(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", n.AdminDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	var standby bool
	if err := db.QueryRowContext(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return err
	}
	if standby {
		return fmt.Errorf("pgtest: %s is in recovery", n)
	}
	return nil
}

// WaitHealthy waits until the cluster is whole again: a primary, every
// other live node streaming from it and, in synchronous mode, one of them
// its synchronous standby as Patroni records it (the one a switchover or
// failover may promote). Call it between faults. It returns ctx's error,
// with what was missing, when ctx ends first.
func (p *Patroni) WaitHealthy(ctx context.Context) error {
	var last error
	for {
		if last = p.healthy(ctx); last == nil || errors.Is(last, errClosed) {
			return last
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waiting for a healthy Patroni cluster: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *Patroni) healthy(ctx context.Context) error {
	prim, err := p.Primary(ctx)
	if err != nil {
		return err
	}
	replicas := len(p.live()) - 1
	if replicas == 0 {
		return prim.writable(ctx)
	}
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	db, err := sql.Open("pgx", prim.AdminDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	// Patroni names each replica's connection after its node (a
	// pg_basebackup that creates a replica streams too, under its own name).
	var names []string
	for _, n := range p.live() {
		if n != prim {
			names = append(names, n.Name)
		}
	}
	var streaming, syncs int
	if err := db.QueryRowContext(qctx, `SELECT count(*) FILTER (WHERE state = 'streaming'),
		count(*) FILTER (WHERE state = 'streaming' AND sync_state = 'sync')
		FROM pg_stat_replication WHERE application_name = ANY(string_to_array($1, ','))`, strings.Join(names, ",")).Scan(&streaming, &syncs); err != nil {
		return err
	}
	if streaming < replicas {
		return fmt.Errorf("pgtest: %d of %d replicas stream from %s", streaming, replicas, prim)
	}
	// And Patroni sees them run: a switchover needs that.
	var cl struct {
		Members []struct {
			Name, Role, State string
		}
	}
	code, body, err := prim.api(qctx, http.MethodGet, "/cluster", nil)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /cluster: %d", code)
	}
	if err == nil {
		err = json.Unmarshal(body, &cl)
	}
	if err != nil {
		return fmt.Errorf("pgtest: %s: %w", prim, err)
	}
	running := 0
	for _, m := range cl.Members {
		if m.State == "running" || m.State == "streaming" {
			running++
		}
	}
	if running < replicas+1 {
		return fmt.Errorf("pgtest: %d of %d Patroni members run: %s", running, replicas+1, body)
	}
	if !p.cfg.sync {
		return nil
	}
	if syncs == 0 {
		return fmt.Errorf("pgtest: no synchronous standby streams from %s", prim)
	}
	for _, n := range p.live() {
		if n != prim && n.check(ctx, "/sync") {
			return nil
		}
	}
	return errors.New("pgtest: Patroni records no synchronous standby yet")
}

// Switchover asks Patroni to hand the primary role to another node (POST
// /switchover: the primary shuts down cleanly, a standby is promoted, in
// synchronous mode the synchronous one) and waits until the new primary
// accepts writes; it returns the new primary. ctx bounds the whole. Call
// [Patroni.WaitHealthy] first after an earlier fault: Patroni refuses a
// switchover without a healthy candidate.
func (p *Patroni) Switchover(ctx context.Context) (*Node, error) {
	old, err := p.Primary(ctx)
	if err != nil {
		return nil, err
	}
	code, body, err := old.api(ctx, http.MethodPost, "/switchover", map[string]string{"leader": old.Name})
	if err != nil {
		return nil, fmt.Errorf("pgtest: switchover: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("pgtest: switchover from %s: %d %s", old, code, bytes.TrimSpace(body))
	}
	return p.WaitPrimary(ctx, old)
}

// KillHost kills the node's Patroni and every PostgreSQL process of its
// server with SIGKILL, at once: the node's host has died. Nothing on the
// node shuts down cleanly; its clients' connections break. When it was the
// primary, a standby takes over once the leader key expires in etcd (after
// ttl). The node stays dead.
func (p *Patroni) KillHost(n *Node) error {
	if p.isClosed() {
		return errClosed
	}
	if n == nil {
		return errors.New("pgtest: KillHost(nil)")
	}
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd, n.exited = nil, nil
	n.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("pgtest: %s is already dead", n)
	}
	_ = cmd.Process.Kill()
	err := killUnder(n.dir, 10*time.Second)
	<-exited
	return err
}

// CrashPostgres kills the node's postmaster with SIGKILL, leaving its
// Patroni running: PostgreSQL's crash. Patroni starts it again in place
// (with crash recovery) within a loop_wait or two; it does not fail over.
func (p *Patroni) CrashPostgres(n *Node) error {
	if p.isClosed() {
		return errClosed
	}
	if n == nil || !n.Alive() {
		return fmt.Errorf("pgtest: %s is dead", n)
	}
	b, err := os.ReadFile(filepath.Join(n.data, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pgtest: %s: %w", n, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || pid <= 1 {
		return fmt.Errorf("pgtest: %s: no postmaster pid in postmaster.pid", n)
	}
	return syscall.Kill(pid, syscall.SIGKILL)
}

// Close kills every process of the cluster (Patroni, PostgreSQL, etcd) and
// removes its files. It is safe to call twice.
func (p *Patroni) Close() error {
	p.closeMu.Lock()
	if p.closed {
		p.closeMu.Unlock()
		return nil
	}
	p.closed = true
	p.closeMu.Unlock()
	var exits []chan error
	for _, n := range p.nodes {
		n.mu.Lock()
		if n.cmd != nil {
			_ = n.cmd.Process.Kill()
			exits = append(exits, n.exited)
		}
		n.cmd, n.exited = nil, nil
		n.mu.Unlock()
	}
	err := killUnder(p.base, 10*time.Second)
	for _, ch := range exits {
		<-ch
	}
	if p.etcd != nil {
		if e := p.etcd.Close(); err == nil {
			err = e
		}
	}
	if e := os.RemoveAll(p.base); err == nil {
		err = e
	}
	if p.reaper != nil {
		p.reaper.Close()
	}
	return err
}

// logTails returns the end of each node's Patroni log.
func (p *Patroni) logTails() string {
	var b strings.Builder
	for _, n := range p.nodes {
		fmt.Fprintf(&b, "--- %s (%s, API %s)\n%s\n", n, n.Addr(), n.APIURL(), tail(n.log))
	}
	return b.String()
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// processesUnder returns the pids of the processes whose working directory
// is dir or under it.
func processesUnder(dir string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil {
			continue // gone, a zombie, or not ours to see
		}
		cwd = strings.TrimSuffix(cwd, " (deleted)")
		if cwd == dir || strings.HasPrefix(cwd, dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killUnder sends SIGKILL to every process working under dir until none
// is left, for at most d.
func killUnder(dir string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		pids := processesUnder(dir)
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: processes %v still run under %s after %v", pids, dir, d)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// StallReplication stops the primary's WAL senders (SIGSTOP): the
// standbys receive nothing more, as over a link that has stalled, until
// resume (SIGCONT) or the primary's death, which loses what they did not
// receive. Meanwhile a commit that waits for a synchronous standby waits;
// one that does not wait returns, though no standby has it. It returns an
// error when there is no primary or no WAL sender to stop; ctx bounds the
// query that finds them.
func (p *Patroni) StallReplication(ctx context.Context) (resume func() error, err error) {
	prim, err := p.Primary(ctx)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("pgx", prim.AdminDSN())
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "SELECT pid FROM pg_stat_replication")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("pgtest: %s has no WAL sender", prim)
	}
	resume = func() error {
		var errs []error
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			resume()
			return nil, fmt.Errorf("pgtest: stop WAL sender %d on %s: %w", pid, prim, err)
		}
	}
	return resume, nil
}
