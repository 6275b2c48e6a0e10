package sqllockmock_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/sqllockmock"
)

// The unit test of docs/guide.md ("Testing"): the guide's block is a copy
// of TestReindexJob, and TestReindexJobWithPostgres runs the same code
// against a real server.

// reindexJob is the code under test: the cron pattern, with a statement
// under the lock.
func reindexJob(ctx context.Context, locker *sqllock.Locker, db *sql.DB) (bool, error) {
	return locker.TryDo(ctx, sqllock.Hash("cron:reindex_posts"), func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, "UPDATE posts SET indexed = true")
		return err
	})
}

func TestReindexJob(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// No keep-alive query at an unpredictable moment.
	locker := sqllock.New(db, sqllock.WithKeepAlive(0))
	key := sqllock.Hash("cron:reindex_posts")
	sqllockmock.ExpectServerCheck(mock) // once per Locker and connection (a mock has one), before its first session lock
	sqllockmock.ExpectTryLock(mock, key, true)
	mock.ExpectExec("UPDATE posts").WillReturnResult(sqlmock.NewResult(0, 3))
	sqllockmock.ExpectUnlock(mock, key)
	ran, err := reindexJob(context.Background(), locker, db)
	if !ran || err != nil {
		t.Fatalf("reindexJob() = %v, %v; want true, nil", ran, err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

// TestReindexJobAnyContext: TestReindexJob's expectations hold whatever
// context the code under test is given.
func TestReindexJobAnyContext(t *testing.T) {
	for _, c := range contexts {
		t.Run(c.name, func(t *testing.T) {
			db, mock, err := sqlmock.New()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			locker := sqllock.New(db, sqllock.WithKeepAlive(0))
			key := sqllock.Hash("cron:reindex_posts")
			sqllockmock.ExpectServerCheck(mock)
			sqllockmock.ExpectTryLock(mock, key, true)
			mock.ExpectExec("UPDATE posts").WillReturnResult(sqlmock.NewResult(0, 3))
			sqllockmock.ExpectUnlock(mock, key)
			ran, err := reindexJob(c.ctx(t), locker, db)
			if !ran || err != nil {
				t.Fatalf("reindexJob() under a %s context = %v, %v; want true, nil", c.name, ran, err)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestReindexJobWithPostgres: the code under TestReindexJob, with the
// same Locker, against a real server.
func TestReindexJobWithPostgres(t *testing.T) {
	db := pgtest.Open(t, "pgx", pgtest.Start(t).NewDatabase(t))
	if _, err := db.Exec("CREATE TABLE posts (indexed bool NOT NULL DEFAULT false)"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO posts DEFAULT VALUES"); err != nil {
		t.Fatal(err)
	}
	locker := sqllock.New(db, sqllock.WithKeepAlive(0))
	ran, err := reindexJob(context.Background(), locker, db)
	if !ran || err != nil {
		t.Fatalf("reindexJob() = %v, %v; want true, nil", ran, err)
	}
	var indexed bool
	if err := db.QueryRow("SELECT bool_and(indexed) FROM posts").Scan(&indexed); err != nil || !indexed {
		t.Fatalf("posts indexed: %v, %v", indexed, err)
	}
	if locks, err := sqllock.Inspect(context.Background(), db, nil); err != nil || len(locks) != 0 {
		t.Fatalf("locks left: %v, %v", locks, err)
	}
}

// TestReindexJobTwice: the expectations are the same for the second lock
// of a Locker, which finds its shared session still open, and for a Locker
// made WithDedicatedSessions, whose every lock has a session of its own.
// The server check comes once per Locker and connection: a second Locker
// on the same mock sends it again.
func TestReindexJobTwice(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []sqllock.Option
	}{
		{"default", nil},
		{"dedicated", []sqllock.Option{sqllock.WithDedicatedSessions()}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db, mock, err := sqlmock.New()
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			locker := sqllock.New(db, append(tt.opts, sqllock.WithKeepAlive(0))...)
			key := sqllock.Hash("cron:reindex_posts")
			sqllockmock.ExpectServerCheck(mock)
			for range 2 {
				sqllockmock.ExpectTryLock(mock, key, true)
				mock.ExpectExec("UPDATE posts").WillReturnResult(sqlmock.NewResult(0, 3))
				sqllockmock.ExpectUnlock(mock, key)
			}
			for i := range 2 {
				ran, err := reindexJob(context.Background(), locker, db)
				if !ran || err != nil {
					t.Fatalf("reindexJob() #%d = %v, %v; want true, nil", i+1, ran, err)
				}
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Fatal(err)
			}
			other := sqllock.New(db, append(tt.opts, sqllock.WithKeepAlive(0))...)
			sqllockmock.ExpectServerCheck(mock)
			sqllockmock.ExpectTryLock(mock, key, true)
			mock.ExpectExec("UPDATE posts").WillReturnResult(sqlmock.NewResult(0, 3))
			sqllockmock.ExpectUnlock(mock, key)
			if ran, err := reindexJob(context.Background(), other, db); !ran || err != nil {
				t.Fatalf("reindexJob() of a second Locker = %v, %v; want true, nil", ran, err)
			}
			if err := mock.ExpectationsWereMet(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMissingExpectationNamed: a lock statement that no helper expects
// fails the call with an error that names the statement go-sqlmock did
// not expect.
func TestMissingExpectationNamed(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	locker := sqllock.New(db, sqllock.WithKeepAlive(0))
	sqllockmock.ExpectServerCheck(mock)
	mock.ExpectExec("UPDATE posts").WillReturnResult(sqlmock.NewResult(0, 3))
	ran, err := reindexJob(context.Background(), locker, db)
	if ran || err == nil || !strings.Contains(err.Error(), "pg_try_advisory_lock") {
		t.Fatalf("reindexJob() = %v, %v; want an error naming the lock statement", ran, err)
	}
	t.Log(err)
}
