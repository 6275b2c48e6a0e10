// Command pgdocker starts a throwaway PostgreSQL server as the pgtest
// command does, with a Docker container as the last resort
// (SQLLOCK_TEST_SERVER=docker: always), prints a shell line that exports
// its DSN as DATABASE_URL, and keeps it running until interrupted; then it
// removes it.
//
//	go run github.com/sqllock/sqllock/pgtest/pgdocker/cmd/pgdocker@latest -superuser
//	export DATABASE_URL='postgres://postgres:...@127.0.0.1:32771/sqllock?sslmode=disable'
//
// A superuser's DSN (-superuser) serves as SQLLOCK_TEST_DSN, so that tests
// that use pgtest alone run against the container.
package main

import (
	"os"

	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/pgtest/pgdocker"
)

func main() { os.Exit(pgtest.Command(pgdocker.Provider, os.Args[1:])) }
