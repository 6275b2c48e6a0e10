package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/sqllock/sqllock"
)

// A candidate of the election comparison is a process of its own (this
// program, executed again), so that it can be killed or stopped: it
// campaigns as soon as it starts, reports what happens to it on stdout,
// one line per event ("campaigning", "elected", "resigning", "resigned",
// "lost", each with the wall time in Unix nanoseconds), and resigns when
// it reads "resign" on stdin. It exits when stdin closes.

// candidateEnv selects the candidate's system ("etcd" or "sqllock"); the
// other settings come in candidateAddr (an etcd endpoint or a DSN),
// candidateKey, candidateValue and candidateBound (the session TTL or the
// orphan bound; empty: the system's default).
const (
	candidateEnv   = "SQLLOCK_BENCH_CANDIDATE"
	candidateAddr  = "SQLLOCK_BENCH_ADDR"
	candidateKey   = "SQLLOCK_BENCH_KEY"
	candidateValue = "SQLLOCK_BENCH_VALUE"
	candidateBound = "SQLLOCK_BENCH_BOUND"
)

// term is what a candidate process holds once elected.
type term struct {
	resign func(ctx context.Context) error
	lost   <-chan struct{} // closed when the term ends other than by resign
}

// candidateMain is the body of a candidate process; its result is the
// exit status.
func candidateMain() int {
	ctx := context.Background()
	say := func(what string) { fmt.Printf("%s %d\n", what, time.Now().UnixNano()) }
	var bound time.Duration
	if b := os.Getenv(candidateBound); b != "" {
		var err error
		if bound, err = time.ParseDuration(b); err != nil {
			fmt.Fprintln(os.Stderr, "candidate:", err)
			return 2
		}
	}
	campaign := campaignSqllock
	if os.Getenv(candidateEnv) == "etcd" {
		campaign = campaignEtcd
	}
	t, err := campaign(ctx, os.Getenv(candidateAddr), os.Getenv(candidateKey), os.Getenv(candidateValue), bound, func() { say("campaigning") })
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return 2
	}
	say("elected")
	go func() {
		<-t.lost
		say("lost")
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "resign" {
			say("resigning")
			if err := t.resign(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "candidate: resign:", err)
				return 2
			}
			say("resigned")
		}
	}
	return 0
}

// campaignSqllock campaigns in sqllock's Election on key (an int64) of
// the server at dsn, with the orphan bound bound (0: the default), and
// calls campaigning just before it waits.
func campaignSqllock(ctx context.Context, dsn, key, value string, bound time.Duration, campaigning func()) (*term, error) {
	k, err := strconv.ParseInt(key, 10, 64)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		return nil, err
	}
	var opts []sqllock.Option
	if bound > 0 {
		opts = append(opts, sqllock.WithOrphanBound(bound))
	}
	campaigning()
	ld, err := sqllock.New(db, opts...).Election(sqllock.Int64(k)).Campaign(ctx, value)
	if err != nil {
		return nil, err
	}
	lost := make(chan struct{})
	go func() {
		<-ld.Done()
		if !errors.Is(ld.Err(), sqllock.ErrReleased) {
			close(lost)
		}
	}()
	return &term{resign: ld.Unlock, lost: lost}, nil
}

// campaignEtcd campaigns in etcd's concurrency.Election on the prefix key
// of the server at endpoint, with a session of TTL bound (0: the client's
// default, 60 s), and calls campaigning just before it waits.
func campaignEtcd(ctx context.Context, endpoint, key, value string, bound time.Duration, campaigning func()) (*term, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	var opts []concurrency.SessionOption
	if bound > 0 {
		opts = append(opts, concurrency.WithTTL(int(bound/time.Second)))
	}
	s, err := concurrency.NewSession(cli, opts...)
	if err != nil {
		return nil, err
	}
	el := concurrency.NewElection(s, key)
	campaigning()
	if err := el.Campaign(ctx, value); err != nil {
		return nil, err
	}
	return &term{resign: el.Resign, lost: s.Done()}, nil
}

// event is a line a candidate process reported.
type event struct {
	what string
	at   time.Time
}

// candidateProc is the parent's handle on a candidate process.
type candidateProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event // closed when its stdout does
	link   *freezer   // its connection to the server
}

// startCandidate starts a candidate process of system ("etcd" or
// "sqllock") that reaches its server through a freezer in front of target
// (host:port); addr turns the freezer's address into what the candidate
// dials (an endpoint, or a DSN).
func startCandidate(system, name, target string, addr func(hostPort string) string, key string, bound time.Duration) (*candidateProc, error) {
	link, err := newFreezer(target)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		link.Close()
		return nil, err
	}
	cmd := exec.Command(self)
	b := ""
	if bound > 0 {
		b = bound.String()
	}
	cmd.Env = append(os.Environ(), candidateEnv+"="+system, candidateAddr+"="+addr(link.Addr()),
		candidateKey+"="+key, candidateValue+"="+name, candidateBound+"="+b)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		link.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		link.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		link.Close()
		return nil, err
	}
	c := &candidateProc{name: name, cmd: cmd, stdin: stdin, events: make(chan event, 16), link: link}
	go func() {
		defer close(c.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			what, ns, ok := strings.Cut(sc.Text(), " ")
			n, err := strconv.ParseInt(ns, 10, 64)
			if ok && err == nil {
				c.events <- event{what, time.Unix(0, n)}
			}
		}
	}()
	return c, nil
}

// wait returns the time of c's next event what, skipping others, or an
// error after timeout or when c exits.
func (c *candidateProc) wait(what string, timeout time.Duration) (time.Time, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return time.Time{}, fmt.Errorf("candidate %s exited before %q", c.name, what)
			}
			if ev.what == what {
				return ev.at, nil
			}
		case <-t.C:
			return time.Time{}, fmt.Errorf("candidate %s: no %q within %v", c.name, what, timeout)
		}
	}
}

// resign asks c to resign.
func (c *candidateProc) resign() error {
	_, err := io.WriteString(c.stdin, "resign\n")
	return err
}

// kill ends c (stopped or not) with SIGKILL, and its link.
func (c *candidateProc) kill() {
	c.cmd.Process.Kill()
	c.stdin.Close()
	for range c.events { // its stdout closes as it dies
	}
	c.cmd.Wait()
	c.link.Close()
}
