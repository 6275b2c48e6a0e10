package pgtest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Command is the main function of the pgtest and pgdocker commands: it
// starts a throwaway server ([EmbeddedWith] p), prints a shell line that
// exports its DSN as DATABASE_URL (a superuser's with -superuser, as
// SQLLOCK_TEST_DSN needs), keeps it running until SIGINT or SIGTERM, then
// removes it. It returns the process's exit code.
func Command(p Provider, args []string) int {
	fs := flag.NewFlagSet("pgtest", flag.ContinueOnError)
	superuser := fs.Bool("superuser", false, "print the DSN of a superuser (one that may create databases, as SQLLOCK_TEST_DSN needs)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	srv, err := EmbeddedWith(ctx, p)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
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
		return 1
	}
	return 0
}
