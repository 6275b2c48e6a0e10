package sqllockgocron_test

import (
	"context"
	"database/sql"
	"log"
	"os"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockgocron"
)

// The examples need a PostgreSQL server: the tests compile and vet them but
// do not run them (the same code runs against a real server in the
// package's tests).

func reindex() {}

// ExampleNewElector runs jobs on the leader's scheduler only; another
// instance takes over when the leader dies.
func ExampleNewElector() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	host, _ := os.Hostname()
	elector := sqllockgocron.NewElector(sqllock.New(db).Election(sqllock.Hash("gocron:leader")), host)
	go elector.Run(ctx) // campaigns until ctx ends

	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("*/5 * * * *", false), gocron.NewTask(reindex), gocron.WithName("reindex")); err != nil {
		log.Fatal(err)
	}
	s.Start()
}

// ExampleNewLocker runs each tick of a job on one scheduler: the lock is
// held for 4 minutes after each run of a job fired every 5 minutes, longer
// than any skew between the schedulers.
func ExampleNewLocker() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	locker := sqllockgocron.NewLocker(sqllock.New(db), sqllockgocron.WithHoldAtLeast(4*time.Minute))
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := s.NewJob(gocron.CronJob("*/5 * * * *", false), gocron.NewTask(reindex), gocron.WithName("reindex")); err != nil {
		log.Fatal(err)
	}
	s.Start()
}
