// Command pgtest starts a throwaway PostgreSQL server (local binaries, else
// Docker), prints a shell line that exports its DSN as DATABASE_URL, and
// keeps it running until interrupted; then it removes it.
//
//	go run github.com/sqllock/sqllock/pgtest/cmd/pgtest
//	export DATABASE_URL='postgres://sqllock:...@127.0.0.1:41234/sqllock?sslmode=disable'
//
// Paste the export line into another shell to use the server, for instance
// with the sqllock command.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sqllock/sqllock/pgtest"
)

func main() {
	superuser := flag.Bool("superuser", false, "print the DSN of a superuser (one that may create databases, as SQLLOCK_TEST_DSN needs)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	srv, err := pgtest.Embedded(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dsn := srv.DSN()
	if *superuser {
		dsn = srv.AdminDSN()
	}
	fmt.Printf("export DATABASE_URL='%s'\n", dsn)
	fmt.Fprintln(os.Stderr, "pgtest: server running; Ctrl-C stops and removes it")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	if err := srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
