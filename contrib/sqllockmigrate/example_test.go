package sqllockmigrate_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"os"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database/postgres"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockmigrate"
	"github.com/sqllock/sqllock/interop"
)

// The examples need a PostgreSQL server: the tests compile and vet them but
// do not run them (the same code runs against a real server in the
// package's tests).

// ExampleOpenPostgres runs golang-migrate's migrations (with CREATE INDEX
// CONCURRENTLY in them, one statement at a time) under sqllock's lock,
// waiting at most a minute for another instance's.
func ExampleOpenPostgres() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	drv, err := sqllockmigrate.OpenPostgres(ctx, sqllock.New(db),
		&postgres.Config{MultiStatementEnabled: true}, sqllockmigrate.WithWait(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	m, err := migrate.NewWithDatabaseInstance("file://migrations", "postgres", drv)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	m.LockTimeout = 2 * time.Minute // above the wait: the wait's own error comes back
	if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		log.Fatal(err)
	}
}

// ExampleWrap wraps a driver made another way: Lock and Unlock go through
// sqllock, with the key golang-migrate computes for it.
func ExampleWrap() {
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	inner, err := postgres.WithInstance(db, &postgres.Config{})
	if err != nil {
		log.Fatal(err)
	}
	key := interop.GolangMigrate("app", "public", "schema_migrations") // current_database(), current_schema(), the table
	m, err := migrate.NewWithDatabaseInstance("file://migrations", "postgres", sqllockmigrate.Wrap(inner, sqllock.New(db), key))
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
}
