package pgtest

import (
	"context"
	"database/sql"
	"os"
	"sync"
	"testing"
	"time"
)

var shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Start returns the test binary's shared server, starting it on first use.
// When no PostgreSQL can be had, it skips tb, or fails it when the CI
// environment variable is "true". Call [Run] from TestMain so the server is
// stopped when the tests end.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb, nil)
}

// StartWith is [Start] with p as the last resort (see [EmbeddedWith]). The
// shared server is started by the first call of Start or StartWith.
func StartWith(tb testing.TB, p Provider) *Server {
	tb.Helper()
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.srv, shared.err = EmbeddedWith(ctx, p)
	})
	if shared.err != nil {
		Unavailable(tb, "PostgreSQL", shared.err)
	}
	return shared.srv
}

// Unavailable skips tb because component is missing, or fails it when
// CI=true: in CI every component the tests need must be there.
func Unavailable(tb testing.TB, component string, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s is required in CI (CI=true) but unavailable: %v", component, err)
	}
	tb.Skipf("%s unavailable, skipping: %v", component, err)
}

// Run runs the tests and then stops the shared server, if one was started.
// Use it as: func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }.
func Run(m *testing.M) int {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Close()
	}
	return code
}

// NewDatabase gives tb a database of its own, owned by the ordinary test
// role, and returns its DSN. When tb ends, the database's sessions are
// ended and it is dropped, or, when tb left no objects or settings in it,
// kept for a later NewDatabase under another name.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := s.takeDatabase(ctx, tb.Name())
	if name == "" {
		var err error
		if name, err = s.CreateDatabase(ctx, tb.Name()); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		name, kept := s.giveBack(ctx, name)
		if kept {
			return
		}
		if err := s.DropDatabase(ctx, name); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.DSNFor(name)
}

// Open opens a pool with driverName on dsn and closes it when tb ends.
func Open(tb testing.TB, driverName, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}
