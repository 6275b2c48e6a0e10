package sqllockmigrate

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/golang-migrate/migrate/v4/database"
	"github.com/golang-migrate/migrate/v4/database/postgres"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
)

// OpenPostgres opens golang-migrate's postgres driver (postgres.WithConnection)
// on a connection of l's own *sql.DB, pinned for the driver's life (a
// [sqllock.Session]'s), and wraps it. cfg is the driver's configuration
// (nil: the defaults); OpenPostgres fills it in as WithConnection does.
//
// Use it rather than Wrap around postgres.WithInstance or the driver's Open:
// the driver takes golang-migrate's lock itself while it opens (to create its
// version table), with pg_advisory_lock, the wait that deadlocks against
// another instance's CREATE INDEX CONCURRENTLY. OpenPostgres first takes
// the key on the pinned session, waiting as [Driver.Lock] does, so that
// the driver's own lock is granted at once (advisory locks are re-entrant
// within a session), then releases it.
//
// The key is golang-migrate's for cfg: the database is cfg.DatabaseName,
// or current_database() when it is empty, as in WithConnection; instances
// opened from a URL name the database by the URL's path, "/name", and take
// another key: give the same DatabaseName to all (see
// [interop.GolangMigrate]). ctx bounds the opening; the wait for another
// instance is bounded by [WithWait] too.
func OpenPostgres(ctx context.Context, l *sqllock.Locker, cfg *postgres.Config, opts ...Option) (*Driver, error) {
	if l == nil {
		panic("sqllockmigrate: OpenPostgres with a nil *sqllock.Locker")
	}
	if cfg == nil {
		cfg = &postgres.Config{}
	}
	probe := Wrap(nopDriver{}, l, sqllock.Key{}, opts...) // the options, read once
	s, err := l.Session(ctx)
	if err != nil {
		return nil, fmt.Errorf("sqllockmigrate: %w", err)
	}
	fail := func(err error) (*Driver, error) {
		return nil, errors.Join(fmt.Errorf("sqllockmigrate: %w", err), s.Close(context.Background()))
	}
	key, err := postgresKey(ctx, s, cfg)
	if err != nil {
		return fail(err)
	}
	wctx, cancel := context.WithTimeout(ctx, probe.wait)
	defer cancel()
	if err := lockOnSession(wctx, l, s, key); errors.Is(err, sqllock.ErrNotAcquired) {
		return fail(fmt.Errorf("lock %v not acquired within %v for the driver's opening: %w: %w", key, probe.wait, database.ErrLocked, err))
	} else if err != nil {
		return fail(fmt.Errorf("lock %v for the driver's opening: %w", key, err))
	}
	inner, err := postgres.WithConnection(ctx, s.Conn(), cfg)
	if err != nil {
		return fail(err)
	}
	if err := s.Unlock(context.Background(), key); err != nil {
		return nil, errors.Join(fmt.Errorf("sqllockmigrate: %w", err), inner.Close(), s.Close(context.Background()))
	}
	d := Wrap(inner, l, key, opts...)
	d.session = s
	return d, nil
}

// lockOnSession takes key on s without waiting in one statement: while
// another session holds it, it waits through l (in statements too short to
// hold up an index build), then tries again on s.
func lockOnSession(ctx context.Context, l *sqllock.Locker, s *sqllock.Session, key sqllock.Key) error {
	for {
		got, err := s.TryLock(ctx, key)
		if err != nil {
			return err
		}
		if len(got) == 1 {
			return nil
		}
		lk, err := l.Lock(ctx, key)
		if err != nil {
			return err
		}
		if err := lk.Unlock(context.Background()); err != nil {
			return err
		}
	}
}

// postgresKey returns golang-migrate's key for cfg, reading the current
// database and schema on s as postgres.WithConnection does.
func postgresKey(ctx context.Context, s *sqllock.Session, cfg *postgres.Config) (sqllock.Key, error) {
	var db, schema string
	if err := s.Conn().QueryRowContext(ctx, "SELECT current_database(), coalesce(current_schema(), '')").Scan(&db, &schema); err != nil {
		return sqllock.Key{}, err
	}
	if cfg.DatabaseName != "" {
		db = cfg.DatabaseName
	}
	if cfg.SchemaName != "" {
		schema = cfg.SchemaName
	}
	table := cfg.MigrationsTable
	if table == "" {
		table = postgres.DefaultMigrationsTable
	}
	if cfg.MigrationsTableQuoted {
		parts := quotedNames.FindAllStringSubmatch(table, -1)
		switch len(parts) {
		case 1:
			table = parts[0][1]
		case 2:
			schema, table = parts[0][1], parts[1][1]
		default:
			return sqllock.Key{}, fmt.Errorf("MigrationsTable %q is not \"table\" or \"schema\".\"table\"", table)
		}
	}
	return interop.GolangMigrate(db, schema, table), nil
}

// quotedNames finds the double-quoted names of a quoted migrations table.
var quotedNames = regexp.MustCompile(`"(.*?)"`)
