// Command gocron runs a go-co-op/gocron v2 scheduler whose jobs each run on
// one instance at a time, with sqllock as gocron's distributed Locker. Two
// schedulers (two "instances") share one database; a slow job never runs
// twice at once.
//
//	cd examples/gocron && go run .
//
// It has a go.mod of its own, so that gocron does not become a dependency
// of the sqllock module.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// Locker adapts a sqllock.Locker to gocron.Locker: a job runs only if its
// lock, the hash of "gocron:" + the job's name, is free. *sqllock.Lock is
// already a gocron.Lock.
type Locker struct{ L *sqllock.Locker }

// Lock implements gocron.Locker. An error (the lock is held elsewhere, or
// the database is unreachable) makes gocron skip this run.
func (g Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	lk, err := g.L.TryLock(ctx, sqllock.Hash("gocron:"+key))
	if err != nil {
		return nil, err
	}
	return lk, nil
}

var _ gocron.Locker = Locker{}

func main() {
	if err := run(context.Background(), os.Stdout, 4*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "gocron:", err)
		os.Exit(1)
	}
}

// stats records the runs of the demo job.
type stats struct {
	inside, maxInside, runs atomic.Int64
}

func run(ctx context.Context, w io.Writer, d time.Duration) error {
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

	var st stats
	var out sync.Mutex
	var schedulers []gocron.Scheduler
	defer func() {
		for _, s := range schedulers {
			s.Shutdown()
		}
	}()
	for _, instance := range []string{"A", "B"} {
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(Locker{sqllock.New(db)}))
		if err != nil {
			return err
		}
		_, err = s.NewJob(gocron.DurationJob(500*time.Millisecond), gocron.NewTask(func() {
			n := st.inside.Add(1)
			if n > st.maxInside.Load() {
				st.maxInside.Store(n)
			}
			st.runs.Add(1)
			out.Lock()
			fmt.Fprintf(w, "instance %s: reindexing\n", instance)
			out.Unlock()
			time.Sleep(700 * time.Millisecond) // slower than the schedule
			st.inside.Add(-1)
		}), gocron.WithName("reindex"))
		if err != nil {
			return err
		}
		schedulers = append(schedulers, s)
		s.Start()
	}
	time.Sleep(d)
	for _, s := range schedulers { // waits for running jobs
		if err := s.Shutdown(); err != nil {
			return err
		}
	}
	schedulers = nil
	out.Lock()
	defer out.Unlock()
	fmt.Fprintf(w, "runs: %d, most at once: %d\n", st.runs.Load(), st.maxInside.Load())
	return nil
}
