package poolguard_test

import (
	"database/sql"
	"log"
	"testing"

	"github.com/sqllock/sqllock/poolguard"
)

// ExampleOpen needs a server, so it is compiled and vetted but not run.
func ExampleOpen() {
	db, err := poolguard.Open("pgx", "postgres://app@db/app",
		poolguard.WithPolicy(poolguard.Discard), // the default: close a leaking connection
		poolguard.WithOnLeak(func(l poolguard.Leak) {
			log.Printf("advisory lock leak on backend %d: %v (last: %q)", l.PID, l.Locks, l.LastQuery)
		}))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
}

// VerifyNone at the end of a test fails it if any session of the database
// still holds an advisory lock.
func ExampleVerifyNone() {
	testJobs := func(t *testing.T, db *sql.DB) {
		defer poolguard.VerifyNone(t, db)
		// ... code that takes and releases advisory locks through db ...
	}
	_ = testJobs
	// Output:
}
