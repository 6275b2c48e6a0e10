package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"log"

	"github.com/sqllock/sqllock"
)

// errSuperseded says that a later holder of the lock has written: this
// holder lost its lock, whether it has been told yet or not.
var errSuperseded = errors.New("job 42 was written by a later holder of its lock")

// setState writes job 42's state with the fencing token of the lock it
// holds. The row keeps the largest token it was written with (jobs.fence,
// bigint NOT NULL DEFAULT 0): a write with the same token (the holder's
// next write) or a larger one (a later holder's) passes; a write with a
// smaller one changes nothing.
func setState(ctx context.Context, db *sql.DB, token int64, state string) error {
	res, err := db.ExecContext(ctx, "UPDATE jobs SET state = $1, fence = $2 WHERE id = 42 AND fence <= $2", state, token)
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err == nil && n == 0 {
		err = errSuperseded
	}
	return err
}

// runJob does job 42 under lk: every write carries the lock's token.
func runJob(ctx context.Context, db *sql.DB, lk *sqllock.Lock) error {
	token, err := lk.Token(ctx) // one round trip, then cached
	if err != nil {
		return err
	}
	if err := setState(ctx, db, token, "running"); err != nil {
		return err
	}
	// ... the work ...
	return setState(ctx, db, token, "done")
}

// A write in the same PostgreSQL checks the token in the statement itself:
// a holder that lost the lock without knowing it yet, whose successor has
// written already, changes nothing. (TestFencedWrites runs setState and
// runJob against a real server.)
func ExampleLock_Token() {
	lk, err := sqllock.New(db).Lock(ctx, sqllock.Hash("job:42"))
	if err != nil {
		return
	}
	defer lk.Unlock(ctx)
	if err := runJob(ctx, db, lk); errors.Is(err, errSuperseded) {
		log.Print("a later holder of job:42 has written: this one lost its lock")
	}
}
