package sqllockmock_test

import (
	"context"
	"fmt"

	"github.com/DATA-DOG/go-sqlmock"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/sqllockmock"
)

// Example unit-tests code that runs a cron job under TryDo, without a
// server.
func Example() {
	db, mock, _ := sqlmock.New()
	defer db.Close()
	locker := sqllock.New(db, sqllock.WithKeepAlive(0)) // no background queries in unit tests
	key := sqllock.Hash("cron:reindex_posts")

	sqllockmock.ExpectServerCheck(mock) // once per Locker and connection (a mock has one), before its first session lock
	sqllockmock.ExpectTryLock(mock, key, true)
	mock.ExpectExec("UPDATE posts").WillReturnResult(sqlmock.NewResult(0, 3))
	sqllockmock.ExpectUnlock(mock, key)

	ran, err := locker.TryDo(context.Background(), key, func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, "UPDATE posts SET indexed = true")
		return err
	})
	fmt.Println(ran, err, mock.ExpectationsWereMet())
	// Output: true <nil> <nil>
}
