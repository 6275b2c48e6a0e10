// Command quickstart is the README's first example, as a program: the cron
// pattern against the server in DATABASE_URL.
//
//	go run ./examples/quickstart
//
// With DATABASE_URL unset, it starts a throwaway PostgreSQL from the local
// binaries first (throwaway.go), as the other examples do; the program
// below, which the README prints, is what a reader writes.
package main

import (
	"context"
	"database/sql"
	"log"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/sqllock/sqllock"
)

func main() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	locker := sqllock.New(db)

	// The cron pattern: if the previous run is still going, back out.
	ran, err := locker.TryDo(ctx, sqllock.Hash("cron:reindex_posts"), func(ctx context.Context) error {
		return reindexPosts(ctx) // ctx is cancelled if the lock is lost
	})
	switch {
	case err != nil:
		log.Fatal(err)
	case !ran:
		log.Print("another reindex is running: skipping")
	}
}

func reindexPosts(ctx context.Context) error {
	log.Print("reindexing posts")
	return nil
}
