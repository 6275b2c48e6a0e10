package core

// A fake PostgreSQL for the core's unit tests, in the manner of
// database/sql's own fake driver: a driver.Connector whose connections
// answer the statements of internal/sqltext from an in-memory server (its
// backends, their settings, and a table of advisory locks, re-entrant per
// backend, shared or exclusive), so that the Pool's real flows run (the
// server check, the pooler probe, tries, unlocks, batches, waits in the
// line, the keep-alive, the lease's touch) with no server. Each statement
// is recognised by its marker (sqltext.Marker) and its text; a statement
// the fake does not know fails, so that a test notices a statement it did
// not expect. Rules (fakeRule) make chosen statements fail, stall, drop
// their connection, answer late or land on another backend.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// fkind is what a statement does, as the fake recognises it.
type fkind string

const (
	fVersion      fkind = "version"       // sqltext.VersionSQL
	fPlainVersion fkind = "plain version" // sqltext.PlainVersionSQL
	fBackend      fkind = "backend"       // sqltext.BackendSQL (the pooler probe)
	fTry          fkind = "try"           // TrySQL, or its plain form
	fPolite       fkind = "polite try"    // PoliteTrySQL
	fSlotTry      fkind = "slot try"      // SemaphoreTrySQL, SemaphorePoliteTrySQL
	fBatchTry     fkind = "batch try"     // BatchText(BatchTry)
	fBatchUnlock  fkind = "batch unlock"  // BatchText(BatchUnlock)
	fBatchMixed   fkind = "batch mixed"   // BatchText(BatchMixed)
	fUnlock       fkind = "unlock"        // UnlockSQL, or its plain form
	fWait         fkind = "wait"          // WaitSQL
	fGranted      fkind = "granted"       // GrantedSQL
	fWaitSlice    fkind = "wait slice"    // WaitSliceSQL
	fRegister     fkind = "register"      // RegisterSQL
	fSlice        fkind = "slice"         // SliceSQL
	fSlotSlice    fkind = "slot slice"    // SemaphoreSliceSQL
	fGiveUp       fkind = "give up"       // LeaveLineSQL
	fSlotGiveUp   fkind = "slot give up"  // SemaphoreLeaveLineSQL
	fDoorbell     fkind = "doorbell"      // DoorbellSQL
	fPlace        fkind = "place"         // PlaceSQL
	fPlaceBack    fkind = "place back"    // PlaceBackSQL
	fAlive        fkind = "alive"         // AliveSQL
	fTouch        fkind = "touch"         // TouchSQL
	fKeepAlive    fkind = "keep-alive"    // KeepAliveSQL
	fSession      fkind = "session"       // SessionSQL
	fReset        fkind = "reset"         // SetBackSQL
	fOwn          fkind = "own"           // OwnSQL
	fNoIdle       fkind = "no idle"       // NoIdleTimeoutSQL
	fToken        fkind = "token"         // TokenSQL
	fHeld         fkind = "held"          // HeldSQL
	fCancelWait   fkind = "cancel wait"   // CancelWaitSQL
	fTerminate    fkind = "terminate"     // TerminateHolderSQL
	fStranded     fkind = "stranded"      // StrandedSQL
	fBegin        fkind = "begin"         // BeginPinnedSQL
	fCommit       fkind = "commit"        // CommitPinnedSQL
	fUnknown      fkind = "unknown"
)

// pgError is an error of the fake server, with its SQLSTATE, as drivers
// expose one.
type pgError struct{ code, msg string }

func (e *pgError) Error() string    { return "ERROR: " + e.msg + " (SQLSTATE " + e.code + ")" }
func (e *pgError) SQLState() string { return e.code }

// sqlState returns a server error of code.
func sqlState(code string) error {
	msg := map[string]string{
		"55P03": "canceling statement due to lock timeout",
		"57014": "canceling statement due to user request",
		"40P01": "deadlock detected",
		"53200": "out of shared memory",
		"57P01": "terminating connection due to administrator command",
		"XX000": "internal error",
	}[code]
	if msg == "" {
		msg = "error " + code
	}
	return &pgError{code, msg}
}

// errFakeConnLost is the error of a statement whose connection broke under
// it (a driver reports so a connection that stopped answering).
var errFakeConnLost = fmt.Errorf("fake: connection lost: %w", io.ErrUnexpectedEOF)

// ftag is an advisory lock's tag in the fake's lock table.
type ftag struct {
	c, o uint32
	sub  int
}

func keyTag(k Key) ftag {
	c, o, s := stmt.Tag(k)
	return ftag{c, o, s}
}

func pairTag(class, id int32) ftag { return ftag{uint32(class), uint32(id), 2} }

// flock is one advisory lock: its holders and how many times each took it,
// by mode.
type flock struct{ excl, shared map[int64]int }

// fbackend is one server session of the fake.
type fbackend struct {
	pid, start int64
	mark       string // sqllock.owner
	dead       bool
	running    fkind         // the statement it runs ("": idle)
	lastWait   bool          // its last statement was a wait (see CancelWaitSQL)
	cancel     chan struct{} // closed by a cancel of the statement it runs (cancelled)
	cancelled  bool
	waitingOn  *ftag // the lock it waits for (nil: none)
	conns      int   // client connections on it
}

// fakeStmt is a statement the fake server received.
type fakeStmt struct {
	kind fkind
	pid  int64 // the backend that ran it
	conn int   // the client connection it came on
	q    string
	args []any
	keys int // batch statements: how many keys they carried
	n    int // its number, from 1, in the server's log
}

// fakeRule changes how the server answers the statements of one kind that
// when accepts (nil: all; it runs under the server's mu, and may change
// the server), for times statements (0: all): in order, the
// connection moves to a new backend (moveTo); the rule is told (entered);
// the statement waits for stall to close; it fails with err, or its
// connection breaks (drop), before it runs or, with afterRun, after it ran
// (its effects stay); with late, its answer comes only once its context
// ended. ignoreCtx makes the stall and the answer deaf to the context (a
// driver that does not give up a read).
type fakeRule struct {
	kind      fkind
	when      func(st *fakeStmt) bool
	times     int
	moveTo    bool
	entered   chan *fakeStmt
	stall     chan struct{}
	ignoreCtx bool
	err       error
	drop      bool
	afterRun  bool
	late      bool

	used     atomic.Int64 // statements it met
	released sync.Once
}

// release ends the rule's stall (once, whoever calls it).
func (r *fakeRule) release() { r.released.Do(func() { close(r.stall) }) }

// fakeServer is the fake PostgreSQL server.
type fakeServer struct {
	mu      sync.Mutex
	started int64 // server start, µs since the epoch
	version string
	standby bool
	sliceMS int64 // half the deadlock_timeout, in ms (WaitSliceSQL)
	pid     int64 // the last backend pid given
	tickets int32 // the last ticket id given
	// ticketClock, when set, gives tickets as the server does: the first
	// free id of 64 from its reading (a place's floor, when later); unset,
	// each ticket is the next of tickets.
	ticketClock func() int32
	txid        int64
	backends    map[int64]*fbackend
	locks       map[ftag]*flock
	changed     chan struct{} // closed and made anew when a lock is freed or a backend ends
	// oneBackend, when set, is the backend of every new connection (a
	// transaction pooler that gives every client the same server session).
	oneBackend *fbackend
	// cancelCloses makes a statement cancelled by its context break its
	// connection (pgx's way), instead of leaving it usable.
	cancelCloses bool
	rules        []*fakeRule
	log          []*fakeStmt
	logged       chan struct{} // closed and made anew on each statement
	conns        int
	unknown      []string // statements it did not recognise
	// connectGate, when set, holds every new connection after the first
	// connectFree ones until it is closed (a server slow to accept).
	connectGate chan struct{}
	connectFree int
}

// newFakeServer returns a fake PostgreSQL 16 primary whose wait slices
// last sliceMS.
func newFakeServer() *fakeServer {
	return &fakeServer{
		started:  1_700_000_000_000_000,
		version:  "PostgreSQL 16.4 (fake) on x86_64-pc-linux-gnu",
		sliceMS:  20,
		pid:      1000,
		backends: map[int64]*fbackend{},
		locks:    map[ftag]*flock{},
		changed:  make(chan struct{}),
		logged:   make(chan struct{}),
	}
}

// on adds rule r, and returns it.
func (fs *fakeServer) on(r *fakeRule) *fakeRule {
	if (r.stall != nil || r.late) && r.entered == nil {
		r.entered = make(chan *fakeStmt, 64)
	}
	fs.mu.Lock()
	fs.rules = append(fs.rules, r)
	fs.mu.Unlock()
	return r
}

// stallNext stalls the next statement of kind until the rule is released.
func (fs *fakeServer) stallNext(kind fkind) *fakeRule {
	return fs.on(&fakeRule{kind: kind, times: 1, stall: make(chan struct{})})
}

// failNext makes the next n statements of kind fail with the server error
// code, before they run.
func (fs *fakeServer) failNext(kind fkind, n int, code string) *fakeRule {
	return fs.on(&fakeRule{kind: kind, times: n, err: sqlState(code)})
}

// newBackendLocked starts a backend. The caller holds mu.
func (fs *fakeServer) newBackendLocked() *fbackend {
	fs.pid++
	b := &fbackend{pid: fs.pid, start: fs.started + 1000*fs.pid}
	fs.backends[b.pid] = b
	return b
}

// external starts a backend of another client (no connection of the
// Pool's), for the test to take locks with.
func (fs *fakeServer) external() int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.newBackendLocked().pid
}

// lockAs takes k (exclusive unless shared) for backend pid, at once; false
// when another backend holds it in a conflicting mode.
func (fs *fakeServer) lockAs(pid int64, k Key, shared bool) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.tryLocked(pid, keyTag(k), shared)
}

// unlockAs releases k for backend pid.
func (fs *fakeServer) unlockAs(pid int64, k Key, shared bool) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.unlockLocked(pid, keyTag(k), shared)
}

// steal frees k from every holder, behind their backs (as a
// pg_advisory_unlock_all of the holder's would).
func (fs *fakeServer) steal(k Key) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	delete(fs.locks, keyTag(k))
	fs.broadcastLocked()
}

// terminate ends backend pid (pg_terminate_backend): its locks go.
func (fs *fakeServer) terminate(pid int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if b := fs.backends[pid]; b != nil {
		fs.endBackendLocked(b)
	}
}

// holders returns the backends that hold k, and whether in shared mode.
func (fs *fakeServer) holders(k Key) (excl, shared []int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	l := fs.locks[keyTag(k)]
	if l == nil {
		return nil, nil
	}
	for pid := range l.excl {
		excl = append(excl, pid)
	}
	for pid := range l.shared {
		shared = append(shared, pid)
	}
	slices.Sort(excl)
	slices.Sort(shared)
	return excl, shared
}

// holder returns the backend that holds k exclusively, 0 when none does.
func (fs *fakeServer) holder(k Key) int64 {
	excl, _ := fs.holders(k)
	if len(excl) != 1 {
		return 0
	}
	return excl[0]
}

// heldBy returns every lock backend pid holds, as keys (tickets and
// doorbells too), sorted.
func (fs *fakeServer) heldBy(pid int64) []ftag {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var tags []ftag
	for t, l := range fs.locks {
		if l.excl[pid] > 0 || l.shared[pid] > 0 {
			tags = append(tags, t)
		}
	}
	slices.SortFunc(tags, func(a, b ftag) int {
		if a.c != b.c {
			return int(int64(a.c) - int64(b.c))
		}
		return int(int64(a.o) - int64(b.o))
	})
	return tags
}

// lockCount returns how many locks are held on the server, by anyone.
func (fs *fakeServer) lockCount() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.locks)
}

// waitingOn returns the lock backend pid waits for.
func (fs *fakeServer) waitingOn(pid int64) (ftag, bool) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if b := fs.backends[pid]; b != nil && b.waitingOn != nil {
		return *b.waitingOn, true
	}
	return ftag{}, false
}

// alive reports whether backend pid lives.
func (fs *fakeServer) alive(pid int64) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	b := fs.backends[pid]
	return b != nil && !b.dead
}

// markOf returns backend pid's owner mark.
func (fs *fakeServer) markOf(pid int64) string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if b := fs.backends[pid]; b != nil {
		return b.mark
	}
	return ""
}

// liveMarked returns the live backends that carry an owner mark: a
// session given back to the pool must carry none.
func (fs *fakeServer) liveMarked() []int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var pids []int64
	for _, b := range fs.backends {
		if !b.dead && b.mark != "" {
			pids = append(pids, b.pid)
		}
	}
	return pids
}

// stmts returns the statements received so far.
func (fs *fakeServer) stmts() []*fakeStmt {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return slices.Clone(fs.log)
}

// count returns how many statements of kind the server received.
func (fs *fakeServer) count(kind fkind) int {
	n := 0
	for _, st := range fs.stmts() {
		if st.kind == kind {
			n++
		}
	}
	return n
}

// counts returns how many statements of each kind the server received.
func (fs *fakeServer) counts() map[fkind]int {
	m := map[fkind]int{}
	for _, st := range fs.stmts() {
		m[st.kind]++
	}
	return m
}

// since returns the statements received after the first n.
func (fs *fakeServer) since(n int) []*fakeStmt {
	all := fs.stmts()
	if n > len(all) {
		return nil
	}
	return all[n:]
}

// kinds returns the kinds of sts, in order.
func kinds(sts []*fakeStmt) []fkind {
	out := make([]fkind, len(sts))
	for i, st := range sts {
		out[i] = st.kind
	}
	return out
}

// countIn returns how many of sts are of kind.
func countIn(sts []*fakeStmt, kind fkind) int {
	n := 0
	for _, st := range sts {
		if st.kind == kind {
			n++
		}
	}
	return n
}

// await waits until cond holds (checked as each statement arrives, as
// locks change, and every few milliseconds), or fails the test after a
// bound generous enough for a loaded machine.
func (fs *fakeServer) await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(fakeBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		fs.mu.Lock()
		logged, changed := fs.logged, fs.changed
		fs.mu.Unlock()
		select {
		case <-logged:
		case <-changed:
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// awaitCount waits until the server received at least n statements of
// kind.
func (fs *fakeServer) awaitCount(t testing.TB, kind fkind, n int) {
	t.Helper()
	fs.await(t, fmt.Sprintf("%d statements of kind %q", n, kind), func() bool { return fs.count(kind) >= n })
}

// checkKnown fails the test if a statement was not recognised.
func (fs *fakeServer) checkKnown(t testing.TB) {
	t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, q := range fs.unknown {
		t.Errorf("the fake server did not recognise a statement: %.300s", q)
	}
}

// broadcastLocked wakes every wait. The caller holds mu.
func (fs *fakeServer) broadcastLocked() {
	close(fs.changed)
	fs.changed = make(chan struct{})
}

// conflictsLocked reports whether another backend than pid holds t in a
// mode that conflicts with shared (or exclusive). The caller holds mu.
func (fs *fakeServer) conflictsLocked(pid int64, t ftag, shared bool) bool {
	l := fs.locks[t]
	if l == nil {
		return false
	}
	for p, n := range l.excl {
		if p != pid && n > 0 {
			return true
		}
	}
	if !shared {
		for p, n := range l.shared {
			if p != pid && n > 0 {
				return true
			}
		}
	}
	return false
}

// tryLocked is pg_try_advisory_lock[_shared] of t for pid. The caller
// holds mu.
func (fs *fakeServer) tryLocked(pid int64, t ftag, shared bool) bool {
	if b := fs.backends[pid]; b == nil || b.dead || fs.conflictsLocked(pid, t, shared) {
		return false
	}
	l := fs.locks[t]
	if l == nil {
		l = &flock{excl: map[int64]int{}, shared: map[int64]int{}}
		fs.locks[t] = l
	}
	if shared {
		l.shared[pid]++
	} else {
		l.excl[pid]++
	}
	return true
}

// unlockLocked is pg_advisory_unlock[_shared] of t for pid. The caller
// holds mu.
func (fs *fakeServer) unlockLocked(pid int64, t ftag, shared bool) bool {
	l := fs.locks[t]
	if l == nil {
		return false
	}
	m := l.excl
	if shared {
		m = l.shared
	}
	if m[pid] == 0 {
		return false
	}
	m[pid]--
	if m[pid] == 0 {
		delete(m, pid)
	}
	if len(l.excl) == 0 && len(l.shared) == 0 {
		delete(fs.locks, t)
	}
	fs.broadcastLocked()
	return true
}

// holdsLocked reports whether pid holds t in mode shared (exclusive when
// false). The caller holds mu.
func (fs *fakeServer) holdsLocked(pid int64, t ftag, shared bool) bool {
	l := fs.locks[t]
	if l == nil {
		return false
	}
	if shared {
		return l.shared[pid] > 0
	}
	return l.excl[pid] > 0
}

// endBackendLocked ends b: its locks go, its waits end. The caller holds
// mu.
func (fs *fakeServer) endBackendLocked(b *fbackend) {
	if b.dead {
		return
	}
	b.dead = true
	for t, l := range fs.locks {
		delete(l.excl, b.pid)
		delete(l.shared, b.pid)
		if len(l.excl) == 0 && len(l.shared) == 0 {
			delete(fs.locks, t)
		}
	}
	fs.broadcastLocked()
}

// lockWait takes t for b, waiting while others hold it: for at most
// timeout (0: no limit; then 55P03), until the statement is cancelled
// (57014), b is terminated (57P01), or ctx ends.
func (fs *fakeServer) lockWait(ctx context.Context, b *fbackend, t ftag, shared bool, timeout time.Duration) error {
	var expired <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		expired = tm.C
	}
	defer func() {
		fs.mu.Lock()
		b.waitingOn = nil
		fs.mu.Unlock()
	}()
	for {
		fs.mu.Lock()
		if b.dead {
			fs.mu.Unlock()
			return sqlState("57P01")
		}
		if fs.tryLocked(b.pid, t, shared) {
			fs.mu.Unlock()
			return nil
		}
		if b.cancelled {
			fs.mu.Unlock()
			return sqlState("57014")
		}
		changed, cancel := fs.changed, b.cancel
		b.waitingOn = &t
		fs.mu.Unlock()
		select {
		case <-changed:
		case <-expired:
			return sqlState("55P03")
		case <-cancel:
			return sqlState("57014")
		case <-ctx.Done():
			return fmt.Errorf("fake: statement cancelled: %w", ctx.Err())
		}
	}
}

// fakeConnector makes the fake server's client connections.
type fakeConnector struct{ fs *fakeServer }

func (c fakeConnector) Connect(ctx context.Context) (driver.Conn, error) {
	fs := c.fs
	fs.mu.Lock()
	if gate := fs.connectGate; gate != nil && fs.conns >= fs.connectFree {
		fs.mu.Unlock()
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		fs.mu.Lock()
	}
	defer fs.mu.Unlock()
	b := fs.oneBackend
	if b == nil || b.dead {
		b = fs.newBackendLocked()
	}
	b.conns++
	fs.conns++
	return &fakeConn{fs: fs, b: b, id: fs.conns}, nil
}

func (c fakeConnector) Driver() driver.Driver { return fakeDriver{} }

type fakeDriver struct{}

func (fakeDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("fake: open with a connector")
}

// db returns a pool of the server's connections.
func (fs *fakeServer) db(t testing.TB) *sql.DB {
	db := sql.OpenDB(fakeConnector{fs})
	db.SetMaxIdleConns(64)
	t.Cleanup(func() { db.Close() })
	return db
}

// fakeConn is a client connection of the fake server, on backend b.
type fakeConn struct {
	fs     *fakeServer
	id     int
	b      *fbackend // guarded by fs.mu
	broken bool      // guarded by fs.mu
	closed bool      // guarded by fs.mu
}

func (c *fakeConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("fake: prepared statements are not supported")
}

func (c *fakeConn) Begin() (driver.Tx, error) { return nil, errors.New("fake: no transactions") }

// Close ends the connection, and its backend with it (unless a pooler's
// other clients share it).
func (c *fakeConn) Close() error {
	fs := c.fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.b.conns--
	if c.b != fs.oneBackend || c.b.conns == 0 {
		fs.endBackendLocked(c.b)
	}
	return nil
}

// IsValid implements driver.Validator: a broken connection is not given
// back to the pool.
func (c *fakeConn) IsValid() bool {
	c.fs.mu.Lock()
	defer c.fs.mu.Unlock()
	return !c.broken && !c.b.dead
}

// ResetSession implements driver.SessionResetter.
func (c *fakeConn) ResetSession(context.Context) error {
	if !c.IsValid() {
		return driver.ErrBadConn
	}
	return nil
}

// breakLocked breaks c: its backend ends (the server sees its client go).
// The caller holds mu.
func (c *fakeConn) breakLocked() {
	c.broken = true
	if c.b != c.fs.oneBackend {
		c.fs.endBackendLocked(c.b)
	}
}

// QueryContext runs q (the core's fast path, and database/sql's).
func (c *fakeConn) QueryContext(ctx context.Context, q string, nv []driver.NamedValue) (driver.Rows, error) {
	args := make([]any, len(nv))
	for i, v := range nv {
		args[i] = v.Value
	}
	return c.fs.exec(ctx, c, q, args)
}

// exec runs one statement on c, as the rules say.
func (fs *fakeServer) exec(ctx context.Context, c *fakeConn, q string, args []any) (driver.Rows, error) {
	kind := classify(q)
	fs.mu.Lock()
	if c.broken || c.closed {
		fs.mu.Unlock()
		return nil, driver.ErrBadConn
	}
	if err := ctx.Err(); err != nil {
		fs.mu.Unlock()
		return nil, err // not sent
	}
	st := &fakeStmt{kind: kind, conn: c.id, q: q, args: args, pid: c.b.pid}
	if kind == fBatchTry || kind == fBatchUnlock || kind == fBatchMixed {
		if len(args) > 0 {
			if s, ok := args[0].(string); ok {
				st.keys = len(intArray(s))
			}
		}
	}
	var r *fakeRule
	for _, x := range fs.rules {
		if x.kind == kind && (x.times == 0 || int(x.used.Load()) < x.times) && (x.when == nil || x.when(st)) {
			r = x
			x.used.Add(1)
			break
		}
	}
	if r != nil && r.moveTo {
		c.b.conns--
		c.b = fs.newBackendLocked()
		c.b.conns++
	}
	b := c.b
	st.pid = b.pid
	st.n = len(fs.log) + 1
	fs.log = append(fs.log, st)
	close(fs.logged)
	fs.logged = make(chan struct{})
	if kind == fUnknown {
		fs.unknown = append(fs.unknown, q)
	}
	if b.dead {
		c.broken = true
		fs.mu.Unlock()
		return nil, sqlState("57P01")
	}
	b.running, b.cancel, b.cancelled = kind, make(chan struct{}), false
	fs.mu.Unlock()
	defer func() {
		fs.mu.Lock()
		b.running, b.cancel, b.cancelled = "", nil, false
		b.lastWait = kind == fWait || kind == fSlice || kind == fSlotSlice || kind == fRegister
		fs.mu.Unlock()
	}()
	if r != nil && r.entered != nil {
		r.entered <- st
	}
	if r != nil && r.stall != nil {
		if r.ignoreCtx {
			<-r.stall
		} else {
			select {
			case <-r.stall:
			case <-ctx.Done():
				return nil, fs.cancelled(c, ctx)
			}
		}
	}
	if r != nil && !r.afterRun && (r.err != nil || r.drop) {
		return nil, fs.fail(c, r)
	}
	rctx := ctx
	if r != nil && r.ignoreCtx {
		rctx = context.WithoutCancel(ctx)
	}
	rows, err := fs.run(rctx, c, b, st)
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return nil, fs.cancelled(c, ctx)
	}
	if r != nil && r.late {
		<-ctx.Done()
	}
	if r != nil && r.afterRun && (r.err != nil || r.drop) {
		return nil, fs.fail(c, r)
	}
	if err != nil {
		if code := stmt.SQLState(err); code == "57P01" {
			fs.mu.Lock()
			c.broken = true
			fs.mu.Unlock()
		}
		return nil, err
	}
	return rows, nil
}

// fail is the error of a statement a rule fails.
func (fs *fakeServer) fail(c *fakeConn, r *fakeRule) error {
	if r.drop {
		fs.mu.Lock()
		c.breakLocked()
		fs.mu.Unlock()
		if r.err != nil {
			return r.err
		}
		return errFakeConnLost
	}
	return r.err
}

// cancelled is the error of a statement whose context ended while it ran:
// the statement is cancelled on the server, and, with cancelCloses, the
// connection breaks.
func (fs *fakeServer) cancelled(c *fakeConn, ctx context.Context) error {
	fs.mu.Lock()
	if fs.cancelCloses {
		c.breakLocked()
	}
	fs.mu.Unlock()
	return fmt.Errorf("fake: statement cancelled: %w", ctx.Err())
}

// The statements' texts that do not depend on arguments.
var fixedStmts = map[string]fkind{
	sqltext.VersionSQL:             fVersion,
	sqltext.PlainVersionSQL:        fPlainVersion,
	sqltext.BackendSQL:             fBackend,
	sqltext.WaitSliceSQL:           fWaitSlice,
	sqltext.TouchSQL:               fTouch,
	sqltext.KeepAliveSQL:           fKeepAlive,
	sqltext.OwnSQL:                 fOwn,
	sqltext.NoIdleTimeoutSQL:       fNoIdle,
	sqltext.TokenSQL:               fToken,
	sqltext.HeldSQL:                fHeld,
	sqltext.CancelWaitSQL:          fCancelWait,
	sqltext.TerminateHolderSQL:     fTerminate,
	sqltext.StrandedSQL(true):      fStranded,
	sqltext.StrandedSQL(false):     fStranded,
	sqltext.BeginPinnedSQL:         fBegin,
	sqltext.CommitPinnedSQL:        fCommit,
	sqltext.SavepointSQL:           fBegin,
	sqltext.ReleaseSavepointSQL:    fCommit,
	sqltext.RollbackToSavepointSQL: fCommit,
}

// classify returns what q does, from its marker and its text.
func classify(q string) fkind {
	if k, ok := fixedStmts[q]; ok {
		return k
	}
	body := sqltext.Unmarked(q)
	label, _ := sqltext.Label(q)
	batch := strings.HasPrefix(body, "SELECT ARRAY(SELECT u.i FROM unnest(")
	switch label {
	case "sqllock: try":
		switch {
		case batch:
			return fBatchTry
		case strings.Contains(body, " AS slot OFFSET 0) AS l"):
			return fSlotTry
		case strings.Contains(body, "THEN pg_advisory_unlock($1::int4, 0) ELSE NOT EXISTS"):
			return fPolite
		case strings.Contains(body, "pg_try_advisory_lock"):
			return fTry
		}
	case "sqllock: unlock":
		switch {
		case batch:
			return fBatchUnlock
		case strings.Contains(body, "pg_advisory_unlock") && strings.Contains(body, "WHERE pg_backend_pid() = $"):
			return fUnlock
		}
	case "sqllock: batch":
		if batch {
			return fBatchMixed
		}
	case "sqllock: wait":
		switch {
		case strings.Contains(body, " AS isslot,"):
			return fSlotSlice
		case strings.Contains(body, "x.others"):
			return fSlice
		case strings.Contains(body, "pg_catalog.pg_locks l"):
			return fGranted
		case strings.Contains(body, "set_config('lock_timeout', $") && strings.Contains(body, "LATERAL (SELECT pg_advisory_lock"):
			return fWait
		}
	case "sqllock: line":
		switch {
		case strings.Contains(body, "generate_series(0, 63)") && strings.Contains(body, " AS bell WHERE pg_backend_pid() = $2::int4"):
			return fPlace
		case strings.Contains(body, "generate_series(0, 63)"):
			return fRegister
		case strings.Contains(body, "::int4)::int8 WHERE pg_backend_pid() = $3::int4"):
			return fPlaceBack
		case strings.Contains(body, "coalesce(x.have, -1)"):
			return fSlotGiveUp
		case strings.Contains(body, "x.released"):
			return fGiveUp
		case strings.Contains(body, "AS u(c, t) WHERE pg_backend_pid() = $2::int4"):
			return fDoorbell
		}
	case "sqllock: keep-alive":
		if body == "SELECT 1::int8 WHERE pg_backend_pid() = $1::int4" {
			return fAlive
		}
	case "sqllock: session":
		switch {
		case strings.HasPrefix(body, "SELECT coalesce(CASE WHEN "):
			return fSession
		case strings.HasSuffix(body, " WHERE pg_backend_pid() = $1::int4"):
			return fReset
		}
	}
	return fUnknown
}

// run carries out st on backend b, over connection c, and returns its rows.
func (fs *fakeServer) run(ctx context.Context, c *fakeConn, b *fbackend, st *fakeStmt) (driver.Rows, error) {
	q, args := sqltext.Unmarked(st.q), st.args
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if b.dead {
		return nil, sqlState("57P01") // ended while the statement waited to run
	}
	standby := fs.standby
	switch st.kind {
	case fVersion:
		return rowsOf(row(fs.version, b.pid, fs.started, b.start)), nil
	case fPlainVersion:
		return rowsOf(row(fs.version)), nil
	case fBackend:
		return rowsOf(row(b.pid, b.start)), nil
	case fWaitSlice:
		return rowsOf(row(fs.sliceMS)), nil
	case fTouch, fNoIdle:
		return rowsOf(row(int64(1))), nil
	case fBegin, fCommit:
		return rowsOf(), nil

	case fTry:
		k, mark := keyOf(args[:len(args)-1]), argStr(args, len(args)-1)
		shared := strings.Contains(q, "pg_try_advisory_lock_shared(")
		plain := !strings.Contains(q, "pg_backend_pid()")
		if !gateOK(b, q, mark) {
			if plain {
				return rowsOf(row(nil)), nil
			}
			return rowsOf(row(nil, b.pid, standby)), nil
		}
		ok := fs.tryLocked(b.pid, keyTag(k), shared)
		if ok && !plain {
			b.mark = mark
		}
		if plain {
			return rowsOf(row(ok)), nil
		}
		return rowsOf(row(ok, b.pid, standby)), nil

	case fPolite:
		class, mark, k := int32(argInt(args, 0)), argStr(args, 1), keyOf(args[2:])
		shared := strings.Contains(q, "AND pg_try_advisory_lock_shared(")
		plain := !strings.Contains(q, "pg_backend_pid()")
		if !gateOK(b, q, mark) {
			if plain {
				return rowsOf(row(nil)), nil
			}
			return rowsOf(row(nil, b.pid, standby)), nil
		}
		ok := !fs.ringsLocked(b.pid, class) && fs.tryLocked(b.pid, keyTag(k), shared)
		if ok && !plain {
			b.mark = mark
		}
		if plain {
			return rowsOf(row(ok)), nil
		}
		return rowsOf(row(ok, b.pid, standby)), nil

	case fUnlock:
		k, pid := keyOf(args[:len(args)-1]), argInt(args, len(args)-1)
		if pid != b.pid {
			return rowsOf(), nil
		}
		shared := strings.Contains(q, "pg_advisory_unlock_shared(")
		ok := fs.unlockLocked(b.pid, keyTag(k), shared)
		if ok && strings.Contains(q, "THEN ") { // the form that sets the settings back
			b.mark = ""
		}
		return rowsOf(row(ok)), nil

	case fBatchTry, fBatchUnlock, fBatchMixed:
		return fs.batchLocked(b, st)

	case fSession:
		mark := argStr(args, 0)
		if !gateOK(b, q, mark) {
			return rowsOf(row(int64(0), standby, nil)), nil
		}
		b.mark = mark
		return rowsOf(row(b.pid, standby, "settings")), nil

	case fReset:
		if argInt(args, 0) != b.pid {
			return rowsOf(), nil
		}
		b.mark = ""
		return rowsOf(row("")), nil

	case fOwn:
		var rs [][]driver.Value
		for t, l := range fs.locks {
			if l.excl[b.pid] > 0 {
				rs = append(rs, row(b.pid, int64(t.c), int64(t.o), int64(t.sub), "ExclusiveLock", true))
			}
			if l.shared[b.pid] > 0 {
				rs = append(rs, row(b.pid, int64(t.c), int64(t.o), int64(t.sub), "ShareLock", true))
			}
		}
		if len(rs) == 0 {
			rs = append(rs, row(b.pid, nil, nil, nil, nil, nil))
		}
		return rowsOf(rs...), nil

	case fAlive:
		if argInt(args, 0) != b.pid {
			return rowsOf(), nil
		}
		return rowsOf(row(int64(1))), nil

	case fDoorbell:
		if argInt(args, 1) != b.pid {
			return rowsOf(), nil
		}
		var rs [][]driver.Value
		tickets := intArray(argStr(args, 2))
		for i, c := range intArray(argStr(args, 0)) {
			t := tickets[i]
			if t == 0 {
				rs = append(rs, row(c, t, fs.ringsLocked(b.pid, int32(c))))
			} else {
				rs = append(rs, row(c, t, fs.earlierLocked(int32(c), int32(t))))
			}
		}
		return rowsOf(rs...), nil

	case fPlace:
		class, shared := int32(argInt(args, 0)), strings.Contains(q, "pg_try_advisory_lock_shared($1::int4, c.i::int4)")
		if argInt(args, 1) != b.pid {
			return rowsOf(), nil
		}
		if !fs.tryLocked(b.pid, pairTag(class, 0), true) {
			return rowsOf(row(int64(0))), nil
		}
		id := fs.ticketLocked(b, class, shared, int32(argInt(args, 2)))
		if id == 0 {
			fs.unlockLocked(b.pid, pairTag(class, 0), true)
		}
		return rowsOf(row(int64(id))), nil

	case fPlaceBack:
		class, id := int32(argInt(args, 0)), int32(argInt(args, 1))
		if argInt(args, 2) != b.pid {
			return rowsOf(), nil
		}
		n := int64(stmt.B2i(fs.unlockLocked(b.pid, pairTag(class, id), strings.Contains(q, "pg_advisory_unlock_shared($1::int4, $2::int4)"))))
		n += int64(stmt.B2i(fs.unlockLocked(b.pid, pairTag(class, 0), true)))
		return rowsOf(row(n)), nil

	case fToken, fHeld:
		t := ftag{uint32(argInt(args, 0)), uint32(argInt(args, 1)), int(argInt(args, 2))}
		if !fs.holdsLocked(b.pid, t, false) && !fs.holdsLocked(b.pid, t, true) {
			return rowsOf(), nil
		}
		if st.kind == fHeld {
			return rowsOf(row(int64(1))), nil
		}
		fs.txid++
		return rowsOf(row(fs.txid)), nil

	case fKeepAlive:
		return fs.keepAliveLocked(args)

	case fCancelWait:
		o := fs.backends[argInt(args, 0)]
		switch {
		case o == nil || o.dead:
			return rowsOf(row(int64(0))), nil
		case o.running == fWait || o.running == fSlice || o.running == fSlotSlice || o.running == fRegister:
			if !o.cancelled {
				o.cancelled = true
				close(o.cancel)
			}
			return rowsOf(row(int64(2))), nil
		case o.running == "" && o.lastWait:
			return rowsOf(row(int64(3))), nil
		}
		return rowsOf(row(int64(1))), nil

	case fTerminate:
		o := fs.backends[argInt(args, 0)]
		t := ftag{uint32(argInt(args, 1)), uint32(argInt(args, 2)), int(argInt(args, 3))}
		if o == nil || o.dead || !fs.holdsLocked(o.pid, t, false) && !fs.holdsLocked(o.pid, t, true) {
			return rowsOf(row(false)), nil
		}
		fs.endBackendLocked(o)
		return rowsOf(row(true)), nil

	case fStranded:
		o := fs.backends[argInt(args, 0)]
		start := argInt(args, 1)
		if o == nil || o.dead || start != 0 && start != o.start {
			return rowsOf(row(int64(0))), nil
		}
		holds := false
		for t, l := range fs.locks {
			if l.excl[o.pid] > 0 || l.shared[o.pid] > 0 {
				if len(args) < 5 || t == (ftag{uint32(argInt(args, 2)), uint32(argInt(args, 3)), int(argInt(args, 4))}) {
					holds = true
				}
			}
		}
		switch {
		case !holds:
			return rowsOf(row(int64(0))), nil
		case o.running != "" && o != b:
			return rowsOf(row(int64(2))), nil
		}
		fs.endBackendLocked(o)
		if o == b {
			return nil, sqlState("57P01")
		}
		return rowsOf(row(int64(1))), nil

	case fRegister:
		return fs.registerLocked(ctx, b, st)
	case fSlice, fSlotSlice:
		return fs.sliceLocked(ctx, b, st)
	case fGiveUp, fSlotGiveUp:
		return fs.giveUpLocked(b, st)
	case fWait:
		return fs.waitLocked(ctx, b, st)
	case fGranted:
		t := ftag{uint32(argInt(args, 0)), uint32(argInt(args, 1)), int(argInt(args, 2))}
		shared := strings.Contains(q, "l.mode = 'ShareLock'")
		if !fs.holdsLocked(b.pid, t, shared) {
			return rowsOf(), nil
		}
		b.mark = argStr(args, 3)
		return rowsOf(row(true, b.pid, standby)), nil
	case fSlotTry:
		return fs.slotTryLocked(b, st)
	}
	return nil, fmt.Errorf("fake: unknown statement %.200q", st.q)
}

// unlocked runs f without mu, which the caller holds, and takes it again.
func (fs *fakeServer) unlocked(f func() error) error {
	fs.mu.Unlock()
	defer fs.mu.Lock()
	return f()
}

// batchLocked runs a batch statement (see sqltext.BatchText): its text
// must be BatchText's for its backend. The caller holds mu.
func (fs *fakeServer) batchLocked(b *fbackend, st *fakeStmt) (driver.Rows, error) {
	i := strings.LastIndex(st.q, "WHERE pg_backend_pid() = ")
	pidText := st.q[i+len("WHERE pg_backend_pid() = "):]
	pairs := strings.Contains(st.q, "::text::bool[]")
	kind := map[fkind]sqltext.Batch{fBatchTry: sqltext.BatchTry, fBatchUnlock: sqltext.BatchUnlock, fBatchMixed: sqltext.BatchMixed}[st.kind]
	if want := sqltext.BatchText(kind, pairs, pidText); st.q != want {
		return nil, fmt.Errorf("fake: batch statement %q is not BatchText's %q", st.q, want)
	}
	if pidText != strconv.FormatInt(b.pid, 10) {
		return rowsOf(), nil // another backend: it runs nothing
	}
	vals := intArray(argStr(st.args, 0))
	unlocks := 0
	next := 1
	if kind == sqltext.BatchUnlock {
		unlocks = len(vals)
	}
	if kind == sqltext.BatchMixed {
		unlocks = int(mustInt(argStr(st.args, 1)))
		next = 2
	}
	var isPair []bool
	if pairs {
		isPair = boolArray(argStr(st.args, next))
	}
	var missed []string
	for i, v := range vals {
		k := Key{V: v}
		if pairs && isPair[i] {
			k = Key{Pair: true, Class: int32(v >> 32), ID: int32(v)}
		}
		var ok bool
		if i < unlocks {
			ok = fs.unlockLocked(b.pid, keyTag(k), false)
		} else {
			ok = fs.tryLocked(b.pid, keyTag(k), false)
		}
		if !ok {
			missed = append(missed, strconv.Itoa(i+1))
		}
	}
	return rowsOf(row("{" + strings.Join(missed, ",") + "}")), nil
}

// keepAliveLocked answers sqltext.KeepAliveSQL. The caller holds mu.
func (fs *fakeServer) keepAliveLocked(args []any) (driver.Rows, error) {
	pids, classids, objids, subids := intArray(argStr(args, 0)), intArray(argStr(args, 1)), intArray(argStr(args, 2)), intArray(argStr(args, 3))
	shared, servers, starts := boolArray(argStr(args, 4)), intArray(argStr(args, 5)), intArray(argStr(args, 6))
	var rs [][]driver.Value
	for i, pid := range pids {
		o := fs.backends[pid]
		t := ftag{uint32(classids[i]), uint32(objids[i]), int(subids[i])}
		var why int64
		switch {
		case servers[i] != 0 && servers[i] != fs.started:
			why = 2
		case o == nil || o.dead:
			why = 4
		case starts[i] != 0 && starts[i] != o.start:
			why = 3
		case !fs.holdsLocked(pid, t, shared[i]):
			why = 1
		default:
			continue
		}
		rs = append(rs, row(int64(i+1), why))
	}
	return rowsOf(rs...), nil
}

// sliceDuration reads a lock_timeout ("20ms", "0": none).
func sliceDuration(s string) time.Duration {
	if s == "0" {
		return 0
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		panic("fake: lock_timeout " + strconv.Quote(s))
	}
	return d
}

// registerLocked answers RegisterSQL: it rings the line's doorbell and
// takes the next ticket. The caller holds mu.
func (fs *fakeServer) registerLocked(ctx context.Context, b *fbackend, st *fakeStmt) (driver.Rows, error) {
	class, slice, mark, ring := int32(argInt(st.args, 0)), argStr(st.args, 1), argStr(st.args, 2), argBool(st.args, 3)
	shared := strings.Contains(st.q, "pg_try_advisory_lock_shared($1::int4, c.i::int4)")
	if !gateOK(b, st.q, mark) {
		return rowsOf(row(int64(0), b.pid, fs.standby, false)), nil
	}
	b.mark = mark
	if !ring {
		return rowsOf(row(int64(0), b.pid, fs.standby, true)), nil
	}
	if err := fs.unlocked(func() error {
		return fs.lockWait(ctx, b, pairTag(class, 0), true, sliceDuration(slice))
	}); err != nil {
		return nil, err
	}
	return rowsOf(row(int64(fs.ticketLocked(b, class, shared, 0)), b.pid, fs.standby, true)), nil
}

// ticketLocked takes a ticket of class for b (a reader's when shared),
// from floor on when that is later than the ticket clock: its id, or 0
// when none was free. The caller holds mu.
func (fs *fakeServer) ticketLocked(b *fbackend, class int32, shared bool, floor int32) int32 {
	if fs.ticketClock == nil {
		fs.tickets++
		if !fs.tryLocked(b.pid, pairTag(class, fs.tickets), shared) {
			return 0
		}
		return fs.tickets
	}
	base := fs.ticketClock()
	if floor != 0 && floor-base > 0 {
		base = floor
	}
	for g := range int32(64) {
		if id := base + g; id != 0 && fs.tryLocked(b.pid, pairTag(class, id), shared) {
			return id
		}
	}
	return 0
}

// ticketsLocked returns the tickets of class held: by b (mine), and the
// latest earlier than ticket me held by another backend (exclusive ones
// only, for a reader), and how many others hold. The caller holds mu.
func (fs *fakeServer) ticketsLocked(b *fbackend, class, me int32, reader bool) (mine []ftag, pred int32, others int64) {
	// Only a registered waiter's ticket (its backend rings the doorbell)
	// is a predecessor, and only of a waiter that has a ticket.
	var reg map[int64]int
	if l := fs.locks[pairTag(class, 0)]; l != nil && me != 0 {
		reg = l.shared
	}
	for t, l := range fs.locks {
		if t.sub != 2 || t.c != uint32(class) || t.o == 0 {
			continue
		}
		id := int32(t.o)
		if l.excl[b.pid] > 0 || l.shared[b.pid] > 0 {
			mine = append(mine, t)
		}
		for pid, n := range l.excl {
			if pid != b.pid && n > 0 {
				others++
				if reg[pid] > 0 && id-me < 0 && (pred == 0 || id-pred > 0) { // (tickets wrap around)
					pred = id
				}
			}
		}
		for pid, n := range l.shared {
			if pid != b.pid && n > 0 {
				others++
				if reg[pid] > 0 && !reader && id-me < 0 && (pred == 0 || id-pred > 0) {
					pred = id
				}
			}
		}
	}
	return mine, pred, others
}

// releaseTicketLocked gives back b's ticket me of class (in mode shared)
// and its doorbell. The caller holds mu.
func (fs *fakeServer) releaseTicketLocked(b *fbackend, class, me int32, shared bool) {
	if me != 0 {
		fs.unlockLocked(b.pid, pairTag(class, me), shared)
	}
	fs.unlockLocked(b.pid, pairTag(class, 0), true)
}

// ringsLocked reports whether a backend other than pid rings the doorbell
// of the line of class (holds it shared, as a registered waiter does).
// The caller holds mu.
func (fs *fakeServer) ringsLocked(pid int64, class int32) bool {
	l := fs.locks[pairTag(class, 0)]
	if l == nil {
		return false
	}
	for p, n := range l.shared {
		if p != pid && n > 0 {
			return true
		}
	}
	return false
}

// earlierLocked reports whether a registered waiter (one whose backend
// rings the doorbell) holds a ticket of class earlier than t. The caller
// holds mu.
func (fs *fakeServer) earlierLocked(class, t int32) bool {
	bell := fs.locks[pairTag(class, 0)]
	if bell == nil {
		return false
	}
	for tag, l := range fs.locks {
		if tag.sub != 2 || tag.c != uint32(class) || tag.o == 0 || int32(tag.o)-t >= 0 {
			continue
		}
		for pid, n := range l.excl {
			if n > 0 && bell.shared[pid] > 0 {
				return true
			}
		}
		for pid, n := range l.shared {
			if n > 0 && bell.shared[pid] > 0 {
				return true
			}
		}
	}
	return false
}

// sliceLocked answers SliceSQL and SemaphoreSliceSQL: one slice of a
// wait in the line. The caller holds mu.
func (fs *fakeServer) sliceLocked(ctx context.Context, b *fbackend, st *fakeStmt) (driver.Rows, error) {
	a := st.args
	class, me, slice, mark := int32(argInt(a, 0)), int32(argInt(a, 1)), argStr(a, 2), argStr(a, 3)
	if !gateOK(b, st.q, mark) {
		return rowsOf(), nil
	}
	sem := st.kind == fSlotSlice
	var key ftag
	var shared bool
	var slots int32
	if sem {
		slots = int32(argInt(a, 4))
	} else {
		key = ftag{uint32(argInt(a, 4)), uint32(argInt(a, 5)), int(argInt(a, 6))}
		shared = strings.Contains(st.q, "THEN pg_advisory_lock_shared(")
	}
	mine, pred, others := fs.ticketsLocked(b, class, me, shared)
	for _, t := range mine { // tickets of its own left from before
		if int32(t.o) != me {
			fs.unlockLocked(b.pid, t, false)
			fs.unlockLocked(b.pid, t, true)
		}
	}
	timeout := sliceDuration(slice)
	if sem {
		n := int32(strings.Count(st.q, "WHEN pg_try_advisory_lock($5::int4, "))
		have := int64(-1)
		for i := range n {
			if fs.holdsLocked(b.pid, pairTag(slots, i), false) {
				have = int64(i)
				break
			}
		}
		switch {
		case have >= 0:
			fs.releaseTicketLocked(b, class, me, false)
			return rowsOf(row(have, b.pid, fs.standby, others, true)), nil
		case pred == 0:
			for i := range n {
				if fs.tryLocked(b.pid, pairTag(slots, i), false) {
					fs.releaseTicketLocked(b, class, me, false)
					return rowsOf(row(int64(i), b.pid, fs.standby, others, false)), nil
				}
			}
			wait := int32(argInt(a, 5))
			if err := fs.unlocked(func() error { return fs.lockWait(ctx, b, pairTag(slots, wait), false, timeout) }); err != nil {
				return nil, err
			}
			fs.releaseTicketLocked(b, class, me, false)
			return rowsOf(row(int64(wait), b.pid, fs.standby, others, false)), nil
		}
	} else {
		switch {
		case fs.holdsLocked(b.pid, key, shared):
			fs.releaseTicketLocked(b, class, me, shared)
			return rowsOf(row(int64(0), b.pid, fs.standby, others, true)), nil
		case pred == 0:
			if err := fs.unlocked(func() error { return fs.lockWait(ctx, b, key, shared, timeout) }); err != nil {
				return nil, err
			}
			fs.releaseTicketLocked(b, class, me, shared)
			return rowsOf(row(int64(0), b.pid, fs.standby, others, false)), nil
		}
	}
	// Wait for the predecessor's ticket to go, then look again.
	t := pairTag(class, pred)
	if err := fs.unlocked(func() error { return fs.lockWait(ctx, b, t, shared, timeout) }); err != nil {
		return nil, err
	}
	fs.unlockLocked(b.pid, t, shared)
	return rowsOf(row(int64(-1), b.pid, fs.standby, others, false)), nil
}

// giveUpLocked answers LeaveLineSQL and SemaphoreLeaveLineSQL. The caller holds
// mu.
func (fs *fakeServer) giveUpLocked(b *fbackend, st *fakeStmt) (driver.Rows, error) {
	a := st.args
	class := int32(argInt(a, 0))
	have := int64(-1)
	var mark string
	if st.kind == fSlotGiveUp {
		slots := int32(argInt(a, 1))
		mark = argStr(a, 2)
		for t, l := range fs.locks {
			if t.sub == 2 && t.c == uint32(slots) && l.excl[b.pid] > 0 && (have < 0 || int64(int32(t.o)) < have) {
				have = int64(int32(t.o))
			}
		}
	} else {
		key := ftag{uint32(argInt(a, 1)), uint32(argInt(a, 2)), int(argInt(a, 3))}
		mark = argStr(a, 4)
		if fs.holdsLocked(b.pid, key, strings.Contains(st.q, "l.mode = 'ShareLock'), false) AS have")) {
			have = 0
		}
	}
	var released int64
	for t, l := range fs.locks {
		if t.sub != 2 || t.c != uint32(class) {
			continue
		}
		if l.excl[b.pid] > 0 {
			fs.unlockLocked(b.pid, t, false)
			released++
		}
		if l.shared[b.pid] > 0 {
			fs.unlockLocked(b.pid, t, true)
			released++
		}
	}
	if have >= 0 {
		b.mark = mark
	} else {
		b.mark = ""
	}
	return rowsOf(row(have, b.pid, released, "settings")), nil
}

// waitLocked answers WaitSQL: a wait in one statement. The caller holds
// mu.
func (fs *fakeServer) waitLocked(ctx context.Context, b *fbackend, st *fakeStmt) (driver.Rows, error) {
	a := st.args
	mark, slice := argStr(a, len(a)-1), argStr(a, len(a)-2)
	k := keyOf(a[:len(a)-2])
	if !gateOK(b, st.q, mark) {
		return rowsOf(), nil
	}
	shared := strings.Contains(st.q, "LATERAL (SELECT pg_advisory_lock_shared(")
	if err := fs.unlocked(func() error { return fs.lockWait(ctx, b, keyTag(k), shared, sliceDuration(slice)) }); err != nil {
		return nil, err
	}
	b.mark = mark
	return rowsOf(row(true, b.pid, fs.standby)), nil
}

var slotTryRE = regexp.MustCompile(`WHEN pg_try_advisory_lock\((-?\d+), (\d+)\) THEN`)

// slotTryLocked answers SemaphoreTrySQL (and its polite form). The caller
// holds mu.
func (fs *fakeServer) slotTryLocked(b *fbackend, st *fakeStmt) (driver.Rows, error) {
	mark := argStr(st.args, 0)
	if !gateOK(b, st.q, mark) {
		return rowsOf(row(int64(-2), b.pid, fs.standby, nil)), nil
	}
	slot := int64(-1)
	ms := slotTryRE.FindAllStringSubmatch(st.q, -1)
	for i, m := range ms {
		class, id := int32(mustInt(m[1])), int32(mustInt(m[2]))
		if i == 0 && id == 0 && strings.Contains(st.q, "WHEN NOT (CASE WHEN pg_try_advisory_lock("+m[1]+", 0) THEN") {
			// The polite form's doorbell, not a slot.
			if fs.ringsLocked(b.pid, class) {
				break
			}
			continue
		}
		if fs.tryLocked(b.pid, pairTag(class, id), false) {
			slot = int64(id)
			break
		}
	}
	if slot < 0 {
		return rowsOf(row(slot, b.pid, fs.standby, nil)), nil
	}
	b.mark = mark
	return rowsOf(row(slot, b.pid, fs.standby, "settings")), nil
}

// gateOK evaluates a statement's condition on the session's owner mark:
// a session set up already (Plain's statements) must carry mark; one not
// yet set up may carry none.
func gateOK(b *fbackend, q, mark string) bool {
	if strings.Contains(q, "IN ('', o.m)") {
		return b.mark == "" || b.mark == mark
	}
	return b.mark == mark
}

// keyOf reads a key from its bound values: one for the bigint form, two
// for the pair form.
func keyOf(vals []any) Key {
	switch len(vals) {
	case 1:
		return Key{V: vals[0].(int64)}
	case 2:
		return Key{Pair: true, Class: int32(vals[0].(int64)), ID: int32(vals[1].(int64))}
	}
	panic(fmt.Sprintf("fake: %d key values", len(vals)))
}

func argInt(args []any, i int) int64 {
	switch v := args[i].(type) {
	case int64:
		return v
	case string:
		return mustInt(v)
	}
	panic(fmt.Sprintf("fake: argument %d is %T", i+1, args[i]))
}

func argBool(args []any, i int) bool {
	switch v := args[i].(type) {
	case bool:
		return v
	case string:
		return v == "true"
	}
	panic(fmt.Sprintf("fake: argument %d is %T, want a boolean", i+1, args[i]))
}

func argStr(args []any, i int) string {
	s, ok := args[i].(string)
	if !ok {
		panic(fmt.Sprintf("fake: argument %d is %T, want text", i+1, args[i]))
	}
	return s
}

func mustInt(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		panic("fake: " + err.Error())
	}
	return n
}

// intArray reads an array literal of integers ("{1,2}").
func intArray(s string) []int64 {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if s == "" {
		return nil
	}
	var out []int64
	for _, f := range strings.Split(s, ",") {
		out = append(out, mustInt(f))
	}
	return out
}

// boolArray reads an array literal of booleans ("{t,false}").
func boolArray(s string) []bool {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "{"), "}")
	if s == "" {
		return nil
	}
	var out []bool
	for _, f := range strings.Split(s, ",") {
		out = append(out, f == "t" || f == "true")
	}
	return out
}

func row(vals ...any) []driver.Value {
	out := make([]driver.Value, len(vals))
	for i, v := range vals {
		if n, ok := v.(int); ok {
			v = int64(n)
		}
		out[i] = v
	}
	return out
}

// fakeRows are a statement's answer, made before it returns.
type fakeRows struct {
	rows [][]driver.Value
	i    int
}

func rowsOf(rs ...[]driver.Value) driver.Rows { return &fakeRows{rows: rs} }

func (r *fakeRows) Columns() []string {
	n := 1
	if len(r.rows) > 0 {
		n = len(r.rows[0])
	}
	cols := make([]string, n)
	for i := range cols {
		cols[i] = "c" + strconv.Itoa(i+1)
	}
	return cols
}

func (r *fakeRows) Close() error { return nil }

func (r *fakeRows) Next(dest []driver.Value) error {
	if r.i >= len(r.rows) {
		return io.EOF
	}
	copy(dest, r.rows[r.i])
	r.i++
	return nil
}
