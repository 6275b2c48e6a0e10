// Command poolguard shows the guard catching an advisory lock that rides
// back into the pool: it takes a session lock through db.ExecContext (the
// trap), and the guard discards the connection as it returns, so the lock
// is gone. With pgx and with lib/pq.
//
//	go run ./examples/poolguard
//
// It uses the server in DATABASE_URL, or starts a throwaway PostgreSQL.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/poolguard"
)

// openGuarded opens a guarded pool with pgx. Keep the Connector: its Stats
// count checks, leaks and discarded connections.
func openGuarded(dsn string, report func(poolguard.Leak)) (*sql.DB, *poolguard.Connector, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, nil, err
	}
	guard := poolguard.Wrap(stdlib.GetConnector(*cfg), poolguard.WithOnLeak(report))
	return sql.OpenDB(guard), guard, nil
}

// openGuardedPQ opens a guarded pool with lib/pq.
func openGuardedPQ(dsn string, report func(poolguard.Leak)) (*sql.DB, *poolguard.Connector, error) {
	connector, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, nil, err
	}
	guard := poolguard.Wrap(connector, poolguard.WithOnLeak(report))
	return sql.OpenDB(guard), guard, nil
}

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, w io.Writer) error {
	dsn, stop, err := pgtest.DatabaseURL(ctx, w)
	if err != nil {
		return err
	}
	defer stop()
	report := func(l poolguard.Leak) { fmt.Fprintln(w, "leak:", l) }
	for _, open := range []struct {
		name string
		open func(string, func(poolguard.Leak)) (*sql.DB, *poolguard.Connector, error)
	}{{"pgx", openGuarded}, {"lib/pq", openGuardedPQ}} {
		db, guard, err := open.open(dsn, report)
		if err != nil {
			return err
		}
		db.SetMaxOpenConns(1)
		// The trap: a session lock through the pool, never released.
		if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock(1001)"); err != nil {
			db.Close()
			return err
		}
		// The guard closed the connection; its backend exits a moment later,
		// and its lock with it. (This query names pg_locks' advisory rows, so
		// the guard checks its connection too: clean checks.)
		var left int
		for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			err = db.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").Scan(&left)
			if err != nil || left == 0 || time.Now().After(deadline) {
				break
			}
		}
		db.Close()
		if err != nil {
			return err
		}
		st := guard.Stats()
		fmt.Fprintf(w, "%s: advisory locks left: %d; checks %d, leaks %d, discarded %d\n", open.name, left, st.Checks, st.Leaks, st.Discarded)
	}
	return nil
}
