package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
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

// patroniFullEnv, set to 1, runs TestPatroni at full size: Patroni's own
// timings (ttl 30 s, loop_wait 10 s, retry_timeout 10 s), the default
// keep-alive and more holders. Unset, the trial is scaled down to fit CI.
const patroniFullEnv = "SQLLOCK_TEST_PATRONI_FULL"

// haScale is the size of the Patroni trial.
type haScale struct {
	locks, late int // locks taken before the fault, and while replication stalls
	candidates  int
	keepAlive   time.Duration
	opts        []pgtest.PatroniOption
	budget      time.Duration // the whole test
	wait        time.Duration // each wait, from the fault
}

func patroniScale() haScale {
	if os.Getenv(patroniFullEnv) == "1" {
		return haScale{locks: 50, late: 10, candidates: 3, keepAlive: sqllock.DefaultKeepAlive,
			opts:   []pgtest.PatroniOption{pgtest.WithTimings(30*time.Second, 10*time.Second, 10*time.Second)},
			budget: 20 * time.Minute, wait: 3 * time.Minute}
	}
	return haScale{locks: 10, late: 5, candidates: 3, keepAlive: time.Second, budget: 5 * time.Minute, wait: time.Minute}
}

// TestPatroni: sqllock on a 3-node Patroni cluster (etcd, multi-host DSNs:
// pgx's URL form, lib/pq's keyword form), with synchronous_mode off and
// on. Each mode's cluster goes through a switchover; the death of the new
// primary's host (its Patroni and PostgreSQL killed with SIGKILL) after
// its replication stalled for a second, while tokens were handed out; and
// a crash of the next primary's PostgreSQL, which Patroni restarts in
// place. A writer inserts rows throughout. For each driver at once: a
// Locker holding locks on distinct keys (taken, with their tokens, just
// before the fault), one key whose holders follow one another during the
// stall, and an Election with candidates campaigning in goroutines. Each
// fault: every holder is told (Done closes, Err wraps ErrLockLost), the
// locks are granted again on the new primary (pg_locks there), a new
// leader is elected on the new primary (its session is not in recovery;
// Election.Leader agrees), the writes resume; every token is greater than
// those handed out before it for the same key, in synchronous mode and
// after a crash in place (in async mode a promoted standby may lack the
// last tokens: logged only). At the end nothing is held on any live node.
// Every wait is bounded.
func TestPatroni(t *testing.T) {
	long(t)
	sc := patroniScale()
	deadline := time.Now().Add(sc.budget)
	if d, ok := t.Deadline(); ok && d.Add(-30*time.Second).Before(deadline) {
		deadline = d.Add(-30 * time.Second)
	}
	ctx, cancel := context.WithDeadline(bg(), deadline)
	defer cancel()
	begin := time.Now()
	for _, mode := range []struct {
		name string
		sync bool
	}{{"async", false}, {"sync", true}} {
		t.Run(mode.name, func(t *testing.T) {
			opts := slices.Clone(sc.opts)
			if mode.sync {
				opts = append(opts, pgtest.WithSynchronousMode())
			}
			t0 := time.Now()
			p := pgtest.StartPatroni(t, opts...)
			t.Logf("cluster of %d nodes (%s) up in %v", len(p.Nodes()), mode.name, time.Since(t0).Round(time.Millisecond))
			w := startHAWriter(t, ctx, p)
			var clients []*haClient
			for i, drv := range drivers {
				dsn := p.DSN()
				if drv == "postgres" {
					dsn = p.KeywordDSN() // lib/pq reads a URL's host list as one host name
				}
				clients = append(clients, newHAClient(t, ctx, drv, dsn, int32(960+i), sc))
			}
			faults := []haFaultKind{
				{name: "switchover", do: func(ctx context.Context, _ *pgtest.Node) error { _, err := p.Switchover(ctx); return err }},
				{name: "host_death", stall: true, do: func(_ context.Context, old *pgtest.Node) error { return p.KillHost(old) }},
				{name: "postgres_crash", inPlace: true, do: func(_ context.Context, old *pgtest.Node) error { return p.CrashPostgres(old) }},
			}
			for _, f := range faults {
				t.Run(f.name, func(t *testing.T) { haFault(t, ctx, p, w, clients, sc, mode.sync, f) })
			}
			for _, c := range clients {
				c.stop()
			}
			w.stop()
			t.Logf("writer: %d rows inserted, %d statements failed", w.ok.Load(), w.failed.Load())
			for _, n := range p.Nodes() {
				if n.Alive() {
					haNoAdvisoryLocks(t, ctx, n)
				}
			}
		})
	}
	t.Logf("TestPatroni: %v in all", time.Since(begin).Round(time.Millisecond))
}

// TestJobAcrossSwitchover is how a test of a program of yours runs it
// across a switchover of a Patroni cluster (docs/deployment.md quotes it):
// the job's lock, on the old primary, is reported lost; the next run takes
// it on the new one.
func TestJobAcrossSwitchover(t *testing.T) {
	long(t)
	p := pgtest.StartPatroni(t)
	db := pgtest.Open(t, "pgx", p.DSN()) // lib/pq: p.KeywordDSN()
	locker := sqllock.New(db)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lk, err := locker.Lock(ctx, sqllock.Hash("job"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Switchover(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Done(): // the job stops here: its lock was on the old primary
	case <-ctx.Done():
		t.Fatal("the holder was not told of its loss")
	}
	next, err := locker.Lock(ctx, sqllock.Hash("job")) // the next run, on the new primary
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// haFaultKind is a fault: do makes it happen to old, the primary; with
// stall, replication stalls first, while more tokens are handed out (as a
// host that dies often stalls first); inPlace, the primary stays where it
// was (Patroni restarts a crashed PostgreSQL where it ran).
type haFaultKind struct {
	name    string
	stall   bool
	inPlace bool
	do      func(ctx context.Context, old *pgtest.Node) error
}

// haFault runs one fault on a healthy cluster and checks what each client
// sees.
func haFault(t *testing.T, ctx context.Context, p *pgtest.Patroni, w *haWriter, clients []*haClient, sc haScale, syncMode bool, f haFaultKind) {
	wctx, cancel := context.WithTimeout(ctx, sc.wait)
	defer cancel()
	if err := p.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	old, err := p.Primary(wctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		if err := c.waitLeaderOn(wctx, old); err != nil {
			t.Fatalf("%s: %v", c.drv, err)
		}
	}
	// The holders take their locks and tokens now: a token handed out just
	// before the fault is the one a failover can lose.
	prep := time.Now()
	held := make([][]*haHeld, len(clients))
	for i, c := range clients {
		if held[i], err = c.takeLocks(wctx, 0, sc.locks); err != nil {
			t.Fatalf("%s: %v", c.drv, err)
		}
	}
	churns := make([]haChurn, len(clients))
	if f.stall {
		resume, err := p.StallReplication(wctx)
		if err != nil {
			t.Fatal(err)
		}
		defer resume()
		// While no standby receives anything: a new leader (the old one
		// resigns), more locks with their tokens, and one key whose
		// holders follow one another as fast as they can, each with a
		// token. A token statement that waits for the synchronous standby
		// does not return before the fault (it fails with it); one that
		// returns must still be below its successor's.
		stalled := time.Now()
		sctx, cancel := context.WithTimeout(wctx, time.Second)
		var wg sync.WaitGroup
		late := make([][]*haHeld, len(clients))
		for i, c := range clients {
			wg.Go(func() { c.resignLeader(sctx) })
			wg.Go(func() { late[i], _ = c.takeLocks(sctx, sc.locks, sc.late) })
			wg.Go(func() { churns[i] = c.churn(sctx, int32(sc.locks+sc.late)) })
		}
		waitGroup(t, &wg, hangCeiling)
		cancel()
		t.Logf("replication stalled for %v before the fault", time.Since(stalled).Round(time.Millisecond))
		for i := range clients {
			for _, h := range late[i] {
				if h != nil {
					held[i] = append(held[i], h)
				}
			}
		}
	}
	leaders := make([]*haTerm, len(clients))
	for i, c := range clients {
		leaders[i] = c.leading()
	}
	rowsBefore := w.ok.Load()
	at := time.Now()
	if err := f.do(wctx, old); err != nil {
		t.Fatal(err)
	}
	faultTook := time.Since(at)
	var np *pgtest.Node
	if f.inPlace {
		np, err = p.WaitPrimary(wctx, nil)
	} else {
		np, err = p.WaitPrimary(wctx, old)
	}
	if err != nil {
		t.Fatal(err)
	}
	if f.inPlace && np != old {
		t.Errorf("after %s the primary is %s, want %s (restarted in place, no failover)", f.name, np, old)
	}
	t.Logf("%s → %s: the fault call took %v, the new primary accepted writes %v after the fault began",
		old, np, faultTook.Round(time.Millisecond), time.Since(at).Round(time.Millisecond))
	results := make([]*haResult, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() { results[i] = c.observe(wctx, prep, at, np, leaders[i], held[i], churns[i]) })
	}
	waitGroup(t, &wg, hangCeiling)
	for i, c := range clients {
		r := results[i]
		t.Run(c.drv, func(t *testing.T) {
			for _, e := range r.errs {
				t.Error(e)
			}
			t.Logf("%s", r.summary())
			// Tokens never go back across a restart, nor across a failover
			// to a synchronous standby; an asynchronous one can lack the
			// last of them.
			if syncMode || f.inPlace {
				for _, s := range r.smaller {
					t.Errorf("token smaller than its predecessor's: %s", s)
				}
			} else if len(r.smaller) > 0 {
				t.Logf("async mode, not asserted: %s", strings.Join(r.smaller, "; "))
			}
		})
	}
	for w.ok.Load() < rowsBefore+10 {
		if wctx.Err() != nil {
			t.Fatalf("writes did not resume on %s: %d rows before the fault, %d now", np, rowsBefore, w.ok.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// haClient is one driver's view of the cluster: a Locker that holds locks
// on distinct keys, and an election with candidates in goroutines.
type haClient struct {
	drv    string
	db     *sql.DB
	locker *sqllock.Locker
	class  int32
	sc     haScale
	elect  *sqllock.Election

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	terms []*haTerm // guarded by mu, as are the terms' fields; in the order they began
}

// haTerm is a candidate's term as leader.
type haTerm struct {
	value      string
	start      time.Time
	pid        int
	probed     bool // the fields below are set
	token      int64
	tokenErr   error
	port       int  // the server the leader's session is on
	inRecovery bool // ... and whether it is a standby
	probeErr   error
	resign     chan struct{} // closed: step down
	end        time.Time     // zero while it leads
	endErr     error         // Err() when the term ended
}

// haHeld is a lock taken before a fault, and its token.
type haHeld struct {
	key      sqllock.Key
	id       int32
	lk       *sqllock.Lock
	token    int64
	tokenErr error
	told     chan time.Time // receives when Done closed
}

func newHAClient(t *testing.T, ctx context.Context, drv, dsn string, class int32, sc haScale) *haClient {
	db := pgtest.Open(t, drv, dsn)
	db.SetMaxIdleConns(sc.locks + sc.late + 2*sc.candidates + 4)
	c := &haClient{drv: drv, db: db, class: class, sc: sc,
		locker: sqllock.New(db, sqllock.WithKeepAlive(sc.keepAlive))}
	c.elect = c.locker.Election(sqllock.Pair(class, 1_000_000))
	cctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	for i := range sc.candidates {
		value := fmt.Sprintf("%s-%d", drv, i)
		c.wg.Go(func() { c.campaign(cctx, value) })
	}
	t.Cleanup(c.stop)
	return c
}

// campaign runs a candidate until ctx ends: campaign, lead until the term
// ends (lost, or asked to resign), campaign again.
func (c *haClient) campaign(ctx context.Context, value string) {
	for ctx.Err() == nil {
		ld, err := c.elect.Campaign(ctx, value)
		if err != nil {
			select { // the server is away: a failover
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		tm := &haTerm{value: value, start: time.Now(), pid: ld.PID(), resign: make(chan struct{})}
		c.mu.Lock()
		c.terms = append(c.terms, tm)
		c.mu.Unlock()
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		token, tokenErr := ld.Token(qctx)
		var inRecovery bool
		var port int
		probeErr := func() (err error) {
			// The term's own connection, which the Locker discards as it
			// finds the term lost (a failover) from another goroutine: pgx
			// can panic in a read cut so. That is this probe's failure.
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("probe of the term's connection: %v", r)
				}
			}()
			// Between the session's own statements (its keep-alive's): two
			// at once on one connection fail ("conn busy").
			return sqllock.OnConn(ld, func(conn *sql.Conn) error {
				return conn.QueryRowContext(qctx, "SELECT pg_is_in_recovery(), inet_server_port()").Scan(&inRecovery, &port)
			})
		}()
		cancel()
		c.mu.Lock()
		tm.probed, tm.token, tm.tokenErr, tm.inRecovery, tm.port, tm.probeErr = true, token, tokenErr, inRecovery, port, probeErr
		c.mu.Unlock()
		select {
		case <-ld.Done():
		case <-tm.resign:
		case <-ctx.Done():
		}
		if ld.Err() == nil {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			ld.Unlock(rctx)
			cancel()
		}
		c.mu.Lock()
		tm.end, tm.endErr = time.Now(), ld.Err()
		c.mu.Unlock()
	}
}

// leading returns a copy of the term under way, if any.
func (c *haClient) leading() *haTerm {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.terms) - 1; i >= 0; i-- {
		if c.terms[i].end.IsZero() {
			return c.terms[i]
		}
	}
	return nil
}

// term returns a copy of tm, taken under c.mu.
func (c *haClient) term(tm *haTerm) haTerm {
	c.mu.Lock()
	defer c.mu.Unlock()
	return *tm
}

// waitLeaderOn waits until a candidate leads on node n.
func (c *haClient) waitLeaderOn(ctx context.Context, n *pgtest.Node) error {
	for {
		if tm := c.leading(); tm != nil {
			if cp := c.term(tm); cp.probed && cp.probeErr == nil && cp.tokenErr == nil && cp.port == n.Port {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no leader on %s: %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// resignLeader asks the leader to step down, and waits until the next
// one is elected and has tried to get its token, or ctx ends.
func (c *haClient) resignLeader(ctx context.Context) {
	tm := c.leading()
	if tm == nil {
		return
	}
	close(tm.resign)
	for ctx.Err() == nil {
		if next := c.leading(); next != nil && next != tm && c.term(next).probed {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// takeLocks takes n locks from key first on, and their tokens, in
// parallel. A lock that could not be taken is nil in the result, and its
// error joins the error returned; a token's error too.
func (c *haClient) takeLocks(ctx context.Context, first, n int) ([]*haHeld, error) {
	hs := make([]*haHeld, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range hs {
		wg.Go(func() {
			id := int32(first + i)
			h := &haHeld{key: sqllock.Pair(c.class, id), id: id, told: make(chan time.Time, 1)}
			if h.lk, errs[i] = c.locker.Lock(ctx, h.key); errs[i] != nil {
				return
			}
			go func() { <-h.lk.Done(); h.told <- time.Now() }()
			h.token, h.tokenErr = h.lk.Token(ctx)
			errs[i] = h.tokenErr
			hs[i] = h
		})
	}
	wg.Wait()
	return hs, errors.Join(errs...)
}

// haChurn is a key whose holders followed one another: n of them got a
// token, the last of which was max.
type haChurn struct {
	key   sqllock.Key
	id    int32
	n     int
	max   int64
	after int64 // the next holder's, after the fault
}

// churn locks key id, takes its token and unlocks it, again and again
// until ctx ends.
func (c *haClient) churn(ctx context.Context, id int32) haChurn {
	ch := haChurn{key: sqllock.Pair(c.class, id), id: id}
	for ctx.Err() == nil {
		lk, err := c.locker.Lock(ctx, ch.key)
		if err != nil {
			continue
		}
		t, err := lk.Token(ctx)
		if err != nil {
			return ch // its session may still be busy: the lock goes with the fault
		}
		ch.n, ch.max = ch.n+1, max(ch.max, t)
		lk.Unlock(ctx)
	}
	return ch
}

// haResult is what a client saw of one fault.
type haResult struct {
	drv            string
	told, regrant  []time.Duration // per lock, from the fault
	late, lateOK   int             // locks taken while replication stalled; with a token
	oldLeader      *haTerm
	oldLeaderTold  time.Duration
	newLeader      haTerm
	newLeaderAt    time.Duration
	newPrimary     *pgtest.Node
	tokens         [][2]int64 // per lock: before, after (0: none)
	churn          haChurn
	leaderTokens   []int64 // of the terms in the order they began, those with a token
	errs, smaller  []string
	leaderAgrees   bool
	oldToldAfterIn time.Duration // > 0: the old leader was told this long after the new one was elected
}

// observe follows one fault that began at at, for this client: holders
// told (the leader then was old), locks granted again on np, a new leader
// there, tokens (of the leaders since prep).
func (c *haClient) observe(ctx context.Context, prep, at time.Time, np *pgtest.Node, old *haTerm, held []*haHeld, churn haChurn) *haResult {
	r := &haResult{drv: c.drv, newPrimary: np, oldLeader: old, churn: churn, told: make([]time.Duration, len(held)),
		regrant: make([]time.Duration, len(held)), tokens: make([][2]int64, len(held))}
	var mu sync.Mutex // guards r.errs
	fail := func(format string, args ...any) {
		mu.Lock()
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for _, h := range held[c.sc.locks:] {
		r.late++
		if h.tokenErr == nil {
			r.lateOK++
		}
	}
	admin, err := sql.Open("pgx", np.AdminDSN())
	if err != nil {
		fail("%v", err)
		return r
	}
	defer admin.Close()
	var wg sync.WaitGroup
	for i, h := range held {
		wg.Go(func() {
			if h.tokenErr == nil {
				r.tokens[i][0] = h.token
			}
			select {
			case when := <-h.told:
				r.told[i] = when.Sub(at)
			case <-ctx.Done():
				fail("holder of %v not told: %v", h.key, ctx.Err())
				return
			}
			if err := h.lk.Err(); !errors.Is(err, sqllock.ErrLockLost) {
				fail("holder of %v: Err() = %v, want ErrLockLost", h.key, err)
			}
			// The next holder of the key, on the new primary.
			lk, err := c.relock(ctx, h.key)
			if err != nil {
				fail("Lock(%v) after the fault: %v", h.key, err)
				return
			}
			r.regrant[i] = time.Since(at)
			defer lk.Unlock(bg())
			if r.tokens[i][1], err = lk.Token(ctx); err != nil {
				fail("Token(%v) after the fault: %v", h.key, err)
			}
			var pid int
			if err := admin.QueryRowContext(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
				AND classid = $1 AND objid = $2 AND objsubid = 2`, int64(uint32(c.class)), int64(uint32(h.id))).Scan(&pid); err != nil {
				fail("%v after the fault: not held on the new primary %s: %v", h.key, np, err)
			} else if pid != lk.PID() {
				fail("%v after the fault: held by backend %d on %s, the lock says %d", h.key, pid, np, lk.PID())
			}
		})
	}
	if churn.n > 0 {
		wg.Go(func() {
			lk, err := c.relock(ctx, churn.key)
			if err != nil {
				fail("Lock(%v) after the fault: %v", churn.key, err)
				return
			}
			defer lk.Unlock(bg())
			if r.churn.after, err = lk.Token(ctx); err != nil {
				fail("Token(%v) after the fault: %v", churn.key, err)
			}
		})
	}
	// The old leader is told; a new one is elected on the new primary.
	wg.Go(func() { c.observeLeaders(ctx, prep, at, np, r, fail) })
	wg.Wait()
	for i, tk := range r.tokens {
		if tk[0] != 0 && tk[1] != 0 && tk[1] <= tk[0] {
			r.smaller = append(r.smaller, fmt.Sprintf("%v: token %d after the fault, %d before", held[i].key, tk[1], tk[0]))
		}
	}
	if ch := r.churn; ch.n > 0 && ch.after != 0 && ch.after <= ch.max {
		r.smaller = append(r.smaller, fmt.Sprintf("%v: token %d after the fault, %d before (the last of %d holders)", ch.key, ch.after, ch.max, ch.n))
	}
	for i := 1; i < len(r.leaderTokens); i++ {
		if a, b := r.leaderTokens[i-1], r.leaderTokens[i]; b <= a {
			r.smaller = append(r.smaller, fmt.Sprintf("leader token %d after %d", b, a))
		}
	}
	return r
}

// relock takes key k again after a fault, trying until ctx ends.
func (c *haClient) relock(ctx context.Context, k sqllock.Key) (*sqllock.Lock, error) {
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lk, err := c.locker.Lock(lctx, k)
		cancel()
		if err == nil || ctx.Err() != nil {
			return lk, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// observeLeaders waits until the leader at the fault (old) is told and a
// new one is elected after at, and checks that it leads on np. It gathers
// the tokens of the terms from the one under way at prep to the new one.
func (c *haClient) observeLeaders(ctx context.Context, prep, at time.Time, np *pgtest.Node, r *haResult, fail func(string, ...any)) {
	var nl *haTerm
	for {
		var ended bool
		var endErr error
		if r.oldLeader != nil {
			o := c.term(r.oldLeader)
			ended, endErr, r.oldLeaderTold = !o.end.IsZero(), o.endErr, o.end.Sub(at)
		}
		c.mu.Lock()
		nl = nil // chosen anew: a term can turn out to be the old server's last
		for _, tm := range c.terms {
			// A term granted on the old primary as it shut down (its
			// holder's session ended at once, and the term with it) is
			// the old server's last grant, not the new leader.
			lastOnOld := tm.probed && tm.port != np.Port && !tm.end.IsZero() && errors.Is(tm.endErr, sqllock.ErrLockLost)
			if tm.start.After(at) && nl == nil && !lastOnOld {
				nl = tm
			}
		}
		// One on another server is waited on until it ends (skipped
		// above, when lost) or the wait does (a failure).
		probed := nl != nil && nl.probed && (nl.port == np.Port || !nl.end.IsZero())
		c.mu.Unlock()
		if (r.oldLeader == nil || ended) && probed {
			if r.oldLeader != nil && !errors.Is(endErr, sqllock.ErrLockLost) {
				fail("old leader %q: Err() = %v, want ErrLockLost", r.oldLeader.value, endErr)
			}
			break
		}
		if ctx.Err() != nil {
			fail("old leader told: %v; new leader: %v (%v)", ended, nl != nil, ctx.Err())
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.newLeader = c.term(nl)
	r.newLeaderAt = r.newLeader.start.Sub(at)
	switch l := r.newLeader; {
	case l.probeErr != nil:
		fail("new leader %q: %v", l.value, l.probeErr)
	case l.port != np.Port || l.inRecovery:
		fail("new leader %q is on port %d (in recovery: %v), not on the new primary %s (%d)", l.value, l.port, l.inRecovery, np, np.Port)
	}
	if r.newLeader.tokenErr != nil {
		fail("new leader %q: Token: %v", r.newLeader.value, r.newLeader.tokenErr)
	}
	if d := r.oldLeaderTold - r.newLeaderAt; r.oldLeader != nil && d > 0 {
		r.oldToldAfterIn = d
	}
	c.mu.Lock()
	for _, tm := range c.terms {
		if tm.probed && tm.tokenErr == nil && (tm.end.IsZero() || tm.end.After(prep)) && !tm.start.After(r.newLeader.start) {
			r.leaderTokens = append(r.leaderTokens, tm.token)
		}
	}
	c.mu.Unlock()
	// Election.Leader, from the client's pool, names the same session
	// (unless the term ended meanwhile).
	for {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ld, err := c.elect.Leader(lctx)
		cancel()
		if err == nil && ld.PID == r.newLeader.pid && ld.Value == r.newLeader.value {
			r.leaderAgrees = true
			return
		}
		if !c.term(nl).end.IsZero() {
			return
		}
		if ctx.Err() != nil {
			fail("Election.Leader = %v, %v; want %q (backend %d)", ld, err, r.newLeader.value, r.newLeader.pid)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// summary is one line of figures.
func (r *haResult) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d holders told %s after the fault", len(r.told), spread(r.told))
	if r.oldLeader != nil {
		fmt.Fprintf(&b, " (old leader %q: %v)", r.oldLeader.value, r.oldLeaderTold.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "; granted again on %s %s", r.newPrimary, spread(r.regrant))
	if nl := r.newLeader; nl.pid != 0 {
		fmt.Fprintf(&b, "; new leader %q at %v (Election.Leader agrees: %v)", nl.value, r.newLeaderAt.Round(time.Millisecond), r.leaderAgrees)
		if r.oldToldAfterIn > 0 {
			fmt.Fprintf(&b, ", the old one told %v after it", r.oldToldAfterIn.Round(time.Millisecond))
		}
	}
	if r.late > 0 {
		fmt.Fprintf(&b, "; %d locks taken while replication stalled, %d of them got a token, and %d successive holders of %v (the last token %d; after the fault %d)",
			r.late, r.lateOK, r.churn.n, r.churn.key, r.churn.max, r.churn.after)
	}
	fmt.Fprintf(&b, "; leader tokens %v", r.leaderTokens)
	var steps []int64
	for _, tk := range r.tokens {
		if tk[0] != 0 && tk[1] != 0 {
			steps = append(steps, tk[1]-tk[0])
		}
	}
	if len(steps) > 0 {
		slices.Sort(steps)
		fmt.Fprintf(&b, "; lock tokens after − before: %d to %d", steps[0], steps[len(steps)-1])
	}
	return b.String()
}

// spread returns "min–max" of ds, rounded.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return fmt.Sprintf("%v–%v", s[0].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// stop ends the candidates (a leader resigns). It is safe to call twice.
func (c *haClient) stop() {
	c.cancel()
	c.wg.Wait()
}

// haWriter inserts rows on the primary, as fast as it can, until stopped:
// the write traffic a token's durability depends on.
type haWriter struct {
	ok, failed atomic.Int64
	cancel     context.CancelFunc
	done       chan struct{}
}

func startHAWriter(t *testing.T, ctx context.Context, p *pgtest.Patroni) *haWriter {
	db := pgtest.Open(t, "pgx", p.DSN())
	if _, err := db.ExecContext(ctx, `CREATE TABLE ha_writes (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())`); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	w := &haWriter{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for wctx.Err() == nil {
			ictx, cancel := context.WithTimeout(wctx, 2*time.Second)
			_, err := db.ExecContext(ictx, `INSERT INTO ha_writes DEFAULT VALUES`)
			cancel()
			if err == nil {
				w.ok.Add(1)
				continue
			}
			w.failed.Add(1)
			select {
			case <-wctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

// stop ends the writer. It is safe to call twice.
func (w *haWriter) stop() {
	w.cancel()
	<-w.done
}

// haNoAdvisoryLocks waits until node n holds no advisory lock, and fails t
// after 10 s.
func haNoAdvisoryLocks(t *testing.T, ctx context.Context, n *pgtest.Node) {
	t.Helper()
	db, err := sql.Open("pgx", n.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var count int
		err := db.QueryRowContext(qctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&count)
		cancel()
		if err == nil && count == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d advisory locks left (%v)", n, count, err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
