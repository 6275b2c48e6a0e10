package sqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/core/seams"
	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// Election is a leader election on a key: of the candidates that campaign
// on it, in every process that uses the same key, at most one leads at a
// time, for as long as it holds the key's lock. [Election.Lead] is the
// loop most programs want: it runs a function for each term, and
// campaigns again after a loss. Under it, the shape of etcd's
// concurrency.Election: [Election.Campaign] blocks until elected,
// the term's [Lock.Unlock] steps down, [Election.Leader] tells who leads without
// campaigning, and [Election.Observe] reports each change.
//
// The leader's value (what identifies the candidate, such as its host
// name) is visible to everyone without a table: it is the
// application_name of the session that holds the lock, prefixed with
// "sqllock-election:", as pg_stat_activity and `sqllock inspect` show it.
// The leader changes it with [Election.Proclaim].
//
// An Election is safe for concurrent use.
type Election struct {
	l       *Locker
	key     Key
	backoff backoff // Lead's pauses; tests shorten them

	mu   sync.Mutex
	term *Lock // guarded by mu: the last term Campaign won (nil: none)
}

// electionPrefix starts the application_name of a candidate's session: the
// rest is its value.
const electionPrefix = sqltext.ElectionPrefix

// maxValue is the longest value: application_name holds 63 bytes.
const maxValue = 63 - len(electionPrefix)

// Election returns the election on key k.
func (l *Locker) Election(k Key) *Election {
	return &Election{l: l, key: k, backoff: backoff{first: 250 * time.Millisecond, most: 5 * time.Second, reset: 10 * time.Second}}
}

// Campaign waits until this candidate is elected, and returns its term:
// the lock that makes it the leader, for as long as it holds it (until
// its Unlock, which resigns, or its loss: Done closes and Err says why;
// work done as leader stops then, and writes to shared resources carry
// the term's fencing token, [Lock.Token]). value identifies the candidate
// to everyone (1 to 46 bytes of
// printable ASCII, without quotes, ' or ", or backslashes). It waits in
// the server (no polling), as [Locker.Lock] does; while it waits, its
// session carries its value too, as a candidate's. When ctx ends first, it
// returns an error matching [ErrNotAcquired] and ctx.Err(), and this
// candidate does not lead. Other errors are those of Locker.Lock, and
// [ErrInvalidKey] for an unusable value. [Election.Lead] is the loop
// around it: most programs want that instead.
func (e *Election) Campaign(ctx context.Context, value string) (*Lock, error) {
	mustContext(ctx, "Election.Campaign")
	if err := checkValue(value); err != nil {
		return nil, err
	}
	term, err := e.l.acquire(ctx, e.key, false, false, electionPrefix+value)
	if err == nil {
		e.mu.Lock()
		e.term = term
		e.mu.Unlock()
	}
	return term, err
}

// Proclaim changes the value of this Election's leader, the candidate
// whose term it won last ([Election.Campaign], or [Election.Lead]'s), to
// value: the name its session carries, which [Election.Leader],
// [Election.Observe] and `sqllock inspect` read. The term goes on: the
// same lock on the same session, its fencing token unchanged. It is one
// statement on the term's session, which names the session only while
// it holds the lock: the server shows the new value once Proclaim
// returns nil (Observe reports it at its next ask, within about 20 ms).
// A later Campaign (Lead's, after a lost term) carries the value it is
// given, not this one.
//
// It returns an error matching [ErrNotLeader] when this Election does
// not lead (never elected, or its term resigned), that also matches
// [ErrLockLost] when the term was found lost, before or by the statement;
// an error matching [ErrInvalidKey] for a value Campaign would refuse;
// and ctx's error when ctx ends first (the statement may then have run:
// ask Leader).
func (e *Election) Proclaim(ctx context.Context, value string) error {
	mustContext(ctx, "Election.Proclaim")
	if err := checkValue(value); err != nil {
		return err
	}
	e.mu.Lock()
	term := e.term
	e.mu.Unlock()
	if term == nil {
		return fmt.Errorf("%w: election %s: this Election has not been elected", ErrNotLeader, e.l.name(e.key))
	}
	if err := term.Err(); err != nil {
		return e.notLeader(err)
	}
	if _, err := term.h.Tag(ctx, sqltext.ProclaimSQL(electionPrefix+value, e.l.pool.Pinned())); err != nil {
		if lerr := term.Err(); lerr != nil {
			return e.notLeader(lerr)
		}
		return fmt.Errorf("sqllock: election %s: proclaim: %w", e.l.name(e.key), err)
	}
	return nil
}

// notLeader returns Proclaim's error for a term that ended with err
// (ErrReleased, or a loss).
func (e *Election) notLeader(err error) error {
	if errors.Is(err, ErrReleased) {
		return fmt.Errorf("%w: election %s: its term was resigned", ErrNotLeader, e.l.name(e.key))
	}
	return fmt.Errorf("%w: election %s: %w", ErrNotLeader, e.l.name(e.key), err)
}

// Lead campaigns with value, as [Election.Campaign] does, and runs fn each
// time this candidate is elected, with the term and a context that ends
// when the term does: when its lock is found lost (by the keep-alive, see
// [WithKeepAlive]; context.Cause then wraps [ErrLockLost]) or when ctx
// ends. It is the loop of Kubernetes'
// leaderelection: fn's start is OnStartedLeading, its return
// OnStoppedLeading.
//
//   - When fn returns while this candidate leads, Lead resigns and returns
//     fn's error (nil included), combined with the resignation's as
//     [Locker.Do] does. fn may resign the term itself; Lead then returns
//     when fn does.
//   - When the term is lost, Lead waits for fn to return, drops its
//     result, and campaigns again. The term is lost when its context
//     ended with the loss, or when fn returns an error and the
//     resignation fails too (fn met the loss first: a [Lock.Token]
//     on the lost session, say).
//   - When ctx ends, fn's context ends; Lead waits for fn, resigns, and
//     returns an error matching ctx.Err() (and [ErrNotAcquired] when it
//     was not leading).
//   - When fn panics, Lead resigns and the panic goes on, as in Do.
//
// Lead never spins. After a lost term or a failed Campaign (the server
// down or restarting, a standby, a broken connection) it pauses before it
// campaigns again, a random time that doubles from at most a quarter
// second to at most 5 s, and starts over after an attempt (a campaign and
// its term) that lasted 10 s; failed campaigns go to the Locker's logger
// (Warn). It returns at once on an error no retry can fix: an invalid
// value or key ([ErrInvalidKey]), a server without advisory locks
// ([ErrUnsupportedServer]), a closed *sql.DB. Lead panics if fn is nil.
func (e *Election) Lead(ctx context.Context, value string, fn func(ctx context.Context, term *Lock) error) error {
	mustContext(ctx, "Election.Lead")
	if fn == nil {
		panic("sqllock: Election.Lead called with a nil fn")
	}
	if err := checkValue(value); err != nil {
		return err
	}
	b := e.backoff
	for {
		began := time.Now()
		term, err := e.Campaign(ctx, value)
		switch {
		case err == nil:
			again, err := e.lead(ctx, term, fn)
			if !again {
				return err
			}
			// Lost: another candidate leads now, or this one's server or
			// session is in trouble; either way, pause first.
		case stmt.CtxEnded(ctx):
			return e.ended(ctx, false, err)
		case permanent(err):
			return err
		}
		pause := b.next(began)
		if err != nil {
			e.l.log(ctx, slog.LevelWarn, "sqllock: campaign failed; campaigning again", e.key,
				slog.String("value", value), slog.Any("error", err), slog.Duration("in", pause))
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return e.ended(ctx, false, err)
		}
	}
}

// lead runs fn for the term ld, then resigns, and reports whether Lead
// campaigns again (the term was lost while fn ran) or returns err.
func (e *Election) lead(ctx context.Context, ld *Lock, fn func(context.Context, *Lock) error) (again bool, err error) {
	tctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(ld.h.Context(), func() { cancel(ld.Err()) })
	returned := false
	defer func() {
		stop()
		cancel(nil)
		if !returned {
			ld.Unlock(ctx) // fn panicked: resign; the panic goes on
		}
	}()
	ferr := fn(tctx, ld)
	returned = true
	// What ended fn's term, as fn returned: ctx, a loss it was told of,
	// its own Unlock, or nothing (fn is done).
	ended := stmt.CtxEnded(ctx)
	told := errors.Is(context.Cause(tctx), ErrLockLost)
	var rerr error
	if !errors.Is(ld.Err(), ErrReleased) {
		rerr = ld.Unlock(ctx)
	}
	switch {
	case ended:
		return false, e.ended(ctx, true, runError(ferr, rerr))
	case told:
		return true, rerr // fn's result is about the loss
	case ferr != nil && rerr != nil:
		// fn failed, and so did the resignation: fn met the loss before
		// it was told (a statement on the lost session).
		return true, rerr
	}
	return false, runError(ferr, rerr)
}

// ended returns the error of a Lead whose ctx ended, leading or not, after
// err (fn's, or the resignation's, or the last campaign's): err when it
// matches ctx's, else one that does, and carries err.
func (e *Election) ended(ctx context.Context, leading bool, err error) error {
	cerr := stmt.CtxErr(ctx)
	if errors.Is(err, cerr) {
		return err
	}
	end := stmt.NotAcquired("election "+e.l.name(e.key), cerr)
	if leading {
		end = fmt.Errorf("sqllock: election %s: the term ended with the context: %w", e.l.name(e.key), cerr)
	}
	if err == nil {
		return end
	}
	return fmt.Errorf("%w; %w", end, err)
}

// permanent reports whether err, a Campaign's, is one that no retry can
// fix.
func permanent(err error) bool {
	// database/sql's error for a closed DB is not exported.
	return errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrUnsupportedServer) ||
		strings.Contains(err.Error(), "sql: database is closed")
}

// backoff spaces Lead's campaigns: after an attempt (a campaign and its
// term) shorter than reset, the pause doubles from first up to most; each
// is a random time in its upper half, so that candidates that failed
// together do not campaign together again.
type backoff struct {
	first, most, reset time.Duration
	n                  int // short attempts in a row
}

// next returns the pause after an attempt that began at began.
func (b *backoff) next(began time.Time) time.Duration {
	if time.Since(began) >= b.reset {
		b.n = 0
	}
	d := b.first
	for i := 0; i < b.n && d < b.most; i++ {
		d *= 2
	}
	d = min(d, b.most)
	b.n++
	return d/2 + rand.N(d/2+1)
}

// checkValue returns an error matching ErrInvalidKey for a value a
// candidate cannot campaign with.
func checkValue(value string) error {
	if !validAppName(value) || len(value) > maxValue || strings.Contains(value, `"`) {
		return fmt.Errorf(`%w: election value %q: want 1 to %d bytes of printable ASCII without quotes (' or ") or backslashes`, ErrInvalidKey, value, maxValue)
	}
	return nil
}

// Leader is who leads an election, as the server shows it.
type Leader struct {
	Value      string    // the leader's value ("" when no candidate holds the key)
	PID        int       // the backend of the leader's session (0: no leader)
	ClientAddr string    // the leader's client address, when the server shows it
	Since      time.Time // when the leader's session was last granted or changed state
}

// String returns "value (backend PID)", or "no leader".
func (ld Leader) String() string {
	if ld.PID == 0 {
		return "no leader"
	}
	return fmt.Sprintf("%q (backend %d)", ld.Value, ld.PID)
}

// Leader returns who leads now, in one query: the zero Leader (PID 0)
// when no one does. It needs no privileges, and costs the leader nothing.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	mustContext(ctx, "Election.Leader")
	c, o, sub := stmt.Tag(e.key.sqlKey())
	q, args := e.l.pool.Mode.TagArgs(sqltext.LeaderSQL, int64(c), int64(o), sub)
	for try := 0; ; try++ {
		// Bounded by ctx whatever the driver does (see stmt.Bounded).
		r, err := stmt.Bounded(ctx, func() (holderRow, error) {
			var r holderRow
			err := e.l.pool.QueryRow(ctx, q, args, &r.pid, &r.name, &r.addr, &r.since)
			return r, err
		}, nil)
		if errors.Is(err, sql.ErrNoRows) {
			return Leader{}, nil // no holder
		}
		if err != nil {
			return Leader{}, fmt.Errorf("sqllock: election %s: %w", e.l.name(e.key), err)
		}
		ld, named := r.leader()
		if !named && try < leaderRetries && ctx.Err() == nil {
			// Granted a moment ago: the statement that was granted the
			// lock names its session next.
			time.Sleep(time.Millisecond)
			continue
		}
		return ld, nil
	}
}

// holderRow is a row of LeaderSQL (or ObserveSQL's last four columns).
type holderRow struct {
	pid               int
	name, addr, since string
}

// leader returns the Leader r shows, and whether its session carries a
// candidate's name: not when no one holds the key (or a prepared
// transaction does), or a holder that is no candidate, or one granted
// a moment ago that has not named its session yet.
func (r holderRow) leader() (ld Leader, named bool) {
	if r.pid == 0 {
		return Leader{}, true
	}
	ld.PID, ld.ClientAddr = r.pid, r.addr
	ld.Value, named = strings.CutPrefix(r.name, electionPrefix)
	if r.since != "" {
		ld.Since, _ = time.Parse(time.RFC3339Nano, r.since)
	}
	return ld, named
}

// leaderRetries is how many times Leader reads again a leader whose
// session does not carry its value yet.
const leaderRetries = 20

// Observe reports the election's leader on the returned channel: the
// leader at once, then each change (including to no leader, the zero
// Leader), in order, until ctx ends, when it closes the channel.
//
// It asks the server every 20 ms, whatever the Locker's keep-alive: a
// term of 100 ms is reported, its start and then its end (no leader, or
// the next leader); a term shorter than the interval can go unseen. Each
// ask is a small query on a connection of the Locker's *sql.DB that
// reads the names of the candidates' sessions (pg_stat_activity); when
// they changed, and once a second, a second one reads the key's holder
// (pg_locks, whose reading copies the server's whole lock table). A lock
// on the key taken by hand, not by a candidate, is seen within that
// second. Observing costs the candidates nothing; its cost to the server
// is in docs/benchmarks.md. A failed ask is retried at the next interval.
//
// A leader that crashes sends nothing: Observe reports it gone at its
// first ask after the server ends the leader's session. When the
// leader's process dies (killed with SIGKILL, say), its kernel closes its
// connection and the server ends the session at once: "no leader" (or
// the next leader) comes within about an interval. When its host
// vanishes or is cut off (or, on PostgreSQL 14 and later, its process
// stops), the server ends the session within the leader's orphan bound
// (its Locker's [WithOrphanBound], 30 s by default), and Observe reports
// it within an interval after that.
//
// A consumer that falls behind misses nothing: the changes wait for it,
// in the order they happened, and it receives them late, one by one; the
// value it receives is the current leader only once it has caught up. It
// can fall 1,000 changes behind; past that, the oldest it has not
// received are dropped. A leader is told from the next by its backend and
// value: a candidate re-elected on the same session between two asks
// looks like one term.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	mustContext(ctx, "Election.Observe")
	ch := make(chan Leader)
	seen := make(chan Leader)
	go e.poll(ctx, seen)
	go deliver(ctx, seen, ch)
	return ch
}

// observeEvery is how often Observe asks who leads. Observe polls on an
// interval of its own, a fifth of a term of a tenth of a second, rather
// than at the keep-alive's (which sets how soon a holder learns of a
// loss: seconds) or through LISTEN/NOTIFY: a listener needs a session of
// its own and a driver's API to receive notifications, which
// database/sql does not have; a notifying commit takes a cluster-wide
// lock, which every term would pay; and a leader that crashes sends
// nothing, so a poll would be needed anyway. A shorter interval would
// cost the server in proportion (each ask is a statement, and the
// backend's wake-up) and see such a term hardly more surely: what hides
// one is a stall of the observer (or its backend) about as long as the
// term, not the interval. Each ask reads the candidates' digest
// (CandidatesSQL), not pg_locks: reading pg_locks costs in proportion to
// every lock held in the server and stalls their takers meanwhile, and is
// done only when the digest changed.
const observeEvery = 20 * time.Millisecond

// observeRecheck is how often Observe reads the key's holder whatever the
// candidates' sessions show: a holder that is no candidate (a lock taken
// by hand) changes no candidate's name.
const observeRecheck = time.Second

// maxBehind is how many changes Observe keeps for a consumer that falls
// behind.
const maxBehind = 1000

// poll asks who leads every observeEvery until ctx ends, and sends each
// change on seen, the first answer included. Each ask is one statement
// (ObserveSQL): the candidates' digest, and the key's holder when the
// digest changed, or a second passed, or the holder was granted so
// recently that it has not named its session yet.
func (e *Election) poll(ctx context.Context, seen chan<- Leader) {
	c, o, sub := stmt.Tag(e.key.sqlKey())
	mode := e.l.pool.Mode
	var last Leader
	var digest int64
	var read time.Time // when the leader was last read
	first, unnamed := true, 0
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		t.Reset(observeEvery)
		sent := time.Now()
		q, args := mode.ObserveArgs(int64(c), int64(o), sub, digest, first || unnamed > 0 || time.Since(read) >= observeRecheck)
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		type answer struct {
			digest int64
			read   bool
			holder holderRow
		}
		// Bounded by qctx whatever the driver does (see stmt.Bounded).
		a, err := stmt.Bounded(qctx, func() (answer, error) {
			var a answer
			err := e.l.pool.QueryRow(qctx, q, args, &a.digest, &a.read, &a.holder.pid, &a.holder.name, &a.holder.addr, &a.holder.since)
			return a, err
		}, nil)
		cancel()
		if err != nil {
			continue
		}
		if !a.read {
			e.asked(sent, false, 0)
			continue
		}
		ld, named := a.holder.leader()
		if !named && unnamed < leaderRetries {
			e.asked(sent, false, 0)
			unnamed++ // ask again at once
			t.Reset(time.Millisecond)
			continue
		}
		digest, read, unnamed = a.digest, time.Now(), 0
		e.asked(sent, true, ld.PID)
		if first || !ld.same(last) {
			select {
			case seen <- ld:
			case <-ctx.Done():
				return
			}
			last, first = ld, false
		}
	}
}

// asked runs the test hook of an answered ask (see seams.Hooks).
func (e *Election) asked(sent time.Time, read bool, holder int) {
	if h := seams.Get(); h != nil && h.ObserveAsked != nil {
		h.ObserveAsked(e.key.String(), sent, read, int64(holder))
	}
}

// deliver passes the changes from seen to ch, in order, queueing them for
// a consumer that falls behind, and closes ch when ctx ends.
func deliver(ctx context.Context, seen <-chan Leader, ch chan<- Leader) {
	defer close(ch)
	var queue []Leader // received from seen, not yet sent on ch
	var sent Leader    // the last value sent on ch, when began
	began := false
	for {
		var out chan<- Leader
		var next Leader
		if len(queue) > 0 {
			out, next = ch, queue[0]
		}
		select {
		case out <- next:
			sent, began, queue = next, true, queue[1:]
		case ld := <-seen:
			if len(queue) == maxBehind {
				// The oldest change not yet sent goes, and so does the
				// one after it if it is the leader last sent: the
				// consumer never receives one leader twice in a row.
				queue = queue[1:]
				if began && queue[0].same(sent) {
					queue = queue[1:]
				}
			}
			queue = append(queue, ld)
		case <-ctx.Done():
			return
		}
	}
}

// same reports whether ld and o are the same leader (or both none).
func (ld Leader) same(o Leader) bool { return ld.PID == o.PID && ld.Value == o.Value }
