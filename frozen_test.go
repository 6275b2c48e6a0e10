package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// frozenBound is how long after its context's end a call may return when
// the server stopped answering: the grace a blind driver's statement gets
// (250 ms), plus the time a cancel of an abandoned wait may take (2 s).
const frozenBound = 250*time.Millisecond + 2*time.Second

// frozenCall is one call of the table, made with ctx on a Locker (and
// what was set up for it before the fault).
type frozenCall struct {
	name string
	call func(ctx context.Context, f *frozenSetup) error
}

// frozenSetup is what the calls need, made before the fault: idle
// connections in the pool, a held lock, a Session, an open transaction.
type frozenSetup struct {
	db   *sql.DB
	l    *sqllock.Locker
	held *sqllock.Lock
	s    *sqllock.Session
	s2   *sqllock.Session
	tx   *sql.Tx
	tx2  *sql.Tx
}

var frozenCalls = []frozenCall{
	{"Lock", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.Lock(ctx, sqllock.Int64(1801))
		return err
	}},
	{"TryLock", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.TryLock(ctx, sqllock.Int64(1802))
		return err
	}},
	{"RLock", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.RLock(ctx, sqllock.Int64(1803))
		return err
	}},
	{"TryRLock", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.TryRLock(ctx, sqllock.Int64(1804))
		return err
	}},
	{"Do", func(ctx context.Context, f *frozenSetup) error {
		return f.l.Do(ctx, sqllock.Int64(1805), func(context.Context) error { return nil })
	}},
	{"TryDo", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.TryDo(ctx, sqllock.Int64(1806), func(context.Context) error { return nil })
		return err
	}},
	{"Session", func(ctx context.Context, f *frozenSetup) error { _, err := f.l.Session(ctx); return err }},
	{"Session.Lock", func(ctx context.Context, f *frozenSetup) error { return f.s.Lock(ctx, sqllock.Int64(1808)) }},
	{"Session.TryLock", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.s2.TryLock(ctx, sqllock.Int64(1809))
		return err
	}},
	{"Semaphore.Acquire", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.Semaphore("frozen", 2).Acquire(ctx)
		return err
	}},
	{"Semaphore.TryAcquire", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.Semaphore("frozen-try", 2).TryAcquire(ctx)
		return err
	}},
	{"Election.Campaign", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.Election(sqllock.Int64(1812)).Campaign(ctx, "frozen")
		return err
	}},
	{"Election.Leader", func(ctx context.Context, f *frozenSetup) error {
		_, err := f.l.Election(sqllock.Int64(1813)).Leader(ctx)
		return err
	}},
	{"LockTx", func(ctx context.Context, f *frozenSetup) error { return sqllock.LockTx(ctx, f.tx, sqllock.Int64(1814)) }},
	{"TryLockTx", func(ctx context.Context, f *frozenSetup) error {
		_, err := sqllock.TryLockTx(ctx, f.tx2, sqllock.Int64(1815))
		return err
	}},
	{"InTx", func(ctx context.Context, f *frozenSetup) error {
		return f.l.InTx(ctx, sqllock.Int64(1816), nil, func(*sql.Tx) error { return nil })
	}},
	{"Inspect", func(ctx context.Context, f *frozenSetup) error { _, err := sqllock.Inspect(ctx, f.db, nil); return err }},
	{"Lock.Token", func(ctx context.Context, f *frozenSetup) error { _, err := f.held.Token(ctx); return err }},
}

// TestFrozenServerBoundsEveryCall: with the server's link frozen (every
// packet dropped: established connections hang, new ones time out), or
// the backends of the Locker's pool stopped (SIGSTOP: their kernel still
// answers TCP), every call of the table returns within 250 ms plus 2 s of
// its context's end, on both drivers, with an unlock timeout of 10 s
// (which no call may wait for).
func TestFrozenServerBoundsEveryCall(t *testing.T) {
	long(t)
	srv := pgtest.StartIsolated(t)
	for _, fault := range []string{"frozen link", "stopped backends"} {
		for _, drv := range drivers {
			t.Run(fault+"/"+drv, func(t *testing.T) {
				dsn := srv.NewDatabase(t)
				admin := pgtest.Open(t, "pgx", srv.SocketDSN(pgtest.DatabaseOf(dsn)))
				f := frozenSetupOn(t, drv, dsn)
				switch fault {
				case "frozen link":
					if err := srv.Cut(); err != nil {
						t.Fatal(err)
					}
					defer srv.Restore()
				case "stopped backends":
					pids := poolBackends(t, admin, pgtest.DatabaseOf(dsn))
					for _, pid := range pids {
						if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
							t.Fatal(err)
						}
					}
					defer func() {
						for _, pid := range pids {
							syscall.Kill(pid, syscall.SIGCONT)
						}
					}()
				}
				late := runFrozenCalls(t, f)
				if len(late) > 0 {
					t.Errorf("%d of %d calls returned more than %v after their context's end: %s", len(late), len(frozenCalls), frozenBound, strings.Join(late, "; "))
				}
			})
		}
	}
}

// frozenSetupOn makes, on a Locker of drv with a 10 s unlock timeout,
// what the calls need before the fault.
func frozenSetupOn(t *testing.T, drv, dsn string) *frozenSetup {
	t.Helper()
	db := pgtest.Open(t, drv, dsn)
	f := &frozenSetup{db: db, l: sqllock.New(db, sqllock.WithKeepAlive(0), sqllock.WithUnlockTimeout(10*time.Second))}
	var err error
	// Idle connections in the pool, and a shared session lingering.
	var warm []*sqllock.Lock
	for i := range 4 {
		lk, err := f.l.RLock(bg(), sqllock.Int64(int64(1790+i)))
		if err != nil {
			t.Fatal(err)
		}
		warm = append(warm, lk)
	}
	for _, lk := range warm {
		lk.Unlock(bg())
	}
	if f.held, err = f.l.Lock(bg(), sqllock.Int64(1800)); err != nil {
		t.Fatal(err)
	}
	if f.s, err = f.l.Session(bg()); err != nil {
		t.Fatal(err)
	}
	if f.s2, err = f.l.Session(bg()); err != nil {
		t.Fatal(err)
	}
	if f.tx, err = db.BeginTx(bg(), nil); err != nil {
		t.Fatal(err)
	}
	if f.tx2, err = db.BeginTx(bg(), nil); err != nil {
		t.Fatal(err)
	}
	return f
}

// poolBackends returns the backends of database name, but the caller's.
func poolBackends(t *testing.T, admin *sql.DB, name string) []int {
	t.Helper()
	rows, err := admin.Query("SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pids []int
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if len(pids) < 4 {
		t.Fatalf("%d backends in the pool, want at least 4", len(pids))
	}
	return pids
}

// runFrozenCalls makes every call, each with a context of 300 ms, and
// returns those that returned later than frozenBound after it ended.
// TryLock goes first, alone: it is then the one that sends the statement
// of the shared session that holds the held lock (a call that finds a
// statement under way there only queues behind it); then all the others
// at once.
func runFrozenCalls(t *testing.T, f *frozenSetup) (late []string) {
	t.Helper()
	const ctxFor = 300 * time.Millisecond
	var mu sync.Mutex
	var lines []string
	var wg sync.WaitGroup
	for i, c := range frozenCalls {
		if c.name != "TryLock" {
			continue
		}
		frozenCalls[0], frozenCalls[i] = frozenCalls[i], frozenCalls[0]
	}
	for i, c := range frozenCalls {
		if i == 1 {
			waitGroup(t, &wg, hangCeiling)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(bg(), ctxFor)
			defer cancel()
			began := time.Now()
			done := make(chan error, 1)
			go func() { done <- c.call(ctx, f) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(ctxFor + 4*frozenBound):
				err = fmt.Errorf("still running after %v", ctxFor+4*frozenBound)
			}
			after := time.Since(began) - ctxFor
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, fmt.Sprintf("%-20s %8v after its ctx: %v", c.name, after.Round(time.Millisecond), err))
			if after > frozenBound {
				late = append(late, fmt.Sprintf("%s %v", c.name, after.Round(time.Millisecond)))
			}
		}()
	}
	waitGroup(t, &wg, hangCeiling)
	sort.Strings(lines)
	t.Logf("every call with a %v context:\n  %s", ctxFor, strings.Join(lines, "\n  "))
	return late
}
