package main

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/golang-migrate/migrate/v4/database"
	_ "github.com/golang-migrate/migrate/v4/database/pgx"
	_ "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/database/postgres"
	_ "github.com/golang-migrate/migrate/v4/source/file"
	"github.com/pressly/goose/v3/lock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
	"github.com/sqllock/sqllock/pgtest"
)

// TestGolangMigrateKeysMatchTheTool checks sqllock's golang-migrate keys
// against golang-migrate's own code, for both ways of opening its driver.
func TestGolangMigrateKeysMatchTheTool(t *testing.T) {
	for _, tc := range []struct{ database, schema, table string }{
		{"mydb", "public", "schema_migrations"},
		{"/mydb", "public", "schema_migrations"},
		{"/mydb", "app", "mig"},
	} {
		id, err := database.GenerateAdvisoryLockId(tc.database, tc.schema, tc.table)
		if err != nil {
			t.Fatal(err)
		}
		if got := interop.GolangMigrate(tc.database, tc.schema, tc.table).String(); got != id {
			t.Errorf("GolangMigrate(%q, %q, %q) = %s, golang-migrate says %s", tc.database, tc.schema, tc.table, got, id)
		}
	}
	if interop.Goose() != sqllock.Int64(lock.DefaultLockID) {
		t.Errorf("Goose() = %v, goose says %d", interop.Goose(), lock.DefaultLockID)
	}
}

// TestGolangMigrateWaitsForSqllock runs golang-migrate itself, opened from a
// URL with each of its PostgreSQL drivers and from a *sql.DB: while sqllock
// holds the key computed for that way of opening, golang-migrate must wait.
func TestGolangMigrateWaitsForSqllock(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "1_t.up.sql"), []byte("CREATE TABLE IF NOT EXISTS t (id int)"), 0o644); err != nil {
		t.Fatal(err)
	}
	source := "file://" + dir
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	with := func(scheme, table string) string {
		v := *u
		v.Scheme = scheme
		q := v.Query()
		q.Set("x-migrations-table", table)
		v.RawQuery = q.Encode()
		return v.String()
	}
	locker := sqllock.New(db)
	for _, tc := range []struct {
		name string
		key  func(t *testing.T) sqllock.Key
		open func() (*migrate.Migrate, error)
	}{
		{"postgres URL", urlKey(with("postgres", "m_pq")), func() (*migrate.Migrate, error) { return migrate.New(source, with("postgres", "m_pq")) }},
		{"pgx URL", urlKey(with("pgx", "m_pgx")), func() (*migrate.Migrate, error) { return migrate.New(source, with("pgx", "m_pgx")) }},
		{"pgx5 URL", urlKey(with("pgx5", "m_pgx5")), func() (*migrate.Migrate, error) { return migrate.New(source, with("pgx5", "m_pgx5")) }},
		{"WithInstance", func(t *testing.T) sqllock.Key {
			return interop.GolangMigrate(pgtest.DatabaseOf(dsn), "public", "m_inst")
		}, func() (*migrate.Migrate, error) {
			sdb, err := sql.Open("postgres", dsn)
			if err != nil {
				return nil, err
			}
			drv, err := postgres.WithInstance(sdb, &postgres.Config{MigrationsTable: "m_inst"})
			if err != nil {
				return nil, err
			}
			return migrate.NewWithDatabaseInstance(source, "postgres", drv)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lk, err := locker.Lock(context.Background(), tc.key(t))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				m, err := tc.open() // opening takes the lock (it ensures the version table)
				if err == nil {
					err = m.Up()
					if errors.Is(err, migrate.ErrNoChange) {
						err = nil
					}
					m.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				lk.Unlock(context.Background())
				t.Fatalf("golang-migrate ran while sqllock held its key (err %v): the keys differ", err)
			case <-time.After(700 * time.Millisecond):
			}
			if err := lk.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("golang-migrate after the release: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("golang-migrate still waits after sqllock released the key")
			}
		})
	}
}

func urlKey(u string) func(t *testing.T) sqllock.Key {
	return func(t *testing.T) sqllock.Key {
		k, err := interop.GolangMigrateURL(u)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
}
