package sqllock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestPreparedStatements: lib/pq, whose statements with arguments cost two
// round trips, gets its keys rendered into the text of a shared session's
// statements until the session is busy, and from then on executes them
// prepared on the session (EXECUTE of a statement named for the session);
// the session goes back to the pool with none of them left.
func TestPreparedStatements(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	db := pgtest.Open(t, "postgres", dsn)
	db.SetMaxOpenConns(4) // one shared session; the rest for the checks below
	observer := pgtest.Open(t, "pgx", dsn)
	l := sqllock.New(db, sqllock.WithKeepAlive(0))

	// lastQuery is the text of the last statement backend pid ran.
	lastQuery := func(pid int) string {
		t.Helper()
		var q string
		if err := observer.QueryRow("SELECT query FROM pg_stat_activity WHERE pid = $1", pid).Scan(&q); err != nil {
			t.Fatal(err)
		}
		return q
	}
	// cycle takes and releases k, and returns the text of the session's
	// try, read while the lock is held.
	cycle := func(k int64) (pid int, try string) {
		t.Helper()
		lk, err := l.TryLock(bg(), sqllock.Int64(k))
		if err != nil {
			t.Fatalf("TryLock(%d) = %v", k, err)
		}
		pid, try = lk.PID(), lastQuery(lk.PID())
		if err := lk.Unlock(bg()); err != nil {
			t.Fatalf("Unlock(%d) = %v", k, err)
		}
		return pid, try
	}

	pid, _ := cycle(71001)
	if got := lastQuery(pid); !strings.Contains(got, "71001") || strings.Contains(got, "EXECUTE") {
		t.Fatalf("a lone lock's unlock ran %q, want its key in the text", got)
	}
	var try string
	for i := range 10 {
		var p int
		if p, try = cycle(int64(71002 + i)); p != pid {
			t.Fatalf("lock %d on backend %d, want the shared session's %d", i, p, pid)
		}
	}
	if !strings.HasPrefix(try, "/* sqllock: try */ EXECUTE sqllock_") || !strings.Contains(try, "71011") {
		t.Fatalf("a busy shared session's try ran %q, want an EXECUTE of a statement prepared on it, marked as the statement is", try)
	}

	// Once idle, the shared session goes back to the pool: take every
	// connection the pool may open (the last one only once the shared
	// session is back), and look for prepared statements on each.
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	back := false
	for range 4 {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("the shared session did not go back to the pool: %v", err)
		}
		defer conn.Close()
		var p, n int
		if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_prepared_statements)").Scan(&p, &n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("backend %d went back to the pool with %d prepared statements", p, n)
		}
		back = back || p == pid
	}
	if !back {
		t.Fatalf("the shared session's backend %d is not among the pool's connections: it was discarded, not given back", pid)
	}
	if st := l.Stats(); st.Discarded != 0 {
		t.Fatalf("Stats().Discarded = %d, want 0", st.Discarded)
	}
}
