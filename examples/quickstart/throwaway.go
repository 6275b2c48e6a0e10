package main

import (
	"context"
	"log"
	"os"

	"github.com/sqllock/sqllock/pgtest"
)

// init gives main, the README's program, a server when DATABASE_URL is
// unset, so that `go run ./examples/quickstart` needs no setup, as the
// other examples: a throwaway PostgreSQL from the local binaries (see
// pgtest.Embedded), whose URL it puts in DATABASE_URL. The server stops,
// and its files go, when the program exits, however it exits (main ends
// with log.Fatal's os.Exit on an error, which runs no deferred call): a
// process of pgtest's own watches for that.
func init() {
	if os.Getenv("DATABASE_URL") != "" {
		return
	}
	dsn, _, err := pgtest.DatabaseURL(context.Background(), os.Stderr)
	if err != nil {
		log.Fatal(err)
	}
	os.Setenv("DATABASE_URL", dsn)
}
