package main

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestInspectLabelsOwnStatements: the QUERY column shows a short label
// for sqllock's own statements (a holder's try, a waiter's wait or its
// place in the line), with either driver on the library's side, and an
// application's statement as it is.
func TestInspectLabelsOwnStatements(t *testing.T) {
	srv := pgtest.Start(t)
	for _, drv := range []string{"pgx", "postgres"} {
		t.Run(drv, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, drv, dsn)
			ctx := context.Background()
			k := sqllock.Int64(4301)
			lk, err := sqllock.New(db).Lock(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Unlock(ctx)
			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			waiter := sqllock.New(pgtest.Open(t, drv, dsn))
			go waiter.Lock(wctx, k)
			app, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer app.Close()
			if _, err := app.ExecContext(ctx, "SELECT pg_advisory_lock(4302)"); err != nil {
				t.Fatal(err)
			}
			defer app.ExecContext(ctx, "SELECT pg_advisory_unlock(4302)")
			waitRows(t, db, 3)

			r := runCLI(t, dsn, "inspect")
			t.Logf("sqllock inspect:\n%s", r.stdout)
			if r.code != 0 {
				t.Fatalf("inspect: exit %d %s", r.code, r.stderr)
			}
			rows := map[string]string{} // by key and state: the row
			for _, row := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
				f := strings.Fields(row)
				rows[f[0]+" "+f[3]] = row
			}
			for _, c := range []struct{ row, want string }{
				{"4301 held", "sqllock: try"},
				{"4301 waiting", "sqllock: "},
				{"4302 held", "SELECT pg_advisory_lock(4302)"},
			} {
				row, ok := rows[c.row]
				if !ok {
					t.Fatalf("no %s row in\n%s", c.row, r.stdout)
				}
				q := strings.TrimSpace(row[strings.LastIndex(row, "  "):])
				if !strings.HasPrefix(q, c.want) || strings.HasPrefix(c.want, "sqllock") && len(q) > len("sqllock: server check") {
					t.Errorf("%s row's QUERY = %q, want one that starts %q (a label, for sqllock's own)", c.row, q, c.want)
				}
			}
		})
	}
}

// waitRows waits until the database shows n advisory locks (held or
// awaited), for at most 10 s.
func waitRows(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		locks, err := sqllock.Inspect(context.Background(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(locks) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d advisory locks after 10 s, want %d: %v", len(locks), n, locks)
		}
	}
}
