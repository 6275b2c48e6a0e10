package sqllockgoose_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockgoose"
	"github.com/sqllock/sqllock/interop"
	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

// migrations are three SQL migrations that fail when they run twice (a
// table created without IF NOT EXISTS) and record each run in applied,
// each slow enough (pg_sleep) that two unexcluded Providers overlap.
var migrations = fstest.MapFS{
	"00001_a.sql": {Data: []byte("-- +goose Up\nCREATE TABLE a (id int);\nINSERT INTO applied VALUES (1);\nSELECT pg_sleep(0.1);\n")},
	"00002_b.sql": {Data: []byte("-- +goose Up\nCREATE TABLE b (id int);\nINSERT INTO applied VALUES (2);\nSELECT pg_sleep(0.1);\n")},
	"00003_c.sql": {Data: []byte("-- +goose Up\nCREATE TABLE c (id int);\nINSERT INTO applied VALUES (3);\n")},
}

// newDatabase returns the DSN of a fresh database with the applied table
// and goose's version table, as a database looks after its first deploy
// (on a database without it, goose's Providers retry its creation a second
// later, which keeps them apart without any lock).
func newDatabase(t *testing.T) string {
	t.Helper()
	dsn := pgtest.Start(t).NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	if _, err := db.Exec("CREATE TABLE applied (version int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.GetDBVersion(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// instance is one deploy: a pool of its own (as another process would have),
// and a goose Provider that locks with locker.
func instance(t *testing.T, dsn string, locker func(db *sql.DB) goose.ProviderOption, opts ...goose.ProviderOption) *goose.Provider {
	t.Helper()
	db := pgtest.Open(t, "pgx", dsn)
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations, append(opts, locker(db))...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func withSqllock(db *sql.DB) goose.ProviderOption {
	return goose.WithSessionLocker(sqllockgoose.New(sqllock.New(db)))
}

func withSqllockLocker(db *sql.DB) goose.ProviderOption {
	return goose.WithLocker(sqllockgoose.New(sqllock.New(db)))
}

// withGoose is goose's own session locker with its default key; it polls
// every second instead of every 5 s, so that the test is shorter.
func withGoose(*sql.DB) goose.ProviderOption {
	l, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		panic(err)
	}
	return goose.WithSessionLocker(l)
}

// checkOnce fails t unless every migration ran exactly once, by the
// database's own record and goose's.
func checkOnce(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, q := range []string{
		"SELECT count(*), count(DISTINCT version), coalesce(sum(version), 0) FROM applied",
		"SELECT count(*), count(DISTINCT version_id), coalesce(sum(version_id), 0) FROM goose_db_version WHERE version_id > 0",
	} {
		var n, distinct, sum int
		if err := db.QueryRow(q).Scan(&n, &distinct, &sum); err != nil {
			t.Fatal(err)
		}
		if n != 3 || distinct != 3 || sum != 6 {
			t.Errorf("%s = %d rows, %d distinct, sum %d; want each of 1, 2, 3 once", q, n, distinct, sum)
		}
	}
}

// TestTwoProvidersAtOnce: two instances, each with its own pool and
// sqllock Locker, migrate one database at the same moment, ten times (a
// fresh database each time): every migration is applied once, by one of
// them, and neither fails. Without exclusion both would run migration 1
// (CREATE TABLE a) and one would fail. Both of goose's options are tried.
func TestTwoProvidersAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		locker func(*sql.DB) goose.ProviderOption
	}{{"WithSessionLocker", withSqllock}, {"WithLocker", withSqllockLocker}} {
		t.Run(tc.name, func(t *testing.T) {
			for run := range 10 {
				t.Run(fmt.Sprint(run), func(t *testing.T) {
					dsn := newDatabase(t)
					ps := []*goose.Provider{instance(t, dsn, tc.locker), instance(t, dsn, tc.locker)}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					start := make(chan struct{})
					applied := make([]int, len(ps))
					errs := make([]error, len(ps))
					var wg sync.WaitGroup
					for i, p := range ps {
						wg.Go(func() {
							<-start
							res, err := p.Up(ctx)
							applied[i], errs[i] = len(res), err
						})
					}
					close(start)
					wg.Wait()
					for i, err := range errs {
						if err != nil {
							t.Errorf("instance %d: Up() = %v", i, err)
						}
					}
					if applied[0]+applied[1] != 3 {
						t.Errorf("applied %d and %d migrations; want 3 in all", applied[0], applied[1])
					}
					checkOnce(t, pgtest.Open(t, "pgx", dsn))
					t.Logf("applied: %d and %d", applied[0], applied[1])
				})
			}
		})
	}
}

// TestExcludesPlainGoose: an instance with this package and one with
// goose's own session locker (its default key) exclude each other, in both
// orders. The first stops in a Go migration until the test lets it go; the
// second is seen waiting (goose's locker: its pg_try_advisory_lock refused;
// this package's: its wait in pg_locks) and must not finish before the
// first; then it finds nothing left to apply.
func TestExcludesPlainGoose(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second func(*sql.DB) goose.ProviderOption
		waiting       string // a query that finds the second waiting
	}{
		{"sqllock holds, goose waits", withSqllock, withGoose,
			`SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT pg_try_advisory_lock%'`},
		{"goose holds, sqllock waits", withGoose, withSqllock,
			`SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := newDatabase(t)
			entered, release := make(chan struct{}), make(chan struct{})
			gate := goose.NewGoMigration(4, &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
				close(entered)
				select {
				case <-release:
					_, err := tx.ExecContext(ctx, "INSERT INTO applied VALUES (4)")
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}}, nil)
			first := instance(t, dsn, tc.first, goose.WithGoMigrations(gate))
			second := instance(t, dsn, tc.second, goose.WithGoMigrations(
				goose.NewGoMigration(4, &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
					return errors.New("the second instance ran migration 4")
				}}, nil)))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			type result struct {
				applied int
				err     error
			}
			up := func(p *goose.Provider) <-chan result {
				c := make(chan result, 1)
				go func() {
					res, err := p.Up(ctx)
					c <- result{len(res), err}
				}()
				return c
			}
			firstDone := up(first)
			select {
			case <-entered:
			case r := <-firstDone:
				t.Fatalf("the first instance ended before its gate: %+v", r)
			}
			secondDone := up(second)
			db := pgtest.Open(t, "pgx", dsn)
			for seen := false; !seen; {
				select {
				case r := <-secondDone:
					close(release)
					t.Fatalf("the second instance finished while the first held the lock: %+v", r)
				case <-ctx.Done():
					t.Fatal("the second instance was never seen waiting")
				case <-time.After(5 * time.Millisecond):
				}
				if err := db.QueryRow(tc.waiting).Scan(&seen); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case r := <-secondDone:
				t.Fatalf("the second instance finished while the first held the lock: %+v", r)
			default:
			}
			close(release)
			r1, r2 := <-firstDone, <-secondDone
			if r1.err != nil || r1.applied != 4 {
				t.Errorf("first: applied %d, %v; want 4, nil", r1.applied, r1.err)
			}
			if r2.err != nil || r2.applied != 0 {
				t.Errorf("second: applied %d, %v; want 0, nil", r2.applied, r2.err)
			}
			var n int
			if err := db.QueryRow("SELECT count(*) FROM applied").Scan(&n); err != nil || n != 4 {
				t.Errorf("applied has %d rows (%v); want 4", n, err)
			}
		})
	}
}

// TestKeyIsGoose: the Locker takes goose's default key unless told
// otherwise, and a cancelled wait returns ErrNotAcquired with the
// context's error.
func TestKeyIsGoose(t *testing.T) {
	dsn := pgtest.Start(t).NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	l := sqllock.New(db)
	if got := sqllockgoose.New(l).Key(); got != sqllock.Int64(lock.DefaultLockID) || got != interop.Goose() {
		t.Errorf("Key() = %v, want goose's %d", got, lock.DefaultLockID)
	}
	g := sqllockgoose.New(l, sqllockgoose.WithKey(sqllock.Int64(7)))
	if g.Key() != sqllock.Int64(7) {
		t.Errorf("Key() = %v, want 7", g.Key())
	}
	ctx := context.Background()
	held, err := l.Lock(ctx, sqllock.Int64(7))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = g.Lock(short, db)
	if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lock() on a held key = %v, want ErrNotAcquired and DeadlineExceeded", err)
	}
	if err := g.Unlock(ctx, db); !errors.Is(err, sqllock.ErrReleased) {
		t.Errorf("Unlock() without a lock = %v, want ErrReleased", err)
	}
}
