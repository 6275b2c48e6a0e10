package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock"
)

// The cross-process handoff: a holder in this process releases a key that
// a waiter in another process (this program, executed again) waits for;
// the latency runs from just before the holder's Unlock to the waiter
// holding the key, both read from the machine's wall clock. It compares
// two builds of sqllock on one server when each build's binary runs in
// turn against the same DATABASE_URL:
//
//	go build -o /tmp/new . && (cd $OLD/bench && go build -o /tmp/old .)
//	for i in $(seq 10); do
//		SQLLOCK_BENCH_SAMPLES=/tmp/old.txt /tmp/old -xhandoff 60
//		SQLLOCK_BENCH_SAMPLES=/tmp/new.txt /tmp/new -xhandoff 60
//	done
//
// With SQLLOCK_BENCH_SAMPLES set, every sample (µs) is appended to that
// file, for the pooled median and p99 of each build.

// xhandoffEnv marks the waiter process.
const xhandoffEnv = "SQLLOCK_BENCH_XHANDOFF_WAITER"

// xhandoffKey is the key the holder and the waiter meet on.
var xhandoffKey = sqllock.Int64(4260)

// runXHandoff measures n handoffs to a waiter in another process, on the
// server of DATABASE_URL (pgx), and prints the median and p99.
func runXHandoff(n int, out io.Writer) error {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		return fmt.Errorf("-xhandoff needs DATABASE_URL (one server for the builds compared)")
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	l := sqllock.New(db)
	ctx := context.Background()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), xhandoffEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer cmd.Wait()
	defer stdin.Close()
	granted := bufio.NewScanner(stdout)
	var lat []time.Duration
	for range n {
		h, err := l.Lock(ctx, xhandoffKey)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdin, "wait")
		for { // the waiter waits in the server
			hs, err := sqllock.Inspect(ctx, db, nil, xhandoffKey)
			if err != nil {
				return err
			}
			if len(hs) == 2 && !hs[1].Granted {
				break
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond) // its wait statement is under way
		t0 := time.Now().UnixNano()
		if err := h.Unlock(ctx); err != nil {
			return err
		}
		if !granted.Scan() {
			return fmt.Errorf("the waiter process ended: %v", granted.Err())
		}
		t1, err := strconv.ParseInt(strings.TrimSpace(granted.Text()), 10, 64)
		if err != nil {
			return err
		}
		lat = append(lat, time.Duration(t1-t0))
	}
	if f := os.Getenv("SQLLOCK_BENCH_SAMPLES"); f != "" {
		// Every sample, in µs, for a pooled summary of interleaved runs.
		w, err := os.OpenFile(f, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		for _, d := range lat {
			fmt.Fprintf(w, "%.1f\n", float64(d)/1e3)
		}
		w.Close()
	}
	slices.Sort(lat)
	fmt.Fprintf(out, "handoffs to another process: %d, median %v, p99 %v\n", n, lat[n/2], lat[min(n-1, n*99/100)])
	return nil
}

// xhandoffWaiter is the waiter process: for each line on stdin it takes
// the key, prints when it held it (Unix nanoseconds), and releases it.
func xhandoffWaiter() int {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	l := sqllock.New(db)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		lk, err := l.Lock(context.Background(), xhandoffKey)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(time.Now().UnixNano())
		if err := lk.Unlock(context.Background()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}
