package sqllock_test

// The invariants of a Locker made WithTransactionPooler, proven behind a
// real PgBouncer in transaction mode (pool sizes 4 and 8), on both
// drivers (pgx with its default statement cache: PgBouncer 1.18 keeps no
// prepared statement across server connections), with other clients'
// traffic on the same bouncer. An observer on a direct connection, as the
// superuser, reads pg_locks and pg_stat_activity.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// txPooled is a database behind a PgBouncer in transaction mode.
type txPooled struct {
	srv      *pgtest.Server
	bouncer  *pgtest.Bouncer
	pool     int    // the bouncer's default_pool_size
	dsn      string // direct, the test role
	bdsn     string // through the bouncer, the test role
	observer *sql.DB
}

// behindTxPooler starts a database of its own behind a new PgBouncer in
// transaction mode with pool server connections, and an observer on a
// direct connection as the superuser.
func behindTxPooler(t *testing.T, pool int) *txPooled {
	t.Helper()
	srv := pgtest.Start(t)
	if !srv.Local() {
		pgtest.Unavailable(t, "a local cluster (for PgBouncer)", errors.New("SQLLOCK_TEST_DSN or Docker server"))
	}
	dsn := srv.NewDatabase(t)
	b := pgtest.StartPgBouncer(t, srv, "transaction", pool)
	db := pgtest.DatabaseOf(dsn)
	return &txPooled{srv: srv, bouncer: b, pool: pool, dsn: dsn, bdsn: b.DSNFor(db),
		observer: pgtest.Open(t, "pgx", srv.AdminDSNFor(db))}
}

// txPoolSizes are the bouncer's pool sizes every invariant is proven at.
var txPoolSizes = []int{4, 8}

// eachTxPooled runs f for each pool size and driver, each with a database
// and a bouncer of its own.
func eachTxPooled(t *testing.T, f func(t *testing.T, p *txPooled, drv string)) {
	t.Helper()
	for _, pool := range txPoolSizes {
		for _, drv := range drivers {
			t.Run(fmt.Sprintf("pool=%d/%s", pool, drv), func(t *testing.T) {
				f(t, behindTxPooler(t, pool), drv)
			})
		}
	}
}

// locker returns a Locker WithTransactionPooler on a pool of drv through
// the bouncer (pgx with its default statement cache), closed with t.
func (p *txPooled) locker(t *testing.T, drv string, opts ...sqllock.Option) *sqllock.Locker {
	t.Helper()
	l := sqllock.New(pgtest.Open(t, drv, p.bdsn), append([]sqllock.Option{sqllock.WithTransactionPooler()}, opts...)...)
	t.Cleanup(func() { l.Close(bg()) })
	return l
}

// trafficKey is the key the other clients of the bouncer take and release
// in transactions of their own (startPoolerTraffic): no stray.
var trafficKey = sqllock.Int64(7599)

// strays returns the advisory locks granted in p's database that no lock
// of live holds (its key on its backend), the traffic's key aside.
func (p *txPooled) strays(t testing.TB, live ...*sqllock.Lock) []sqllock.HeldLock {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
	defer cancel()
	locks, err := sqllock.Inspect(ctx, p.observer, nil)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	var out []sqllock.HeldLock
	for _, h := range locks {
		if !h.Granted || h.Key == trafficKey {
			continue
		}
		owned := slices.ContainsFunc(live, func(lk *sqllock.Lock) bool { return lk.Key() == h.Key && lk.PID() == h.PID })
		if !owned {
			out = append(out, h)
		}
	}
	return out
}

// waitNoStrays waits until no stray lock is left (see strays), fails t
// after d, and returns how long it took.
func (p *txPooled) waitNoStrays(t testing.TB, d time.Duration, live ...*sqllock.Lock) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		s := p.strays(t, live...)
		if len(s) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > d {
			t.Fatalf("advisory locks no live holder owns, %v after the fault: %v", d, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// backendGone waits until backend pid is gone from pg_stat_activity, and
// returns how long it took, or false after d.
func (p *txPooled) backendGone(t testing.TB, pid int, d time.Duration) (time.Duration, bool) {
	t.Helper()
	start := time.Now()
	for {
		var n int
		if err := p.observer.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// errTally counts errors by kind, safe for concurrent use.
type errTally struct {
	mu sync.Mutex
	m  map[string]int
}

func (e *errTally) add(what string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = map[string]int{}
	}
	e.m[what+": "+err.Error()]++
}

func (e *errTally) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for k, n := range e.m {
		out = append(out, fmt.Sprintf("%d× %s", n, k))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

func (e *errTally) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, v := range e.m {
		n += v
	}
	return n
}

// txEvents counts a Locker's failed keep-alive checks, losses and
// discarded connections, with the first error of each kind.
type txEvents struct {
	mu                                sync.Mutex
	checks, checkErrs, lost, discards int
	// slow counts the checks with no answer within their timeout: a
	// loaded machine's, not a fault's (the locks stay held; two in a row
	// would lose them, and lost counts that).
	slow  int
	first map[sqllock.EventKind]error
}

func (o *txEvents) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	return nil
}

func (o *txEvents) Event(_ context.Context, e sqllock.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch e.Kind {
	case sqllock.EventKeepAlive:
		o.checks++
		if e.Err == nil {
			return
		}
		if strings.HasPrefix(e.Err.Error(), "no answer within") {
			o.slow++
			return
		}
		o.checkErrs++
	case sqllock.EventLost:
		o.lost++
	case sqllock.EventDiscarded:
		o.discards++
	default:
		return
	}
	if o.first == nil {
		o.first = map[sqllock.EventKind]error{}
	}
	if o.first[e.Kind] == nil {
		o.first[e.Kind] = e.Err
	}
}

func (o *txEvents) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprintf("%d keep-alive checks (%d unanswered in time, %d failed: %v), %d locks lost (%v), %d connections discarded (%v)",
		o.checks, o.slow, o.checkErrs, o.first[sqllock.EventKeepAlive], o.lost, o.first[sqllock.EventLost], o.discards, o.first[sqllock.EventDiscarded])
}

// TestTxPoolerMixedLoad: two Lockers, six goroutines each, take three
// keys at random with Lock, TryLock and Do for 10 s (2 s in the quick
// run) behind the bouncer, with other clients' traffic on it. Inside,
// each section counts itself in its key's "inside" counter: no section
// ever finds another inside (no overlap), every call succeeds (TryLock
// may find the key taken), and once the Lockers are closed no advisory
// lock is left on the server. The Lockers check their locks every 100 ms
// (the shortest keep-alive): no check fails (one a loaded machine left
// unanswered within its timeout is counted apart), no lock is lost and no
// connection discarded.
func TestTxPoolerMixedLoad(t *testing.T) {
	long(t)
	run := 10 * time.Second
	if testing.Short() {
		run = 2 * time.Second
	}
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		keys := []sqllock.Key{sqllock.Int64(7501), sqllock.Int64(7502), sqllock.Int64(7503)}
		var inside [3]atomic.Int32
		var sections, overlaps, contended [3]atomic.Int64
		var errs errTally
		var ev txEvents
		opts := []sqllock.Option{sqllock.WithKeepAlive(100 * time.Millisecond), sqllock.WithObserver(&ev)}
		lockers := []*sqllock.Locker{p.locker(t, drv, opts...), p.locker(t, drv, opts...)}
		deadline := time.Now().Add(run)
		var wg sync.WaitGroup
		for li, l := range lockers {
			for g := range 6 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(li), uint64(g)))
					for time.Now().Before(deadline) {
						i := rng.IntN(len(keys))
						k := keys[i]
						enter := func() {
							if inside[i].Add(1) != 1 {
								overlaps[i].Add(1)
							}
							sections[i].Add(1)
							time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
							inside[i].Add(-1)
						}
						ctx, cancel := context.WithTimeout(bg(), 30*time.Second)
						switch rng.IntN(3) {
						case 0:
							lk, err := l.Lock(ctx, k)
							if err != nil {
								errs.add("Lock", err)
								break
							}
							enter()
							if err := lk.Unlock(bg()); err != nil {
								errs.add("Unlock", err)
							}
						case 1:
							lk, err := l.TryLock(ctx, k)
							if errors.Is(err, sqllock.ErrNotAcquired) {
								contended[i].Add(1)
								break
							}
							if err != nil {
								errs.add("TryLock", err)
								break
							}
							enter()
							if err := lk.Unlock(bg()); err != nil {
								errs.add("Unlock", err)
							}
						case 2:
							if err := l.Do(ctx, k, func(context.Context) error { enter(); return nil }); err != nil {
								errs.add("Do", err)
							}
						}
						cancel()
					}
				})
			}
		}
		waitGroup(t, &wg, hangCeiling)
		var total, over int64
		var per []string
		for i := range keys {
			total += sections[i].Load()
			over += overlaps[i].Load()
			per = append(per, fmt.Sprintf("%v: %d sections, %d overlaps, %d TryLock found it taken", keys[i], sections[i].Load(), overlaps[i].Load(), contended[i].Load()))
		}
		t.Logf("%v of 2 Lockers × 6 goroutines × 3 keys: %d sections, %d overlaps (%s); %d errors; %v",
			run, total, over, strings.Join(per, "; "), errs.total(), &ev)
		if over != 0 {
			t.Errorf("%d sections found another inside", over)
		}
		if errs.total() != 0 {
			t.Errorf("errors: %s", errs.String())
		}
		if ev.checkErrs != 0 || ev.lost != 0 || ev.discards != 0 {
			t.Errorf("with no fault: %v", &ev)
		}
		for i := range keys {
			if sections[i].Load() == 0 {
				t.Errorf("no section on %v in %v", keys[i], run)
			}
		}
		for _, l := range lockers {
			if err := l.Close(bg()); err != nil {
				t.Errorf("Close() = %v", err)
			}
		}
		took := p.waitNoStrays(t, 5*time.Second)
		t.Logf("no advisory lock left %v after both Lockers closed", took.Round(time.Millisecond))
	})
}

// txKeepAlive and txBound are the faults' keep-alive and orphan bound.
const (
	txKeepAlive = 200 * time.Millisecond
	txBound     = 4 * time.Second
)

// told waits until lk's loss is told (Done closed) and checks that Err
// matches ErrLockLost; it returns how long it waited.
func told(t *testing.T, lk *sqllock.Lock, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-lk.Done():
	case <-time.After(d):
		t.Fatalf("the loss of %v not told (Done open) %v after the fault; Err %v", lk.Key(), d, lk.Err())
	}
	if err := lk.Err(); !errors.Is(err, sqllock.ErrLockLost) {
		t.Fatalf("Err() = %v after Done, want ErrLockLost", err)
	}
	return time.Since(start)
}

// TestTxPoolerFaults: each fault of the list, on a Locker
// WithTransactionPooler behind the bouncer (keep-alive 200 ms, orphan
// bound 4 s) with other clients' traffic on it, while the Locker holds
// another key on another session: the fault's holder keeps its lock or
// is told it lost it (Done, Err matching ErrLockLost), the key is free
// for others (or held by its holder only), no advisory lock is held by
// a backend that no live holder owns, and the Locker goes on working.
// Where the library closed a client connection in its transaction, the
// backend is gone within 5 s (the bouncer closes the server connection):
// the times are reported. The faults: a waiting Lock whose context is
// cancelled; the server terminating a holder's backend; PgBouncer's
// RECONNECT and RELOAD (nothing lost) and KILL (every holder told); a
// statement that fails and aborts the transaction (a full lock table).
func TestTxPoolerFaults(t *testing.T) {
	long(t)
	eachTxPooled(t, func(t *testing.T, p *txPooled, drv string) {
		startPoolerTraffic(t, p.bdsn, trafficKey, 2)
		l := p.locker(t, drv, sqllock.WithKeepAlive(txKeepAlive), sqllock.WithOrphanBound(txBound))
		other := p.locker(t, drv)
		// A lock held throughout, on a session of its own (a Lock that
		// waited keeps the session it waited on).
		bystander := sqllock.Int64(7610)
		blocker, err := other.Lock(bg(), bystander)
		if err != nil {
			t.Fatal(err)
		}
		var by *sqllock.Lock
		byGot := make(chan error, 1)
		go func() {
			var err error
			by, err = l.Lock(bg(), bystander)
			byGot <- err
		}()
		waitFor(t, "the bystander's wait", func() bool { return waitingPID(t, p.observer, bystander) != 0 })
		blocker.Unlock(bg())
		if err := <-byGot; err != nil {
			t.Fatal(err)
		}
		defer by.Unlock(bg())
		bystanderOK := func(t *testing.T) {
			t.Helper()
			if err := by.Err(); err != nil {
				t.Fatalf("the bystander lock on another session: Err() = %v", err)
			}
			if h := holders(t, p.observer, bystander); !slices.Equal(h, []int{by.PID()}) {
				t.Fatalf("holders of the bystander %v = %v, want [%d]", bystander, h, by.PID())
			}
		}
		// worksAfter: the Locker takes k again, and it holds nothing else.
		worksAfter := func(t *testing.T, k sqllock.Key) {
			t.Helper()
			lk, err := l.TryLock(bg(), k)
			if err != nil {
				t.Fatalf("TryLock(%v) after the fault = %v", k, err)
			}
			if s := p.strays(t, by, lk); len(s) != 0 {
				t.Fatalf("advisory locks no live holder owns: %v", s)
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Fatalf("Unlock() after the fault = %v", err)
			}
		}

		t.Run("context cancelled mid-statement", func(t *testing.T) {
			k := sqllock.Int64(7620)
			held, err := other.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			mine, err := l.Lock(bg(), sqllock.Int64(7621)) // on a session of l's, with the wait or not
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(bg())
			got := make(chan error, 1)
			go func() {
				_, err := l.Lock(ctx, k)
				got <- err
			}()
			var waiter int
			waitFor(t, "the wait in the server", func() bool { waiter = waitingPID(t, p.observer, k); return waiter != 0 })
			cancel()
			began := time.Now()
			err = <-got
			returned := time.Since(began)
			if !errors.Is(err, sqllock.ErrNotAcquired) || !errors.Is(err, context.Canceled) {
				t.Fatalf("the cancelled Lock() = %v, want ErrNotAcquired and context.Canceled", err)
			}
			// Then the holder lets go: nobody is granted it behind the
			// caller's back.
			if err := held.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Millisecond)
			if h := holders(t, p.observer, k); len(h) != 0 {
				t.Fatalf("%v held by %v after the cancelled waiter's holder let go", k, h)
			}
			gone, closed := p.backendGone(t, waiter, time.Second)
			if err := mine.Err(); err != nil {
				t.Fatalf("l's other lock: Err() = %v", err)
			}
			p.waitNoStrays(t, 5*time.Second, by, mine)
			bystanderOK(t)
			if err := mine.Unlock(bg()); err != nil {
				t.Fatal(err)
			}
			worksAfter(t, k)
			t.Logf("the cancelled Lock returned %v after the cancel; its waiting backend %d: closed %v (%v)", returned.Round(time.Millisecond), waiter, closed, gone.Round(time.Millisecond))
		})

		t.Run("the server terminates the holder's backend", func(t *testing.T) {
			k := sqllock.Int64(7640)
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			var ok bool
			if err := p.observer.QueryRow("SELECT pg_terminate_backend($1)", lk.PID()).Scan(&ok); err != nil || !ok {
				t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
			}
			took := told(t, lk, txBound)
			p.waitNoStrays(t, 5*time.Second, by)
			bystanderOK(t)
			worksAfter(t, k)
			t.Logf("the holder of a terminated backend told ErrLockLost %v after: %v", took.Round(time.Millisecond), lk.Err())
		})

		t.Run("the pooler reconnects and reloads", func(t *testing.T) {
			// RECONNECT closes each server connection once it is released:
			// a pinned one is not, until its transaction ends; RELOAD
			// changes nothing. The lock stays, through several checks.
			k := sqllock.Int64(7645)
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			pid := lk.PID()
			for _, cmd := range []string{"RECONNECT " + pgtest.DatabaseOf(p.dsn), "RELOAD"} {
				if err := p.bouncer.Admin(bg(), cmd); err != nil {
					t.Fatalf("%s: %v", cmd, err)
				}
			}
			time.Sleep(5 * txKeepAlive)
			if err := lk.Err(); err != nil {
				t.Fatalf("Err() after RECONNECT = %v", err)
			}
			if h := holders(t, p.observer, k); !slices.Equal(h, []int{pid}) {
				t.Fatalf("holders of %v after RECONNECT = %v, want [%d]", k, h, pid)
			}
			bystanderOK(t)
			if err := lk.Unlock(bg()); err != nil {
				t.Fatalf("Unlock() after RECONNECT = %v", err)
			}
			gone, closed := p.backendGone(t, pid, 2*time.Second)
			p.waitNoStrays(t, 5*time.Second, by)
			worksAfter(t, k)
			t.Logf("RECONNECT and RELOAD: the lock kept; its server connection closed after the unlock: %v (%v)", closed, gone.Round(time.Millisecond))
		})

		t.Run("the pooler kills the client connections", func(t *testing.T) {
			// KILL drops every client and server connection of the
			// database: the bystander's too (it is lost); RESUME lets new
			// clients in.
			k := sqllock.Int64(7650)
			lk, err := l.Lock(bg(), k)
			if err != nil {
				t.Fatal(err)
			}
			pid := lk.PID()
			db := pgtest.DatabaseOf(p.dsn)
			if err := p.bouncer.Admin(bg(), "KILL "+db); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if err := p.bouncer.Admin(bg(), "RESUME "+db); err != nil {
				t.Fatal(err)
			}
			took := told(t, lk, txBound)
			tookBy := told(t, by, txBound)
			if _, closed := p.backendGone(t, pid, 5*time.Second); !closed {
				t.Fatalf("the holder's backend %d still there 5 s after KILL", pid)
			}
			gone := time.Since(killed)
			p.waitNoStrays(t, 5*time.Second)
			worksAfter2 := func() {
				lk, err := l.TryLock(bg(), k)
				if err != nil {
					t.Fatalf("TryLock(%v) after KILL and RESUME = %v", k, err)
				}
				if s := p.strays(t, lk); len(s) != 0 {
					t.Fatalf("advisory locks no live holder owns: %v", s)
				}
				lk.Unlock(bg())
			}
			began := time.Now()
			worksAfter2()
			t.Logf("KILL: both holders told ErrLockLost (%v, %v after); the backend gone %v after KILL; a TryLock and Unlock after RESUME took %v",
				took.Round(time.Millisecond), tookBy.Round(time.Millisecond), gone.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		})

		t.Run("statement error aborts the transaction", func(t *testing.T) {
			// A full lock table: another session takes advisory locks until
			// the server refuses one; then a try on l's shared session
			// fails, which aborts its transaction. Last: a server session
			// that PgBouncer opens meanwhile fails to log in, and the
			// bouncer then waits server_login_retry (15 s) before it
			// opens another.
			a := sqllock.Int64(7630)
			held, err := l.TryLock(bg(), a)
			if err != nil {
				t.Fatal(err)
			}
			conn, err := p.observer.Conn(bg())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := conn.ExecContext(bg(), `DO $$ BEGIN
				FOR i IN 1..10000000 LOOP PERFORM pg_advisory_lock(8000000000 + i); END LOOP;
				EXCEPTION WHEN out_of_memory THEN NULL; END $$`); err != nil {
				t.Fatal(err)
			}
			// The server may find room for a lock or two still: the
			// tries go on until one is refused.
			var terr error
			var extra []*sqllock.Lock
			for i := range 20 {
				var lk *sqllock.Lock
				if lk, terr = l.TryLock(bg(), sqllock.Int64(int64(7660+i))); terr != nil {
					break
				}
				extra = append(extra, lk)
			}
			if _, err := conn.ExecContext(bg(), "SELECT pg_advisory_unlock_all()"); err != nil {
				t.Fatal(err)
			}
			began := time.Now()
			if !errors.Is(terr, sqllock.ErrLockTableFull) {
				t.Fatalf("TryLock() on a full lock table = %v, want ErrLockTableFull", terr)
			}
			for _, lk := range extra {
				if err := lk.Err(); err == nil {
					lk.Unlock(bg())
				}
			}
			// The other lock of the session either still holds (its
			// backend shows it, and it is released cleanly), or is told
			// lost, its backend gone and the key free.
			var how string
			select {
			case <-held.Done():
			case <-time.After(txBound + time.Second):
			}
			if err := held.Err(); err == nil {
				if h := holders(t, p.observer, a); !slices.Equal(h, []int{held.PID()}) {
					t.Fatalf("holders of %v = %v, want [%d] (Err nil)", a, h, held.PID())
				}
				p.waitNoStrays(t, 5*time.Second, held)
				if err := held.Unlock(bg()); err != nil {
					t.Fatalf("Unlock() = %v", err)
				}
				how = "the session's other lock kept"
			} else {
				if !errors.Is(err, sqllock.ErrLockLost) {
					t.Fatalf("the session's other lock: Err() = %v, want nil or ErrLockLost", err)
				}
				gone, closed := p.backendGone(t, held.PID(), 5*time.Second)
				if !closed {
					t.Fatalf("the aborted session's backend %d still there 5 s after its loss", held.PID())
				}
				how = fmt.Sprintf("the session's other lock told lost %v after the error (%v); its backend gone %v later",
					(time.Since(began) - gone).Round(time.Millisecond), err, gone.Round(time.Millisecond))
			}
			p.waitNoStrays(t, 5*time.Second)
			worksAfter(t, a)
			t.Logf("TryLock() on a full lock table = %v; %s", terr, how)
		})
	})
}

// waitFor polls cond every 5 ms until it holds, and fails t after 20 s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not seen within 20 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestTxPoolerClientClosedInTransaction: PgBouncer in transaction mode
// closes the server connection of a client that closes its connection
// in the middle of a transaction, which a Locker WithTransactionPooler
// relies on when it is in doubt: the backend, holding a session-level
// lock taken in the transaction, is gone, and the key free, within 5 s,
// 10 times per driver (the times reported).
func TestTxPoolerClientClosedInTransaction(t *testing.T) {
	p := behindTxPooler(t, 4)
	startPoolerTraffic(t, p.bdsn, trafficKey, 2)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			dsn := p.bdsn
			if drv == "pgx" {
				dsn += "&default_query_exec_mode=simple_protocol"
			}
			db := pgtest.Open(t, drv, dsn)
			db.SetMaxIdleConns(0) // a connection given back is closed
			k := sqllock.Int64(7700 + int64(len(drv)))
			var times []time.Duration
			for range 10 {
				conn, err := db.Conn(bg())
				if err != nil {
					t.Fatal(err)
				}
				if _, err := conn.ExecContext(bg(), "BEGIN"); err != nil {
					t.Fatal(err)
				}
				var pid int
				var got bool
				if err := conn.QueryRowContext(bg(), "SELECT pg_backend_pid(), pg_try_advisory_lock(7700 + $1::int8)", len(drv)).Scan(&pid, &got); err != nil || !got {
					t.Fatalf("the lock in the transaction: %v, %v", got, err)
				}
				conn.Close()
				took, gone := p.backendGone(t, pid, 5*time.Second)
				if !gone {
					t.Fatalf("backend %d still there %v after its client closed its connection in a transaction", pid, took)
				}
				waitFree(t, p.observer, k, time.Second)
				times = append(times, took)
			}
			slices.Sort(times)
			t.Logf("the backend of a client closed in a transaction gone after %v (median), %v (most), of 10", times[5].Round(time.Millisecond), times[9].Round(time.Millisecond))
		})
	}
}
