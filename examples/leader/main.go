// Command leader shows leader election across processes with a session
// lock: three candidate processes wait for one key; the holder leads. When
// the leader's database session is killed, its Lock reports the loss
// (Done), it steps down, and a waiting candidate takes over at once.
//
//	go run ./examples/leader
package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

var leaderKey = sqllock.HashPair(7, "leader:scheduler")

func main() {
	candidate := flag.Int("candidate", 0, "run as candidate N (used by the demo itself)")
	flag.Parse()
	var err error
	if *candidate > 0 {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		err = candidateMain(ctx, *candidate, os.Getenv("DATABASE_URL"), os.Stdout)
	} else {
		err = run(context.Background(), os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "leader:", err)
		os.Exit(1)
	}
}

// candidateMain campaigns for leadership until ctx ends.
func candidateMain(ctx context.Context, n int, dsn string, w io.Writer) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	locker := sqllock.New(db, sqllock.WithKeepAlive(200*time.Millisecond))
	for ctx.Err() == nil {
		lk, err := locker.Lock(ctx, leaderKey) // waits in the server
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(w, "candidate %d: %v; retrying\n", n, err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		fmt.Fprintf(w, "candidate %d: I am the leader (backend %d)\n", n, lk.PID())
		select {
		case <-lk.Done(): // the lock is gone: stop leading at once
			fmt.Fprintf(w, "candidate %d: lost leadership: %v\n", n, lk.Err())
			lk.Unlock(context.Background())
			time.Sleep(time.Second) // let a waiting candidate take over
		case <-ctx.Done():
			lk.Unlock(context.Background())
			fmt.Fprintf(w, "candidate %d: stepping down\n", n)
		}
	}
	return nil
}

var leaderLine = regexp.MustCompile(`^candidate (\d+): I am the leader \(backend (\d+)\)`)

// run starts three candidate processes, kills the first leader's session,
// and waits for another candidate to lead.
func run(ctx context.Context, w io.Writer) error {
	dsn, stop, err := pgtest.DatabaseURL(ctx, w)
	if err != nil {
		return err
	}
	defer stop()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()

	lines := make(chan string, 16)
	var children []*exec.Cmd
	var readers sync.WaitGroup
	defer func() {
		for _, c := range children {
			c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range children {
			c.Wait()
		}
		readers.Wait()
	}()
	for i := 1; i <= 3; i++ {
		cmd := exec.Command(os.Args[0], "-candidate", strconv.Itoa(i))
		cmd.Env = append(os.Environ(), "DATABASE_URL="+withAppName(dsn, fmt.Sprintf("leader-candidate-%d", i)))
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		children = append(children, cmd)
		readers.Add(1)
		go func() {
			defer readers.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				select {
				case lines <- sc.Text():
				default: // nobody listens any more
				}
			}
		}()
	}

	first, pid, err := waitLeader(w, lines)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "demo: killing the leader's database session (backend %d)\n", pid)
	if _, err := db.ExecContext(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		return err
	}
	// Wait for both: the old leader noticing its loss, and a new leader.
	lost := fmt.Sprintf("candidate %d: lost leadership", first)
	second, sawLoss := 0, false
	timeout := time.After(30 * time.Second)
	for second == 0 || !sawLoss {
		select {
		case l := <-lines:
			fmt.Fprintln(w, l)
			sawLoss = sawLoss || strings.HasPrefix(l, lost)
			if m := leaderLine.FindStringSubmatch(l); m != nil && m[1] != strconv.Itoa(first) {
				second, _ = strconv.Atoi(m[1])
			}
		case <-timeout:
			return errors.New("leadership did not move within 30s")
		}
	}
	fmt.Fprintf(w, "demo: leadership moved from candidate %d to candidate %d\n", first, second)
	return nil
}

// waitLeader echoes candidate output until a candidate announces it leads.
func waitLeader(w io.Writer, lines <-chan string) (n, pid int, err error) {
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l := <-lines:
			fmt.Fprintln(w, l)
			if m := leaderLine.FindStringSubmatch(l); m != nil {
				n, _ = strconv.Atoi(m[1])
				pid, _ = strconv.Atoi(m[2])
				return n, pid, nil
			}
		case <-timeout:
			return 0, 0, errors.New("no leader within 30s")
		}
	}
}

func withAppName(dsn, name string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme == "" {
		return dsn + " application_name=" + name
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}
