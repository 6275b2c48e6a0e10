// Command sqlx-repository shows sqllock in a repository built on sqlx: a
// transaction-scoped lock makes "generate the daily report" run once, however
// many instances try at the same moment.
//
//	go run ./examples/sqlx-repository
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sqlx-repository:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer) error {
	dsn, stop, err := pgtest.DatabaseURL(ctx, w)
	if err != nil {
		return err
	}
	defer stop()
	db, err := sqlx.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, Schema); err != nil {
		return err
	}
	repo := NewReportRepo(db)
	day := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

	// Four app instances run the nightly job at the same moment.
	var wg sync.WaitGroup
	var out sync.Mutex
	errs := make(chan error, 4)
	for i := 1; i <= 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			generated, err := repo.GenerateDaily(ctx, day)
			if err != nil {
				errs <- err
				return
			}
			out.Lock()
			defer out.Unlock()
			fmt.Fprintf(w, "instance %d: generated=%v\n", i, generated)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	reports, err := repo.Reports(ctx)
	if err != nil {
		return err
	}
	for _, r := range reports {
		fmt.Fprintf(w, "report %s: %d posts\n", r.Day.Format(time.DateOnly), r.Posts)
	}
	// Inspect takes a *sqlx.DB too; nothing is left held.
	locks, err := sqllock.Inspect(ctx, db, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "advisory locks left: %d\n", len(locks))
	return nil
}
