package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestElectionProclaim: the leader changes its value without losing its
// term: the same backend holds the key throughout, on the same session
// (its backend_start), with the same fencing token; Leader shows the new
// value on its first ask after Proclaim returns, and Observe reports it
// by its first ask sent after Proclaim returned (or one in flight as it
// returned); counted in Observe's asks, not by a clock, which a loaded
// machine runs late. Proclaim refuses an invalid value, and a candidate that
// does not lead (never elected, resigned, or lost: then also
// ErrLockLost); a resigned leader's connection goes back to the pool
// without the proclaimed name.
func TestElectionProclaim(t *testing.T) {
	asks := observeAsks(t)
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		ctx, cancel := context.WithTimeout(bg(), time.Minute)
		defer cancel()
		k := sqllock.Hash("election:proclaim:" + driverOf(db)) // asks are told by key
		e := sqllock.New(db).Election(k)
		watch := pgtest.Open(t, "pgx", dsn)
		observer := sqllock.New(watch).Election(k)

		if err := e.Proclaim(ctx, "early"); !errors.Is(err, sqllock.ErrNotLeader) || errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Proclaim before any Campaign = %v, want ErrNotLeader alone", err)
		}
		term, err := e.Campaign(ctx, "v0")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Proclaim(ctx, "it's"); !errors.Is(err, sqllock.ErrInvalidKey) {
			t.Fatalf("Proclaim of a value with a quote = %v, want ErrInvalidKey", err)
		}
		tok, err := term.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var started time.Time
		if err := watch.QueryRow("SELECT backend_start FROM pg_stat_activity WHERE pid = $1", term.PID()).Scan(&started); err != nil {
			t.Fatal(err)
		}
		changes := observer.Observe(ctx)
		if ld := <-changes; ld.Value != "v0" || ld.PID != term.PID() {
			t.Fatalf("Observe's first = %v, want v0 on backend %d", ld, term.PID())
		}

		var seen []time.Duration
		for i := 1; i <= 10; i++ {
			value := fmt.Sprintf("host-%d.example:80", i)
			begun := time.Now()
			if err := e.Proclaim(ctx, value); err != nil {
				t.Fatalf("Proclaim(%q) = %v", value, err)
			}
			done := time.Now()
			ld, err := observer.Leader(ctx)
			if err != nil || ld.Value != value || ld.PID != term.PID() {
				t.Fatalf("Leader() after Proclaim(%q) = %v, %v; want it on backend %d", value, ld, err, term.PID())
			}
			var got sqllock.Leader
			var recv time.Time
			for got = range changes {
				if got.Value == value {
					recv = time.Now()
					break
				}
				if got.PID != term.PID() || got.Value != fmt.Sprintf("host-%d.example:80", i-1) && got.Value != "v0" {
					t.Fatalf("Observe reported %v between two values of one term", got)
				}
			}
			took := time.Since(begun)
			seen = append(seen, took)
			if got.PID != term.PID() {
				t.Fatalf("Observe reported %v, want backend %d", got, term.PID())
			}
			// A reading sent before Proclaim returned may have reported
			// it; one sent after must be the first ask sent since: the
			// candidates' digest changed with the name.
			if r := reportedBy(asks(k), done, recv); r > sqllock.LeaderRetries {
				t.Errorf("Proclaim(%q): reported by the ask %d sent since it returned, want by the first", value, r+1)
			}
		}
		sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
		t.Logf("Proclaim to Observe's report, 10 values: min %v, median %v, max %v", seen[0], seen[len(seen)/2], seen[len(seen)-1])

		// The term is the same: lock, session, token.
		if err := term.Err(); err != nil {
			t.Fatalf("the term after Proclaim: Err() = %v", err)
		}
		if hs := holders(t, watch, k); len(hs) != 1 || hs[0] != term.PID() {
			t.Fatalf("holders after Proclaim = %v, want [%d]", hs, term.PID())
		}
		var startedNow time.Time
		if err := watch.QueryRow("SELECT backend_start FROM pg_stat_activity WHERE pid = $1", term.PID()).Scan(&startedNow); err != nil || !startedNow.Equal(started) {
			t.Fatalf("the term's session started %v, now %v (%v): not the same session", started, startedNow, err)
		}
		if tok2, err := term.Token(ctx); err != nil || tok2 != tok {
			t.Fatalf("Token after Proclaim = %d, %v; want %d", tok2, err, tok)
		}

		// Resigned: not the leader; the session leaves without the name.
		pid := term.PID()
		if err := term.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := e.Proclaim(ctx, "after"); !errors.Is(err, sqllock.ErrNotLeader) || errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Proclaim after resigning = %v, want ErrNotLeader alone", err)
		}
		if name, ok := appNameOf(t, watch, pid); ok && name != "" {
			t.Fatalf("the resigned leader's session (backend %d) is named %q in the pool", pid, name)
		}

		// Lost: ErrNotLeader and ErrLockLost.
		term, err = e.Campaign(ctx, "v1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := watch.Exec("SELECT pg_terminate_backend($1)", term.PID()); err != nil {
			t.Fatal(err)
		}
		waitFree(t, watch, k, 5*time.Second)
		if err := e.Proclaim(ctx, "lost"); !errors.Is(err, sqllock.ErrNotLeader) || !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Proclaim after the term's session ended = %v, want ErrNotLeader and ErrLockLost", err)
		}
		if ld, err := observer.Leader(ctx); err != nil || ld.PID != 0 {
			t.Fatalf("Leader() after the loss = %v, %v; want none (a failed Proclaim names nothing)", ld, err)
		}
	})
}
