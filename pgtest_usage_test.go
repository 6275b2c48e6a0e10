package sqllock_test

import (
	"context"
	"testing"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestJob is how an integration test of a program that uses sqllock runs
// against a throwaway server (docs/guide.md, "Testing", gives its first
// line).
func TestJob(t *testing.T) {
	db := pgtest.Open(t, "pgx", pgtest.Start(t).NewDatabase(t))
	locker := sqllock.New(db)
	ran, err := locker.TryDo(context.Background(), sqllock.Hash("job"), func(ctx context.Context) error {
		return nil // the job under test
	})
	if !ran || err != nil {
		t.Fatalf("TryDo() = %v, %v", ran, err)
	}
}
