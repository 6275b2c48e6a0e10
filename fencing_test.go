package sqllock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestFencedWrites runs the fenced writes (setState, which the guide
// shows, and runJob, in example_fencing_test.go) against the server, on
// both drivers: a term writes twice and both writes pass (a fence check
// of "smaller than" refuses the second); a holder whose session ended
// without its knowing writes with its token after its successor wrote
// twice, and changes nothing.
func TestFencedWrites(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, drv, dsn)
			for _, q := range []string{
				"CREATE TABLE jobs (id int PRIMARY KEY, state text NOT NULL, fence bigint NOT NULL DEFAULT 0)",
				"INSERT INTO jobs (id, state) VALUES (42, 'new')",
			} {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			k := sqllock.Hash("job:42")
			// The first holder does the job, and is cut off without being
			// told (no keep-alive): its session ends, its lock with it.
			first, err := sqllock.New(db, sqllock.WithKeepAlive(0)).Lock(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if err := runJob(ctx, db, first); err != nil {
				t.Fatalf("first term: runJob = %v, want its two writes to pass", err)
			}
			stale, err := first.Token(ctx)
			if err != nil {
				t.Fatal(err)
			}
			terminate(t, srv, first.PID())
			waitFree(t, db, k, 10*time.Second)
			// The next holder does the job again: two writes, both pass.
			next, err := sqllock.New(db).Lock(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			defer next.Unlock(ctx)
			if err := runJob(ctx, db, next); err != nil {
				t.Fatalf("second term: runJob = %v, want its two writes to pass", err)
			}
			token, err := next.Token(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if token <= stale {
				t.Fatalf("tokens: %d then %d, want them to grow", stale, token)
			}
			// The first holder, resumed, writes as if it still held the lock.
			if err := setState(ctx, db, stale, "stale"); !errors.Is(err, errSuperseded) {
				t.Fatalf("the stale holder's write: setState = %v, want errSuperseded", err)
			}
			var state string
			var fence int64
			if err := db.QueryRowContext(ctx, "SELECT state, fence FROM jobs WHERE id = 42").Scan(&state, &fence); err != nil {
				t.Fatal(err)
			}
			if state != "done" || fence != token {
				t.Fatalf("job 42: state %q, fence %d; want %q, %d (the second term's)", state, fence, "done", token)
			}
			if err := first.Unlock(ctx); err == nil {
				t.Fatal("the first holder's Unlock after its session ended = nil, want an error")
			}
		})
	}
}
