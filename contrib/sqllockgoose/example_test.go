package sqllockgoose_test

import (
	"context"
	"database/sql"
	"log"
	"os"

	"github.com/pressly/goose/v3"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockgoose"
)

// The examples need a PostgreSQL server: the tests compile and vet them but
// do not run them (the same code runs against a real server in the
// package's tests).

// Example runs goose's migrations under sqllock's lock on goose's own key:
// instances that still use goose's default locker wait for it too.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, os.DirFS("migrations"),
		goose.WithSessionLocker(sqllockgoose.New(sqllock.New(db))))
	if err != nil {
		log.Fatal(err)
	}
	// The wait for another instance's migrations ends with ctx.
	if _, err := p.Up(ctx); err != nil {
		log.Fatal(err)
	}
}

// ExampleWithKey takes the key that goose's own lockers take when they are
// given lock.WithLockID(42).
func ExampleWithKey() {
	var db *sql.DB // opened with any PostgreSQL driver
	l := sqllockgoose.New(sqllock.New(db), sqllockgoose.WithKey(sqllock.Int64(42)))
	_, _ = goose.NewProvider(goose.DialectPostgres, db, os.DirFS("migrations"), goose.WithLocker(l))
}
