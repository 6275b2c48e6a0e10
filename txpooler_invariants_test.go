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

// TestTxPoolerMixedLoad: two Lockers, six goroutines each, take three
// keys at random with Lock, TryLock and Do for 10 s (2 s in the quick
// run) behind the bouncer, with other clients' traffic on it. Inside,
// each section counts itself in its key's "inside" counter: no section
// ever finds another inside (no overlap), every call succeeds (TryLock
// may find the key taken), and once the Lockers are closed no advisory
// lock is left on the server.
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
		lockers := []*sqllock.Locker{p.locker(t, drv), p.locker(t, drv)}
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
		wg.Wait()
		var total, over int64
		var per []string
		for i := range keys {
			total += sections[i].Load()
			over += overlaps[i].Load()
			per = append(per, fmt.Sprintf("%v: %d sections, %d overlaps, %d TryLock found it taken", keys[i], sections[i].Load(), overlaps[i].Load(), contended[i].Load()))
		}
		st := []sqllock.Stats{lockers[0].Stats(), lockers[1].Stats()}
		t.Logf("%v of 2 Lockers × 6 goroutines × 3 keys: %d sections, %d overlaps (%s); %d errors; lost %d, discarded %d",
			run, total, over, strings.Join(per, "; "), errs.total(), st[0].Lost+st[1].Lost, st[0].Discarded+st[1].Discarded)
		if over != 0 {
			t.Errorf("%d sections found another inside", over)
		}
		if errs.total() != 0 {
			t.Errorf("errors: %s", errs.String())
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
