package poolguard_test

import (
	"database/sql"
	"log"
	"testing"

	"github.com/sqllock/sqllock/poolguard"
)

func ExampleOpen() {
	db, err := poolguard.Open("pgx", "postgres://app@db/app",
		poolguard.WithPolicy(poolguard.Discard), // the default: close a leaking connection
		poolguard.OnLeak(func(l poolguard.Leak) {
			log.Printf("advisory lock leak on backend %d: %v (last: %q)", l.PID, l.Locks, l.LastQuery)
		}))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
}

func ExampleVerifyNone() {
	// In a test: fail if any session still holds an advisory lock.
	var t testing.TB
	var db *sql.DB
	defer poolguard.VerifyNone(t, db)
}
