// Command pgtest starts a throwaway PostgreSQL server (the one of
// SQLLOCK_TEST_DSN, else a cluster of the local binaries), prints a shell
// line that exports its DSN as DATABASE_URL, and keeps it running until
// interrupted; then it removes it. With Docker instead of local binaries,
// use the pgdocker command of github.com/sqllock/sqllock/pgtest/pgdocker.
//
//	go run github.com/sqllock/sqllock/pgtest/cmd/pgtest@latest
//	export DATABASE_URL='postgres://sqllock:...@127.0.0.1:41234/sqllock?sslmode=disable'
//
// Paste the export line into another shell to use the server, for instance
// with the sqllock command. -superuser prints a superuser's DSN.
package main

import (
	"os"

	"github.com/sqllock/sqllock/pgtest"
)

func main() { os.Exit(pgtest.Command(nil, os.Args[1:])) }
