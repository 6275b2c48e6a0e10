package poolguard_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"database/sql/driver"

	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/poolguard"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

var drivers = []string{"postgres", "pgx"}

var bg = context.Background()

// leakRecorder collects OnLeak calls.
type leakRecorder struct {
	mu    sync.Mutex
	leaks []poolguard.Leak
}

func (r *leakRecorder) record(l poolguard.Leak) {
	r.mu.Lock()
	r.leaks = append(r.leaks, l)
	r.mu.Unlock()
}
func (r *leakRecorder) all() []poolguard.Leak {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.leaks)
}

// guarded opens a guarded pool of size 1 on a fresh database, and an
// unguarded observer pool on the same database.
func guarded(t *testing.T, drv string, opts ...poolguard.Option) (db, observer *sql.DB, rec *leakRecorder, g *poolguard.Connector) {
	t.Helper()
	srv := pgtest.Start(t)
	dsn := srv.NewDatabase(t)
	observer = pgtest.Open(t, "pgx", dsn)
	rec = &leakRecorder{}
	g = poolguard.Wrap(connector(t, drv, dsn), append([]poolguard.Option{poolguard.WithOnLeak(rec.record)}, opts...)...)
	db = sql.OpenDB(g)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	return db, observer, rec, g
}

// connector returns the driver's own connector for dsn.
func connector(t testing.TB, drv, dsn string) driver.Connector {
	t.Helper()
	probe, err := sql.Open(drv, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	if dc, ok := probe.Driver().(driver.DriverContext); ok {
		c, err := dc.OpenConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return dsnConnector{dsn: dsn, d: probe.Driver()}
}

type dsnConnector struct {
	dsn string
	d   driver.Driver
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.d }

func holders(t *testing.T, q sqllock.Querier, k sqllock.Key) []int {
	t.Helper()
	locks, err := sqllock.Inspect(bg, q, nil, k)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, l := range locks {
		pids = append(pids, l.PID)
	}
	return pids
}

func waitFree(t *testing.T, q sqllock.Querier, k sqllock.Key) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for len(holders(t, q, k)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("lock %v still held by %v", k, holders(t, q, k))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPoolLeak is trap 2 of docs/traps.md: a session lock taken through a pool
// of one connection.
func TestPoolLeak(t *testing.T) {
	long(t)
	k := sqllock.Int64(1001)
	for _, drv := range drivers {
		t.Run(drv+"/discard", func(t *testing.T) {
			db, observer, rec, g := guarded(t, drv)
			if _, err := db.Exec("SELECT pg_advisory_lock(1001)"); err != nil {
				t.Fatal(err)
			}
			waitFree(t, observer, k) // the session was closed on its way back
			var one int
			if err := db.QueryRow("SELECT 1").Scan(&one); err != nil || one != 1 {
				t.Fatalf("pool after the leak: %v", err)
			}
			if st := g.Stats(); st != (poolguard.Stats{Checks: 1, Leaks: 1, Discarded: 1}) {
				t.Fatalf("Stats() = %+v", st)
			}
			leaks := rec.all()
			if len(leaks) != 1 || len(leaks[0].Locks) != 1 || leaks[0].Locks[0].Key != k || !strings.Contains(leaks[0].LastQuery, "pg_advisory_lock(1001)") || leaks[0].Policy != poolguard.Discard {
				t.Fatalf("OnLeak calls = %+v", leaks)
			}
		})
		t.Run(drv+"/unlock-all", func(t *testing.T) {
			db, observer, rec, g := guarded(t, drv, poolguard.WithPolicy(poolguard.UnlockAll))
			var before, after int
			if err := db.QueryRow("SELECT pg_backend_pid()").Scan(&before); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("SELECT pg_advisory_lock(1001), pg_advisory_lock_shared(5, 6)"); err != nil {
				t.Fatal(err)
			}
			if n := len(holders(t, observer, k)); n != 0 {
				t.Fatalf("lock still held after return: %d", n)
			}
			if err := db.QueryRow("SELECT pg_backend_pid()").Scan(&after); err != nil || after != before {
				t.Fatalf("backend %d then %d (%v): UnlockAll must keep the session", before, after, err)
			}
			if st := g.Stats(); st != (poolguard.Stats{Checks: 1, Leaks: 1, Released: 1}) {
				t.Fatalf("Stats() = %+v", st)
			}
			if leaks := rec.all(); len(leaks) != 1 || len(leaks[0].Locks) != 2 || leaks[0].PID != before {
				t.Fatalf("OnLeak calls = %+v", leaks)
			}
		})
		t.Run(drv+"/report", func(t *testing.T) {
			db, observer, rec, g := guarded(t, drv, poolguard.WithPolicy(poolguard.Report))
			if _, err := db.Exec("SELECT pg_advisory_lock(1001)"); err != nil {
				t.Fatal(err)
			}
			if n := len(holders(t, observer, k)); n != 1 {
				t.Fatalf("Report must keep the lock: holders %d", n)
			}
			if st := g.Stats(); st.Leaks != 1 || st.Discarded != 0 || len(rec.all()) != 1 {
				t.Fatalf("Stats() = %+v", st)
			}
			db.Exec("SELECT pg_advisory_unlock_all()")
		})
	}
}

// TestLeakPaths: every way a session lock can ride back into the pool is
// caught.
func TestLeakPaths(t *testing.T) {
	long(t)
	k := sqllock.Int64(77)
	paths := []struct {
		name string
		leak func(t *testing.T, db *sql.DB)
	}{
		{"query and rows.Close", func(t *testing.T, db *sql.DB) {
			rows, err := db.Query("SELECT pg_advisory_lock(77)")
			if err != nil {
				t.Fatal(err)
			}
			rows.Close()
		}},
		{"query row", func(t *testing.T, db *sql.DB) {
			var s string
			if err := db.QueryRow("SELECT pg_advisory_lock($1)::text", int64(77)).Scan(&s); err != nil {
				t.Fatal(err)
			}
		}},
		{"conn closed while holding", func(t *testing.T, db *sql.DB) {
			c, err := db.Conn(bg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.ExecContext(bg, "SELECT PG_ADVISORY_LOCK(77)"); err != nil {
				t.Fatal(err)
			}
			c.Close()
		}},
		{"session lock in a rolled back transaction", func(t *testing.T, db *sql.DB) {
			tx, err := db.Begin()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec("SELECT pg_advisory_lock(77)"); err != nil {
				t.Fatal(err)
			}
			tx.Rollback()
		}},
		{"prepared statement", func(t *testing.T, db *sql.DB) {
			st, err := db.Prepare("SELECT pg_advisory_lock($1)")
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			// Unlock-all cycles, then the leaking execution of the same statement.
			if _, err := st.Exec(int64(77)); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, drv := range drivers {
		for _, p := range paths {
			t.Run(drv+"/"+p.name, func(t *testing.T) {
				db, observer, rec, g := guarded(t, drv)
				p.leak(t, db)
				waitFree(t, observer, k)
				if st := g.Stats(); st.Leaks != 1 || st.Discarded != 1 || len(rec.all()) != 1 {
					t.Fatalf("Stats() = %+v, OnLeak calls %d", st, len(rec.all()))
				}
				var one int
				if err := db.QueryRow("SELECT 1").Scan(&one); err != nil {
					t.Fatalf("pool after the leak: %v", err)
				}
			})
		}
		t.Run(drv+"/cancelled lock", func(t *testing.T) {
			db, observer, _, _ := guarded(t, drv)
			hold, err := observer.Conn(bg)
			if err != nil {
				t.Fatal(err)
			}
			defer hold.Close()
			if _, err := hold.ExecContext(bg, "SELECT pg_advisory_lock(77)"); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			if _, err := db.ExecContext(ctx, "SELECT pg_advisory_lock(77)"); err == nil {
				t.Fatal("the cancelled lock succeeded")
			}
			if _, err := hold.ExecContext(bg, "SELECT pg_advisory_unlock(77)"); err != nil {
				t.Fatal(err)
			}
			waitFree(t, observer, k)
			var one int
			if err := db.QueryRow("SELECT 1").Scan(&one); err != nil {
				t.Fatalf("pool after the cancel: %v", err)
			}
			waitFree(t, observer, k)
		})
	}
}

func TestCleanTrafficIsNotChecked(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, _, _, g := guarded(t, drv)
			db.SetMaxOpenConns(4)
			for i := 0; i < 1000; i++ {
				var n int
				if err := db.QueryRow("SELECT $1::int", i).Scan(&n); err != nil || n != i {
					t.Fatal(n, err)
				}
			}
			if st := g.Stats(); st.Checks != 0 {
				t.Fatalf("Stats() = %+v after 1,000 clean queries, want no checks", st)
			}
		})
	}
}

// TestWrapperKeepsDriverFeatures: arrays (NamedValueChecker), Conn.Raw,
// transactions and prepared statements still work through the wrapper.
func TestWrapperKeepsDriverFeatures(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, _, _, _ := guarded(t, drv)
			db.SetMaxOpenConns(2)
			if drv == "pgx" {
				var n int
				if err := db.QueryRow("SELECT array_length($1::int[], 1)", []int32{1, 2, 3}).Scan(&n); err != nil || n != 3 {
					t.Fatalf("pgx array argument: %d, %v", n, err)
				}
			}
			c, err := db.Conn(bg)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Raw(func(dc any) error {
				if _, ok := dc.(interface{ Unwrap() driver.Conn }); !ok {
					return fmt.Errorf("Raw got %T, want the guard's wrapper", dc)
				}
				if drv == "pgx" {
					pc, ok := poolguard.UnwrapAs[*stdlib.Conn](dc)
					if !ok || pc.Conn() == nil {
						return errors.New("UnwrapAs did not reach *stdlib.Conn")
					}
				}
				return nil
			})
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			tx, err := db.BeginTx(bg, &sql.TxOptions{Isolation: sql.LevelSerializable, ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			var iso string
			if err := tx.QueryRow("SHOW transaction_isolation").Scan(&iso); err != nil || iso != "serializable" {
				t.Fatalf("isolation %q, %v", iso, err)
			}
			tx.Commit()
			st, err := db.Prepare("SELECT $1::int + 1")
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				var n int
				if err := st.QueryRow(i).Scan(&n); err != nil || n != i+1 {
					t.Fatalf("prepared: %d, %v", n, err)
				}
			}
			st.Close()
			if err := db.Ping(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSqllockCooperation: a sqllock Lock whose unlock was confirmed costs no
// check, and a lock taken by user SQL on Session.Conn() never reaches the
// pool: Session.Close closes the connection it handed out, and the server
// releases the lock as the session ends.
func TestSqllockCooperation(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, observer, rec, g := guarded(t, drv)
			db.SetMaxOpenConns(3)
			l := sqllock.New(db, sqllock.WithDedicatedSessions())
			for i := 0; i < 20; i++ {
				lk, err := l.Lock(bg, sqllock.Int64(5))
				if err != nil {
					t.Fatal(err)
				}
				if err := lk.Unlock(bg); err != nil {
					t.Fatal(err)
				}
			}
			if st := g.Stats(); st.Checks != 0 {
				t.Fatalf("Stats() = %+v after 20 sqllock cycles, want no checks", st)
			}
			s, err := l.Session(bg)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Lock(bg, sqllock.Int64(5)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Conn().ExecContext(bg, "SELECT pg_advisory_lock(6)"); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(bg); err != nil {
				t.Fatal(err)
			}
			waitFree(t, observer, sqllock.Int64(6))
			if st := g.Stats(); st.Checks != 0 || st.Leaks != 0 || len(rec.all()) != 0 {
				t.Fatalf("Stats() = %+v, leaks %+v: the Session's connection came back to the pool", st, rec.all())
			}
			if held, err := poolguard.Check(bg, db); err != nil || len(held) != 0 {
				t.Fatalf("Check() = %v, %v: want no lock held by the pool's sessions", held, err)
			}
		})
	}
}

// fakeTB records what VerifyNone reports. It implements only
// poolguard.TestingT, which is all VerifyNone may use.
type fakeTB struct {
	mu     sync.Mutex
	errors []string
}

var _ poolguard.TestingT = (*fakeTB)(nil)

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func TestVerifyNone(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	clean := &fakeTB{}
	poolguard.VerifyNone(clean, db)
	if len(clean.errors) != 0 {
		t.Fatalf("VerifyNone on a clean database reported %v", clean.errors)
	}
	c, err := db.Conn(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(bg, "SELECT pg_advisory_lock(4294967296 + 3)"); err != nil {
		t.Fatal(err)
	}
	dirty := &fakeTB{}
	poolguard.VerifyNone(dirty, db)
	if len(dirty.errors) != 1 || !strings.Contains(dirty.errors[0], "key 4294967299 held") {
		t.Fatalf("VerifyNone with a held lock reported %q", dirty.errors)
	}
}

// TestCheckNilContext: Check panics at a nil context with its own name,
// before the pool sees it.
func TestCheckNilContext(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	var nilCtx context.Context
	func() {
		defer func() {
			if p := recover(); p != "poolguard: Check called with a nil context" {
				t.Errorf("Check(nil) panicked with %v", p)
			}
		}()
		poolguard.Check(nilCtx, db)
	}()
	if _, err := poolguard.Check(bg, db); err != nil {
		t.Fatalf("Check() after Check(nil) = %v", err)
	}
}

// TestCheckAlways: a lock taken inside a stored function, whose call text
// does not mention an advisory function, is invisible to the default guard
// and caught with WithCheckAlways.
func TestCheckAlways(t *testing.T) {
	for _, drv := range drivers {
		for _, always := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/always=%v", drv, always), func(t *testing.T) {
				var opts []poolguard.Option
				if always {
					opts = append(opts, poolguard.WithCheckAlways())
				}
				db, observer, rec, g := guarded(t, drv, opts...)
				if _, err := observer.Exec(`CREATE FUNCTION grab() RETURNS void LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_` + `advisory_lock(55); END $$`); err != nil {
					t.Fatal(err)
				}
				if _, err := db.Exec("SELECT grab()"); err != nil {
					t.Fatal(err)
				}
				held := len(holders(t, observer, sqllock.Int64(55)))
				st := g.Stats()
				if always {
					waitFree(t, observer, sqllock.Int64(55))
					if st.Checks != 1 || st.Leaks != 1 || len(rec.all()) != 1 {
						t.Fatalf("WithCheckAlways: Stats() = %+v", st)
					}
				} else {
					if held != 1 || st.Checks != 0 {
						t.Fatalf("default guard: held %d, Stats() = %+v; want the lock unseen (documented limit)", held, st)
					}
					db.Exec("SELECT pg_advisory_unlock_all()")
				}
			})
		}
	}
}

// TestEvasions: a lock taken through a server-side prepared statement, or
// through a Unicode-escaped function name, is caught; the leak names the
// statement of its own checkout, never a stale one.
func TestEvasions(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			db, observer, rec, _ := guarded(t, drv)
			// A clean advisory statement first, so that a stale LastQuery
			// would show it.
			if _, err := db.Exec("SELECT pg_try_advisory_lock(60), pg_advisory_unlock(60)"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("PREPARE grab(bigint) AS SELECT pg_advisory_lock($1)"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec("EXECUTE grab(61)"); err != nil {
				t.Fatal(err)
			}
			waitFree(t, observer, sqllock.Int64(61))
			leaks := rec.all()
			if len(leaks) != 1 || leaks[0].LastQuery != "EXECUTE grab(61)" {
				t.Fatalf("after EXECUTE of a prepared lock: leaks %+v, want one naming EXECUTE grab(61)", leaks)
			}
			if _, err := db.Exec(`SELECT U&"pg_adv\0069sory_lock"(62)`); err != nil {
				t.Fatal(err)
			}
			waitFree(t, observer, sqllock.Int64(62))
			if leaks := rec.all(); len(leaks) != 2 || !strings.Contains(leaks[1].LastQuery, `U&"pg_adv`) {
				t.Fatalf("after a U& identifier: leaks %+v", leaks)
			}
		})
	}
}

// long skips t under -short (stress, fault and timing-heavy runs), except
// in CI (CI=true), where every test runs.
func long(t testing.TB) {
	t.Helper()
	testkit.Long(t)
}
