// Command cron is the cron pattern made real: three runs
// of the same cron job start at once, and only one of them does the work.
// The others see the lock taken and back out at once.
//
//	go run ./examples/cron
//
// It uses the server in DATABASE_URL, or starts a throwaway PostgreSQL from
// the local binaries when DATABASE_URL is unset.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// The team's lock names, in one registry: a second name for the same key
// would panic here, at start-up, instead of silently sharing a lock.
var (
	locks   = sqllock.NewRegistry()
	reindex = locks.MustRegister("cron:reindex_posts", sqllock.Hash("cron:reindex_posts"))
)

func main() {
	if err := run(context.Background(), os.Stdout, time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "cron:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer, work time.Duration) error {
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
	locker := sqllock.New(db, locks)

	// Three cron runs start at the same moment, as if on three machines.
	results := make([]bool, 3)
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(results))
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ran, err := locker.TryDo(ctx, reindex, func(ctx context.Context) error {
				say("run %d: got the lock, doing work...", i+1)
				select {
				case <-time.After(work): // reindex posts here
				case <-ctx.Done(): // the lock was lost: stop
					return context.Cause(ctx)
				}
				say("run %d: work done", i+1)
				return nil
			})
			if err != nil {
				errs <- err
				return
			}
			if !ran {
				say("run %d: lock %s not available, skipping", i+1, reindex)
			}
			results[i] = ran
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	say("Results: %v", results)
	return nil
}
