package poolguard

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sqllock/sqllock"
)

// Check returns the advisory locks, held or awaited, that any session holds
// in db's current database. It is sqllock.Inspect, kept here as the core of
// [VerifyNone] (a check function and a thin test helper over it, as goleak
// has Find and VerifyNone), so that a test needs only this package. A nil
// ctx panics, as it does in sqllock.
func Check(ctx context.Context, db *sql.DB) ([]sqllock.HeldLock, error) {
	if ctx == nil {
		panic("poolguard: Check called with a nil context")
	}
	return sqllock.Inspect(ctx, db, nil)
}

// TestingT is the part of *testing.T (and testing.TB) that [VerifyNone]
// uses, so that this package does not import testing.
type TestingT interface {
	Helper()
	Errorf(format string, args ...any)
}

// VerifyNone fails t when any session of db's database holds or awaits an
// advisory lock. It looks at pg_locks for the current database (every
// session, not only db's pool; session- and transaction-level alike),
// retrying for up to one second so that sessions that are ending can
// release theirs. Call it at the end of a test, or with defer:
//
//	defer poolguard.VerifyNone(t, db)
func VerifyNone(t TestingT, db *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		locks, err := Check(context.Background(), db)
		if err != nil {
			t.Errorf("poolguard: VerifyNone: %v", err)
			return
		}
		if len(locks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("poolguard: %d advisory lock(s) still held:", len(locks))
			for _, l := range locks {
				state := "held"
				if !l.Granted {
					state = "waiting"
				}
				msg += fmt.Sprintf("\n  key %s %s by pid %d (%s): %q", l.Key, state, l.PID, l.ApplicationName, l.Query)
			}
			t.Errorf("%s", msg)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
