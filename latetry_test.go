package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestLateTryTakesNothing: a waiting call's first statement, a try, is
// sent to a backend that runs it late (stopped here, SIGSTOP, until 80 ms
// past the call's deadline; the holder released the key 20 ms past it).
// The call reads the try's answer, within 250 ms of its deadline, and
// gives the key back before it returns: it returns ErrNotAcquired and
// DeadlineExceeded, and its backend runs nothing after the call returned,
// so no one meets the key held by a call that reported it not acquired.
// Lock on a shared session (its runner sends the try) and on a session of
// its own (a pgx one is usually cut at the deadline, its statements
// before the try still unread: the session then ends, unanswered, and its
// backend with it once resumed).
func TestLateTryTakesNothing(t *testing.T) {
	long(t)
	srv := pgtest.Start(t)
	if !srv.Local() {
		pgtest.Unavailable(t, "a local server (its backends are stopped)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	for _, drv := range drivers {
		for _, via := range []string{"shared", "dedicated"} {
			t.Run(drv+"/"+via, func(t *testing.T) {
				dsn := srv.NewDatabase(t)
				admin := pgtest.Open(t, "pgx", dsn)
				admin.SetMaxOpenConns(2) // the holder's connection, and the observer's
				holder, err := admin.Conn(bg())
				if err != nil {
					t.Fatal(err)
				}
				defer holder.Close()
				db := pgtest.Open(t, drv, dsn)
				opts := []sqllock.Option{sqllock.WithKeepAlive(0)}
				if via == "dedicated" {
					opts = append(opts, sqllock.WithDedicatedSessions())
				}
				l := sqllock.New(db, opts...)
				sqllock.SkipPoolerProbe(l) // its second connection would stay in the pool, which must have one backend
				k := sqllock.Int64(4100)
				for trial := range 3 {
					// The call's statements go to the one backend its pool has.
					warm, err := l.Lock(bg(), sqllock.Int64(4101))
					if err != nil {
						t.Fatal(err)
					}
					if err := warm.Unlock(bg()); err != nil {
						t.Fatal(err)
					}
					if _, err := holder.ExecContext(bg(), "SELECT pg_advisory_lock(4100)"); err != nil {
						t.Fatal(err)
					}
					var pids []int
					rows, err := admin.Query(`SELECT pid FROM pg_stat_activity WHERE datname = current_database()
						AND pid <> pg_backend_pid() AND pid <> $1 AND backend_type = 'client backend'`, backendPID(t, holder))
					if err != nil {
						t.Fatal(err)
					}
					for rows.Next() {
						var pid int
						rows.Scan(&pid)
						pids = append(pids, pid)
					}
					rows.Close()
					if len(pids) != 1 {
						t.Fatalf("trial %d: the pool has backends %v, want one", trial, pids)
					}
					stopped := pids[0]
					if err := syscall.Kill(stopped, syscall.SIGSTOP); err != nil {
						t.Fatal(err)
					}
					ctx, cancel := context.WithTimeout(bg(), 100*time.Millisecond)
					dl, _ := ctx.Deadline()
					type result struct {
						lk       *sqllock.Lock
						err      error
						returned time.Time
						at       time.Time // the server's clock, read just after the call returned
					}
					res := make(chan result, 1)
					go func() {
						lk, err := l.Lock(ctx, k)
						returned := time.Now()
						var at time.Time
						if err := admin.QueryRow("SELECT clock_timestamp()").Scan(&at); err != nil {
							t.Error(err)
						}
						res <- result{lk, err, returned, at}
					}()
					time.Sleep(time.Until(dl.Add(20 * time.Millisecond)))
					if _, err := holder.ExecContext(bg(), "SELECT pg_advisory_unlock(4100)"); err != nil {
						t.Fatal(err)
					}
					time.Sleep(time.Until(dl.Add(80 * time.Millisecond)))
					syscall.Kill(stopped, syscall.SIGCONT)
					r := <-res
					cancel()
					returned := r.returned.Sub(dl)
					if r.err == nil {
						r.lk.Unlock(bg())
					}
					if !errors.Is(r.err, sqllock.ErrNotAcquired) || !errors.Is(r.err, context.DeadlineExceeded) {
						t.Fatalf("trial %d: Lock = %v, want ErrNotAcquired and DeadlineExceeded", trial, r.err)
					}
					// Whatever it ran after the call returned, it has run now.
					time.Sleep(200 * time.Millisecond)
					var last sql.NullTime
					var query sql.NullString
					if err := admin.QueryRow("SELECT state_change, query FROM pg_stat_activity WHERE pid = $1", stopped).Scan(&last, &query); err != nil && !errors.Is(err, sql.ErrNoRows) {
						t.Fatal(err)
					}
					t.Logf("trial %d: the call returned about %v past its deadline: %v; its backend's last change %v after it (%.60s)",
						trial, returned.Round(time.Millisecond), r.err, last.Time.Sub(r.at).Round(time.Microsecond), query.String)
					if last.Valid && last.Time.After(r.at) {
						t.Fatalf("trial %d: backend %d ran %q after the call returned not acquired", trial, stopped, query.String)
					}
				}
			})
		}
	}
}
