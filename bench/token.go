package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// The cost of a durable fencing token: Lock.Token's statement, which
// writes a WAL record and commits synchronously, against the statement it
// replaced, which read txid_current() and committed asynchronously (no
// WAL of its own), on one session holding the lock; on the test server
// (fsync off) and on a server of the same binaries with fsync on, in
// interleaved rounds.

// oldTokenSQL is the token statement before tokens were durable, with
// the marker today's statements carry (which names it to the server).
var oldTokenSQL = sqltext.Marker(sqltext.HeldSQL) + "SELECT txid_current()" + strings.TrimPrefix(sqltext.Unmarked(sqltext.HeldSQL), "SELECT 1::int8")

// tokenKey is the key both sessions hold: pg_advisory_lock(bigint)'s tag
// is (high 32 bits, low 32 bits, 1).
const tokenKey = 4243

// tokenResult is one variant: a statement on a server.
type tokenResult struct {
	server, statement string
	testkit.Result
}

// measureTokens runs rounds rounds of the four variants (each statement
// on each server) in a random order each round.
func measureTokens(ctx context.Context, fsyncOff, fsyncOn string, rounds int) ([]tokenResult, error) {
	if !strings.HasPrefix(sqltext.Unmarked(sqltext.HeldSQL), "SELECT 1::int8") {
		return nil, errors.New("bench: sqltext.HeldSQL changed shape: update oldTokenSQL")
	}
	var out []tokenResult
	var vs []testkit.Variant
	var first error
	for _, srv := range []struct{ name, dsn string }{{"fsync off", fsyncOff}, {"fsync on", fsyncOn}} {
		db := open("pgx", srv.dsn)
		defer db.Close()
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", int64(tokenKey)); err != nil {
			return nil, err
		}
		var fsync, syncCommit string
		if err := conn.QueryRowContext(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &syncCommit); err != nil {
			return nil, err
		}
		if want := strings.TrimPrefix(srv.name, "fsync "); fsync != want {
			return nil, fmt.Errorf("bench: the %s server has fsync = %s", srv.name, fsync)
		}
		for _, st := range []struct{ name, sql string }{{"before: txid_current()", oldTokenSQL}, {"durable (Lock.Token)", sqltext.TokenSQL}} {
			out = append(out, tokenResult{server: srv.name + ", synchronous_commit " + syncCommit, statement: st.name})
			vs = append(vs, testkit.Variant{Name: srv.name + ": " + st.name, Run: func() {
				var tok int64
				err := conn.QueryRowContext(ctx, st.sql, int64(tokenKey>>32), int64(tokenKey&(1<<32-1)), int64(1)).Scan(&tok)
				if err == nil && tok <= 0 {
					err = fmt.Errorf("bench: token %d", tok)
				}
				if err != nil && first == nil {
					first = err
				}
			}})
		}
	}
	for _, v := range vs { // warm up: connections and prepared statements
		v.Run()
	}
	rec := testkit.NewRecorder(vs...)
	for range rounds {
		rec.Round()
	}
	if first != nil {
		return nil, first
	}
	for i, r := range rec.Results(0) {
		out[i].Result = r
	}
	return out, nil
}

// writeTokens writes the token table to w.
func writeTokens(w io.Writer, rs []tokenResult) {
	fmt.Fprintf(w, "| server | statement | median µs | tokens/s | durable ÷ before (throughput) |\n|---|---|---|---|---|\n")
	for i, r := range rs {
		ratio := ""
		if i%2 == 1 {
			ratio = fmt.Sprintf("%.2f×", rs[i-1].Wall.Seconds()/r.Wall.Seconds())
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %s |\n", r.server, r.statement, us(r.Wall), r.OpsPerSec(), ratio)
	}
}

// runTokens is the -tokens mode: srv (fsync off) against a server of its
// own with fsync on, rounds interleaved rounds; the table to w.
func runTokens(ctx context.Context, srv *pgtest.Server, rounds int, w io.Writer) error {
	durable, stop, err := startFsyncServer(ctx, srv.BinDir())
	if err != nil {
		return err
	}
	defer stop()
	rs, err := measureTokens(ctx, srv.DSN(), durable, rounds)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%d interleaved rounds, one session per server, holding the lock.\n\n", rounds)
	writeTokens(w, rs)
	fmt.Fprintln(w)
	return nil
}

// startFsyncServer starts a PostgreSQL cluster of the binaries in bin
// with the settings of a production server's durability (fsync on,
// synchronous_commit on), on a free loopback port, in a temporary
// directory of the disk os.TempDir is on; it returns a DSN of its
// superuser, and stop, which stops it and removes its files.
func startFsyncServer(ctx context.Context, bin string) (dsn string, stop func(), err error) {
	if bin == "" {
		return "", nil, errors.New("bench: no local PostgreSQL binaries (a server with fsync on is started from them)")
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 { // PostgreSQL refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			u, err = user.Lookup("nobody")
		}
		if err != nil {
			return "", nil, err
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	base, err := os.MkdirTemp("", "sqllock-bench-fsync-")
	if err != nil {
		return "", nil, err
	}
	if cred != nil {
		if err := os.Chown(base, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(base)
			return "", nil, err
		}
	}
	run := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = base
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
		return cmd
	}
	data := filepath.Join(base, "data")
	if out, err := run("initdb", "-D", data, "-U", "postgres", "-E", "UTF8", "--auth=trust").CombinedOutput(); err != nil {
		os.RemoveAll(base)
		return "", nil, fmt.Errorf("bench: initdb: %w\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(base)
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	logf, err := os.Create(filepath.Join(base, "postgres.log"))
	if err != nil {
		os.RemoveAll(base)
		return "", nil, err
	}
	cmd := run("postgres", "-D", data, "-p", strconv.Itoa(port), "-k", base, "-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB") // the rest as the test server
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		os.RemoveAll(base)
		return "", nil, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(exited) }()
	stop = func() {
		cmd.Process.Signal(syscall.SIGINT) // fast shutdown
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		os.RemoveAll(base)
	}
	dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	db := open("pgx", dsn)
	defer db.Close()
	for deadline := time.Now().Add(time.Minute); ; {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err = db.PingContext(pctx)
		cancel()
		if err == nil {
			return dsn, stop, nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(base, "postgres.log"))
			stop()
			return "", nil, fmt.Errorf("bench: the fsync server exited: %s", log)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, fmt.Errorf("bench: the fsync server did not accept connections: %w", err)
		}
	}
}
