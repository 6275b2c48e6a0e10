// Command migrate shows migrations that wait their turn: three deploys
// start at once, each runs the migrations under one blocking advisory lock.
// The first applies them; the others wait, then find nothing left to do.
//
//	go run ./examples/migrate
//
// The key is goose's (interop.Goose()), so these migrations also exclude a
// concurrent `goose up` on the same database.
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
	"github.com/sqllock/sqllock/interop"
	"github.com/sqllock/sqllock/pgtest"
)

// migrations are applied in order; schema_version records how many ran.
var migrations = []string{
	`CREATE TABLE posts (id bigserial PRIMARY KEY, body text NOT NULL)`,
	`ALTER TABLE posts ADD COLUMN indexed_at timestamptz`,
	`CREATE INDEX posts_unindexed ON posts (id) WHERE indexed_at IS NULL`,
}

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
}

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
	locker := sqllock.New(db)

	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			applied, err := migrate(ctx, locker, db)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			fmt.Fprintf(w, "deploy %d: applied %d migration(s) after %v\n", i, applied, time.Since(start).Round(time.Millisecond))
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	var version int
	if err := db.QueryRowContext(ctx, "SELECT version FROM schema_version").Scan(&version); err != nil {
		return err
	}
	fmt.Fprintf(w, "schema version: %d\n", version)
	return nil
}

// migrate applies the pending migrations while holding the migration lock,
// waiting up to a minute for another deploy to finish its own.
func migrate(ctx context.Context, locker *sqllock.Locker, db *sql.DB) (applied int, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = locker.Do(ctx, interop.Goose(), func(ctx context.Context) error {
		if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version int NOT NULL)`); err != nil {
			return err
		}
		var version int
		err := db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&version)
		if err == sql.ErrNoRows {
			_, err = db.ExecContext(ctx, `INSERT INTO schema_version VALUES (0)`)
		}
		if err != nil {
			return err
		}
		for _, m := range migrations[version:] {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, m); err != nil {
				tx.Rollback()
				return fmt.Errorf("migration %d: %w", version+1, err)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = version + 1`); err != nil {
				tx.Rollback()
				return err
			}
			if err := tx.Commit(); err != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond) // a slow migration: the others wait
			version++
			applied++
		}
		return nil
	})
	return applied, err
}
