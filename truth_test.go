package sqllock_test

import (
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// Handles never report what is not true: a token with no error is a token
// issued while the lock was held, and a statement that finds the holding
// session gone tells the handle at once.

// TestTokenRacingUnlock: Token and Unlock of the same lock at once never
// give a zero token without an error.
func TestTokenRacingUnlock(t *testing.T) {
	t.Parallel()
	rounds := 300
	if testkit.Short() {
		rounds = 100
	}
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		for _, tc := range []struct {
			name string
			opts []sqllock.Option
		}{
			{"dedicated", []sqllock.Option{sqllock.WithDedicatedSessions()}},
			{"shared", nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				l := sqllock.New(db, append(tc.opts, sqllock.WithKeepAlive(0))...)
				k := sqllock.Int64(9100)
				var zero, tokens, refused int
				for range rounds {
					lk, err := l.Lock(bg(), k)
					if err != nil {
						t.Fatal(err)
					}
					var wg sync.WaitGroup
					var tok int64
					var terr error
					wg.Add(1)
					go func() { defer wg.Done(); tok, terr = lk.Token(bg()) }()
					uerr := lk.Unlock(bg())
					waitGroup(t, &wg, hangCeiling)
					if uerr != nil {
						t.Fatalf("Unlock() = %v", uerr)
					}
					switch {
					case terr == nil && tok <= 0:
						zero++
					case terr == nil:
						tokens++
					case errors.Is(terr, sqllock.ErrReleased):
						refused++
					default:
						t.Fatalf("Token() racing Unlock = %d, %v; want a token or ErrReleased", tok, terr)
					}
				}
				t.Logf("%d rounds: %d tokens, %d ErrReleased, %d zero tokens without error", rounds, tokens, refused, zero)
				if zero > 0 {
					t.Fatalf("Token() racing Unlock returned (0, nil) %d times in %d", zero, rounds)
				}
			})
		}
	})
}

// TestStatementFindsSessionGone: once the holding backend is terminated,
// the lock's next statement (Token) reports ErrLockLost and the handle says
// so at once (no keep-alive runs here); Unlock of such a lock reports the
// loss too, on every driver (lib/pq's Conn is closed by database/sql after
// the driver reports a bad connection).
func TestStatementFindsSessionGone(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(0))
		t.Run("Token", func(t *testing.T) {
			lk, err := l.Lock(bg(), sqllock.Int64(9101))
			if err != nil {
				t.Fatal(err)
			}
			terminate(t, srv, lk.PID())
			waitFree(t, db, lk.Key(), 5*time.Second)
			if tok, err := lk.Token(bg()); !errors.Is(err, sqllock.ErrLockLost) {
				t.Fatalf("Token() after the backend was terminated = %d, %v; want ErrLockLost", tok, err)
			}
			if err := lk.Err(); !errors.Is(err, sqllock.ErrLockLost) {
				t.Fatalf("Err() right after Token failed = %v, want ErrLockLost", err)
			}
			select {
			case <-lk.Done():
			default:
				t.Fatal("Done() not closed after Token found the session gone")
			}
			if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
				t.Fatalf("Unlock() = %v, want ErrLockLost", err)
			}
		})
		t.Run("Unlock", func(t *testing.T) {
			lk, err := l.Lock(bg(), sqllock.Int64(9102))
			if err != nil {
				t.Fatal(err)
			}
			terminate(t, srv, lk.PID())
			waitFree(t, db, lk.Key(), 5*time.Second)
			if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
				t.Fatalf("Unlock() after the backend was terminated = %v, want ErrLockLost", err)
			}
			if err := lk.Err(); !errors.Is(err, sqllock.ErrLockLost) {
				t.Fatalf("Err() after that Unlock = %v, want ErrLockLost", err)
			}
		})
		t.Run("Unlock after a failed statement on Conn", func(t *testing.T) {
			// A statement on the lock's own connection meets the ended
			// session first: database/sql then closes the Conn itself,
			// which is not the caller closing it.
			lk, err := l.Lock(bg(), sqllock.Int64(9103))
			if err != nil {
				t.Fatal(err)
			}
			terminate(t, srv, lk.PID())
			waitFree(t, db, lk.Key(), 5*time.Second)
			var one int
			if err := sqllock.ConnOf(lk).QueryRowContext(bg(), "SELECT 1").Scan(&one); err == nil {
				t.Fatal("a statement on the terminated session succeeded")
			}
			if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
				t.Fatalf("Unlock() after the backend was terminated = %v, want ErrLockLost", err)
			}
		})
		waitNoLocks(t, db, 5*time.Second)
	})
}
