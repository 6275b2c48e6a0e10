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
	// No keep-alive query at an unpredictable moment, and each lock on a
	// session of its own, in the order the expectations list.
	locker := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
	key := sqllock.Hash("cron:reindex_posts")
	sqllockmock.ExpectServerCheck(mock) // once per Locker, before its first session lock
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
	locker := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
	ran, err := reindexJob(context.Background(), locker, db)
	if !ran || err != nil {
		t.Fatalf("reindexJob() = %v, %v; want true, nil", ran, err)
	}
	var indexed bool
	if err := db.QueryRow("SELECT bool_and(indexed) FROM posts").Scan(&indexed); err != nil || !indexed {
		t.Fatalf("posts indexed: %v, %v", indexed, err)
	}
	if locks, err := sqllock.Inspect(context.Background(), db); err != nil || len(locks) != 0 {
		t.Fatalf("locks left: %v, %v", locks, err)
	}
}

// TestSharedLockerNamesTheOption: a Locker built without
// WithDedicatedSessions opens a shared session, whose statement no helper
// expects; the error says which option the helpers need, not that the mock
// has no connection (which is what the lock call, retried on a session of
// its own, found after the failed session was discarded).
func TestSharedLockerNamesTheOption(t *testing.T) {
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
	ran, err := reindexJob(context.Background(), locker, db)
	if ran || err == nil || !strings.Contains(err.Error(), "WithDedicatedSessions") {
		t.Fatalf("reindexJob() = %v, %v; want an error naming WithDedicatedSessions", ran, err)
	}
	t.Log(err)
}
