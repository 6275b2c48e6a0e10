// Command leader shows leader election across processes: three candidate
// processes campaign in one Election; one leads, and each term's writes
// carry its fencing token. When the leader's database session is killed,
// its term's context ends with the loss, a waiting candidate is elected at
// once, and the old leader campaigns again.
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
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

var electionKey = sqllock.Hash("leader:scheduler")

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

// candidateMain leads, or waits to, until ctx ends: as leader, it does
// fenced work until its term ends.
func candidateMain(ctx context.Context, n int, dsn string, w io.Writer) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	election := sqllock.New(db, sqllock.WithKeepAlive(200*time.Millisecond)).Election(electionKey)
	// Lead campaigns (waiting in the server), runs the function for each
	// term, and campaigns again, after a pause, when a term is lost.
	err = election.Lead(ctx, fmt.Sprintf("candidate-%d", n), func(ctx context.Context, term *sqllock.Lock) error {
		token, err := term.Token(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "candidate %d: I am the leader (token %d)\n", n, token)
		// Every write of the term carries the token: a deposed leader
		// that has not noticed yet cannot overwrite its successor's.
		if _, err := db.ExecContext(ctx, "UPDATE schedule SET leader = $1, fence = $2 WHERE fence <= $2", n, token); err != nil {
			return err
		}
		<-ctx.Done() // the term's work would run here, until the term ends
		if cause := context.Cause(ctx); errors.Is(cause, sqllock.ErrLockLost) {
			fmt.Fprintf(w, "candidate %d: lost leadership: %v\n", n, cause)
		} else {
			fmt.Fprintf(w, "candidate %d: stepping down\n", n)
		}
		return ctx.Err()
	})
	if errors.Is(err, context.Canceled) {
		return nil // SIGTERM: resigned
	}
	return err
}

// run starts three candidate processes, kills the first leader's session
// once another waits, and waits for another candidate to lead.
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schedule (leader int, fence bigint NOT NULL);
		INSERT INTO schedule SELECT 0, 0 WHERE NOT EXISTS (SELECT FROM schedule)`); err != nil {
		return err
	}
	lines := make(chan string, 64)
	for i := 1; i <= 3; i++ {
		cmd := exec.Command(os.Args[0], "-candidate", strconv.Itoa(i))
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
		go func() {
			for sc := bufio.NewScanner(out); sc.Scan(); {
				lines <- sc.Text()
			}
		}()
	}
	// Anyone can ask who leads, without campaigning.
	election := sqllock.New(db).Election(electionKey)
	var first, second sqllock.Leader
	sawLoss := false
	announced := map[string]bool{} // candidates that said they lead
	for deadline := time.Now().Add(60 * time.Second); second.PID == 0 || !sawLoss; {
		if time.Now().After(deadline) {
			return errors.New("leadership did not move within 60s")
		}
		select {
		case l := <-lines:
			fmt.Fprintln(w, l)
			sawLoss = sawLoss || first.PID != 0 && strings.HasPrefix(l, name(first)+": lost leadership")
			if who, _, ok := strings.Cut(l, ": I am the leader ("); ok {
				announced[who] = true
			}
		case <-time.After(20 * time.Millisecond):
		}
		ld, err := election.Leader(ctx)
		switch {
		case err != nil || ld.PID == 0:
		case first.PID == 0 && !announced[name(ld)]: // granted, not yet told
		case first.PID == 0 && !otherWaits(ctx, db, ld):
			// Not yet: the others are still starting (a loaded machine).
			// The leader's session ends once another candidate waits in
			// the server, which then grants it the lock at once.
		case first.PID == 0:
			first = ld
			fmt.Fprintf(w, "demo: %v leads; killing its database session\n", first)
			if _, err := db.ExecContext(ctx, "SELECT pg_terminate_backend($1)", first.PID); err != nil {
				return err
			}
		case second.PID == 0 && ld.PID != first.PID:
			second = ld
		}
	}
	fmt.Fprintf(w, "demo: leadership moved from %s to %s\n", name(first), name(second))
	return nil
}

// otherWaits reports whether a candidate other than ld waits for the
// election's key in the server.
func otherWaits(ctx context.Context, db *sql.DB, ld sqllock.Leader) bool {
	locks, err := sqllock.Inspect(ctx, db, nil, electionKey)
	if err != nil {
		return false
	}
	for _, l := range locks {
		if !l.Granted && l.PID != ld.PID {
			return true
		}
	}
	return false
}

// name returns "candidate N" for a leader whose value is "candidate-N".
func name(ld sqllock.Leader) string { return strings.Replace(ld.Value, "-", " ", 1) }
