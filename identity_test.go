package sqllock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// switchConnector dials one server, then, once switched, another: as a
// pool behind a multi-host DSN or a virtual address reaches the new primary
// after a failover.
type switchConnector struct {
	mu sync.Mutex
	c  driver.Connector // guarded by mu
}

func (s *switchConnector) Connect(ctx context.Context) (driver.Conn, error) {
	s.mu.Lock()
	c := s.c
	s.mu.Unlock()
	return c.Connect(ctx)
}

func (s *switchConnector) Driver() driver.Driver {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c.Driver()
}

func (s *switchConnector) to(c driver.Connector) {
	s.mu.Lock()
	s.c = c
	s.mu.Unlock()
}

// connector returns a connector of driver drv for dsn.
func connector(t testing.TB, drv, dsn string) driver.Connector {
	t.Helper()
	switch drv {
	case "pgx":
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return stdlib.GetConnector(*cfg)
	case "postgres":
		c, err := pq.NewConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Fatalf("no connector for driver %q", drv)
	return nil
}

// backendPID returns the pid of conn's backend.
func backendPID(t testing.TB, conn *sql.Conn) int {
	t.Helper()
	var pid int
	if err := conn.QueryRowContext(bg(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestKeepAliveKnowsTheServer: a lock granted on server A is not "still
// held" because another server, reached under the same name after A went
// away, shows the same key held by a backend with the same pid (two servers
// in containers number their backends alike). The keep-alive reports it
// lost within two intervals.
func TestKeepAliveKnowsTheServer(t *testing.T) {
	t.Parallel()
	const keepAlive = 200 * time.Millisecond
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			a := pgtest.PrivateInPIDNamespace(t)
			b := pgtest.PrivateInPIDNamespace(t)
			direct := func(s *pgtest.Server) *sql.DB {
				db := pgtest.Open(t, "pgx", s.DSN())
				db.SetMaxIdleConns(0) // a new backend, and pid, per connection
				return db
			}
			dbA, dbB := direct(a), direct(b)
			conn := func(db *sql.DB) *sql.Conn {
				c, err := db.Conn(bg())
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			// Bring A's next pid past B's, so that B can reach it.
			first := conn(dbB)
			pB := backendPID(t, first)
			first.Close()
			for {
				c := conn(dbA)
				p := backendPID(t, c)
				c.Close()
				if p > pB+2 {
					break
				}
			}

			sw := &switchConnector{c: connector(t, drv, a.DSN())}
			db := sql.OpenDB(sw)
			t.Cleanup(func() { db.Close() })
			db.SetMaxIdleConns(0) // each check dials: after the switch, B
			l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithKeepAlive(keepAlive))
			k := sqllock.Int64(9500)
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Unlock(bg())
			pA := lk.PID()

			// On B, a session with the same pid takes the same key.
			var twin *sql.Conn
			for twin == nil {
				c := conn(dbB)
				switch p := backendPID(t, c); {
				case p == pA:
					twin = c
				case p > pA:
					t.Fatalf("server B gave pid %d, past the holder's %d: no collision to test", p, pA)
				default:
					c.Close()
				}
			}
			defer twin.Close()
			if _, err := twin.ExecContext(bg(), "SELECT pg_advisory_lock(9500)"); err != nil {
				t.Fatal(err)
			}

			// The pool reaches B from now on (as after a failover, or a name
			// moved to another server); A goes away. (Stopped first, A
			// could leave the keep-alive without an answer for two checks:
			// lost too, for another reason.)
			sw.to(connector(t, drv, b.DSN()))
			began := time.Now()
			if err := a.Stop(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-lk.Done():
			case <-time.After(2*keepAlive + 3*time.Second):
				t.Fatalf("lock granted on server A to backend %d still held %v after the pool turned to B, whose backend %d holds the key",
					pA, time.Since(began), pA)
			}
			t.Logf("backend %d on A and on B: loss reported %v after the pool turned to B", pA, time.Since(began))
			if err := lk.Err(); !errors.Is(err, sqllock.ErrLockLost) || !strings.Contains(err.Error(), "another server") {
				t.Fatalf("Err() = %v, want ErrLockLost saying another server answers", err)
			}
		})
	}
}
