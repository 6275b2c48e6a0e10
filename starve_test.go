package sqllock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"math"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestPoolStarvation: impatient callers leave the application's pool alone
// (rule 16). Eight goroutines call Lock with deadlines of 1 to 20 ms on a
// key held elsewhere, for churn, on a pool of 12 that the application
// also uses, with the server a couple of milliseconds away (a proxy):
// setting up a connection, checking it and probing for a pooler take
// longer than the shortest deadlines. Then:
//
//   - the application's own SELECT 1 (200 ms timeout, every 25 ms) fails
//     no more than 1% (rounded up) more often than a control: the same
//     query at the same moment on a pool of its own, which no Locker uses
//     (a loaded machine fails both, together or each at random: that is
//     the machine, not the Locker);
//   - the pool never fills: at most two thirds of it in use (sampled);
//   - the Locker opens at most one connection per 20 Lock calls: it
//     reuses its connections, where it once opened one for every 5 to 40
//     calls (a loaded machine, whose statements outlive their grace,
//     costs a few);
//   - 3 s after the last call the Locker holds at most 4 of the pool's
//     connections, counted twice: database/sql's connections in use (the
//     application uses none then), and the server's sessions of the
//     database that are not idle in the pool (open or closing: a backend
//     whose client let go counts until it ends).
//
// It runs in the full run only (CI runs it): its 200 ms queries measure
// the pool, and the quick run, which loads the machine with many tests at
// once, makes a connection's setup take longer than that.
func TestPoolStarvation(t *testing.T) {
	long(t)
	t.Parallel()
	const (
		churn       = 10 * time.Second
		controlName = "sqllock-test-control"
		poolSize    = 12
		impatient   = 8
		appWait     = 200 * time.Millisecond
		heldAtEnd   = 4
	)
	eachDriverParallel(t, func(t *testing.T, direct *sql.DB, dsn string) {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		proxy := pgtest.StartProxy(t, u.Host, 2*time.Millisecond)
		opened := &countingConnector{inner: connectorOf(t, direct.Driver(), proxy.DSN(dsn))}
		db := sql.OpenDB(opened)
		t.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(poolSize)
		cu, err := url.Parse(proxy.DSN(dsn))
		if err != nil {
			t.Fatal(err)
		}
		q := cu.Query()
		q.Set("application_name", controlName)
		cu.RawQuery = q.Encode()
		control := sql.OpenDB(connectorOf(t, direct.Driver(), cu.String()))
		t.Cleanup(func() { control.Close() })
		control.SetMaxOpenConns(poolSize)

		k := sqllock.Hash("starvation")
		// The holder and the observer each have a pool of one, of their
		// own: their backends are the database's only ones besides db's.
		holderDB := pgtest.Open(t, "pgx", dsn)
		holderDB.SetMaxOpenConns(1)
		observer := pgtest.Open(t, "pgx", dsn)
		observer.SetMaxOpenConns(1)
		held, err := sqllock.New(holderDB, sqllock.WithKeepAlive(0)).Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		defer held.Unlock(bg())
		// The application's query on a pool, within wait; its first one,
		// before the churn, sets up its connection.
		query := func(db *sql.DB, wait time.Duration) error {
			ctx, cancel := context.WithTimeout(context.WithValue(bg(), appKey{}, true), wait)
			defer cancel()
			var one int
			return db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		}
		for _, db := range []*sql.DB{db, control} {
			if err := query(db, 10*time.Second); err != nil {
				t.Fatalf("the application's first SELECT 1: %v", err)
			}
		}
		// sessions is the number of the server's sessions of db's: those of
		// the database but the holder's, the observer's and the control's.
		sessions := func() int {
			t.Helper()
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			var n int
			if err := observer.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND pid <> pg_backend_pid() AND pid <> $1 AND application_name <> $2`, held.PID(), controlName).Scan(&n); err != nil {
				t.Errorf("pg_stat_activity: %v", err)
			}
			return n
		}

		l := sqllock.New(db)
		stop := make(chan struct{})
		var calls atomic.Int64
		var wg sync.WaitGroup
		for g := range impatient {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 50))
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(bg(), time.Duration(1+rng.IntN(20))*time.Millisecond)
					lk, err := l.Lock(ctx, k)
					cancel()
					calls.Add(1)
					if err == nil {
						t.Errorf("Lock of a key held elsewhere granted (backend %d)", lk.PID())
						lk.Unlock(bg())
					} else if !errors.Is(err, sqllock.ErrNotAcquired) {
						t.Errorf("Lock(1-20 ms) = %v, want ErrNotAcquired", err)
					}
				}
			})
		}
		// The pool's figures, sampled during the churn.
		var maxInUse, maxServer int
		var aside sync.WaitGroup
		aside.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				maxInUse, maxServer = max(maxInUse, db.Stats().InUse), max(maxServer, sessions())
			}
		})
		before, dialsBefore, appDialsBefore := db.Stats(), opened.n.Load(), opened.app.Load()
		// The application's queries, each beside the control's: alone
		// counts those that failed where the control's succeeded, and
		// controlAlone the converse (the machine's share of those).
		var tries, failed, controlFailed, alone, controlAlone int
		var firstErr error
		for end := time.Now().Add(churn); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
			tries++
			controlErr := make(chan error, 1)
			go func() { controlErr <- query(control, appWait) }()
			err := query(db, appWait)
			cerr := <-controlErr
			switch {
			case err != nil && cerr == nil:
				alone++
				if firstErr == nil {
					firstErr = err
				}
			case err == nil && cerr != nil:
				controlAlone++
			}
			if err != nil {
				failed++
			}
			if cerr != nil {
				controlFailed++
			}
		}
		close(stop)
		waitGroup(t, &wg, hangCeiling)
		aside.Wait()
		during := db.Stats()
		appDials := opened.app.Load() - appDialsBefore
		lockerDials := opened.n.Load() - dialsBefore - appDials
		stopped := time.Now()

		time.Sleep(3*time.Second - time.Since(stopped))
		st := db.Stats()
		server := sessions()
		// The sessions the pool keeps idle are the application's; every
		// other one of the database's is held by the Locker, open or
		// closing.
		lockerServer := server - st.Idle
		t.Logf("%d Lock calls, %d sessions discarded; the application's SELECT 1: %d of %d failed, the control's %d; the application's alone %d (first: %v), the control's alone %d; during the churn: at most %d connections in use and %d server sessions (sampled), %d connections opened by the Locker and %d by the application, %d closed for want of idle room, %d waits for a connection; 3 s later: %d in use, %d idle, %d server sessions (%d not idle in the pool)",
			calls.Load(), l.Stats().Discarded, failed, tries, controlFailed, alone, firstErr, controlAlone, maxInUse, maxServer, lockerDials, appDials, during.MaxIdleClosed-before.MaxIdleClosed, during.WaitCount-before.WaitCount, st.InUse, st.Idle, server, lockerServer)
		if calls.Load() < impatient*10 {
			t.Fatalf("%d Lock calls in %v: the churn did not happen", calls.Load(), churn)
		}
		// 1% more, and the machine's noise: a loaded machine fails either
		// query at random. Only the pairs where one failed and the other
		// did not tell the two apart; without a Locker in the way, each
		// such pair is the application's or the control's as a coin
		// falls, so the two counts differ by chance by about the square
		// root of their sum, which the control's own (controlAlone) stands
		// for twice over: three times that is allowed. A quiet machine
		// fails none of the control's, and allows 1% only.
		noise := int(math.Ceil(3 * math.Sqrt(float64(2*controlAlone))))
		if allowed := (tries+99)/100 + noise; alone-controlAlone > allowed {
			t.Errorf("of %d SELECT 1, the application's failed where the control's succeeded %d times (first: %v), the converse %d: want at most %d more (1%%, and %d for the machine's noise)", tries, alone, firstErr, controlAlone, allowed, noise)
		}
		if lockerDials*20 > calls.Load() {
			t.Errorf("during the churn, the Locker opened %d connections for %d Lock calls, want at most one per 20", lockerDials, calls.Load())
		}
		if maxInUse > poolSize*2/3 {
			t.Errorf("during the churn, %d of the pool's %d connections were in use at once, want at most %d", maxInUse, poolSize, poolSize*2/3)
		}
		if st.InUse > heldAtEnd || lockerServer > heldAtEnd {
			t.Errorf("3 s after the last Lock call: %d connections in use, %d server sessions not idle in the pool; want at most %d", st.InUse, lockerServer, heldAtEnd)
		}
	})
}

// countingConnector is a driver.Connector that counts the connections it
// opens (n), and of those, the ones opened for a caller whose context
// carries appKey (app).
type countingConnector struct {
	inner  driver.Connector
	n, app atomic.Int64
}

// appKey marks the application's contexts (see countingConnector).
type appKey struct{}

func (c *countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c.n.Add(1)
	if ctx.Value(appKey{}) != nil {
		c.app.Add(1)
	}
	return c.inner.Connect(ctx)
}

func (c *countingConnector) Driver() driver.Driver { return c.inner.Driver() }

// connectorOf returns a connector of d to dsn: its own, or, for a driver
// without one (lib/pq's Driver), one that calls Open.
func connectorOf(t testing.TB, d driver.Driver, dsn string) driver.Connector {
	t.Helper()
	if dc, ok := d.(driver.DriverContext); ok {
		c, err := dc.OpenConnector(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return dsnConnector{d, dsn}
}

// dsnConnector is a driver.Connector that opens dsn with its driver's Open.
type dsnConnector struct {
	d   driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }

func (c dsnConnector) Driver() driver.Driver { return c.d }
