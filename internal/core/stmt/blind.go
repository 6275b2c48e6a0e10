package stmt

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqllock/sqllock/internal/core/seams"
)

// Bounding statements on a blind driver: one that does not give up a read
// when its context ends (lib/pq), so that a call still returns by its
// context's end when the server stopped answering.

// AbandonGrace is how long past its context's end a statement on a blind
// driver gets before it is abandoned.
const AbandonGrace = 250 * time.Millisecond

// AbandonSet holds the connections whose statements were abandoned (see
// BoundedRaw) until they are closed; a Locker of a blind driver has one.
// Each is counted in Budget until then: a statement left to finish
// alone holds a connection of the pool.
type AbandonSet struct {
	conns  sync.Map // *sql.Conn → struct{}
	Budget *Budget
}

// Has reports whether conn was abandoned and is not closed yet: it must
// not be touched (a discard would wait for its statement).
func (a *AbandonSet) Has(conn *sql.Conn) bool {
	if a == nil {
		return false
	}
	_, ok := a.conns.Load(conn)
	return ok
}

// BoundedRaw is OnDriverConn, except that for a blind driver (blind is
// non-nil: one that does not give up a read when ctx ends) it returns,
// shortly after ctx ends, whether f has returned or not. Then it returns
// an error wrapping ErrAbandoned and ctx's error, records conn in blind,
// and f's connection is discarded once f returns, whatever f answered.
func BoundedRaw(ctx context.Context, blind *AbandonSet, conn *sql.Conn, f func(dc any) error) error {
	if blind == nil || ctx.Done() == nil {
		return OnDriverConn(conn, f)
	}
	w := takeBlindWorker()
	w.mu.Lock()
	w.ctx, w.blind, w.conn, w.f, w.gone = ctx, blind, conn, f, false
	w.mu.Unlock()
	w.start <- struct{}{}
	select {
	case err := <-w.res:
		idleBlindWorkers.put(w)
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(AbandonGrace)
	defer t.Stop()
	select {
	case err := <-w.res:
		idleBlindWorkers.put(w)
		return err
	case <-t.C:
	}
	w.mu.Lock()
	select {
	case err := <-w.res: // came as the grace ended
		w.mu.Unlock()
		idleBlindWorkers.put(w)
		return err
	default:
		// The worker discards conn once f returns, and goes back to
		// the idle ones then.
		w.gone = true
		blind.conns.Store(conn, struct{}{})
		blind.Budget.Add()
		w.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrAbandoned, ctx.Err())
	}
}

// A blindWorker runs blind drivers' statements (BoundedRaw), one at a
// time, so that the caller can leave one that does not return: a
// goroutine that lives between statements (for blindIdle), whose stack
// has grown through the driver's calls once, where a goroutine per
// statement grew it every time.
type blindWorker struct {
	start chan struct{} // a statement is set
	res   chan error    // its result, for a caller that did not leave (buffered)

	mu    sync.Mutex // guards the statement's fields below
	ctx   context.Context
	blind *AbandonSet
	conn  *sql.Conn
	f     func(dc any) error
	gone  bool               // the caller left
	runFn func(dc any) error // run, bound once
	idle  *time.Timer        // ends the worker when it idles blindIdle
}

// blindIdle is how long a blind worker waits for its next statement.
const blindIdle = 100 * time.Millisecond

// blindWorkers are the idle blind workers, the one most recently idle on
// top.
type blindWorkers struct {
	mu sync.Mutex
	ws []*blindWorker
}

var idleBlindWorkers blindWorkers

// takeBlindWorker returns an idle worker, or a new one.
func takeBlindWorker() *blindWorker {
	b := &idleBlindWorkers
	b.mu.Lock()
	if n := len(b.ws); n > 0 {
		w := b.ws[n-1]
		b.ws[n-1] = nil
		b.ws = b.ws[:n-1]
		b.mu.Unlock()
		return w
	}
	b.mu.Unlock()
	w := &blindWorker{start: make(chan struct{}, 1), res: make(chan error, 1)}
	w.runFn = w.run
	go w.loop()
	return w
}

// put makes w idle, its statement's fields cleared.
func (b *blindWorkers) put(w *blindWorker) {
	w.mu.Lock()
	w.ctx, w.blind, w.conn, w.f = nil, nil, nil, nil
	w.mu.Unlock()
	b.mu.Lock()
	b.ws = append(b.ws, w)
	b.mu.Unlock()
}

// leave takes w out of the idle ones; false when a caller took it first
// (its statement is on its way).
func (b *blindWorkers) leave(w *blindWorker) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, x := range b.ws {
		if x == w {
			b.ws = append(b.ws[:i], b.ws[i+1:]...)
			return true
		}
	}
	return false
}

func (w *blindWorker) loop() {
	w.idle = time.NewTimer(blindIdle)
	for {
		select {
		case <-w.start:
			w.idle.Stop()
			w.serve()
			w.idle.Reset(blindIdle)
		case <-w.idle.C:
			if idleBlindWorkers.leave(w) {
				return
			}
			w.idle.Reset(blindIdle) // taken: its statement comes
		}
	}
}

// left reports whether the statement's caller left.
func (w *blindWorker) left() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gone
}

func (w *blindWorker) run(dc any) error {
	err := w.f(dc)
	if w.left() {
		return driver.ErrBadConn // database/sql closes the connection
	}
	return err
}

// serve runs the statement set, and hands its result to the caller, or,
// when the caller left, discards its connection and goes idle.
func (w *blindWorker) serve() {
	err := OnDriverConn(w.conn, w.runFn)
	if h := seams.Get(); h != nil && h.AfterBlindStatement != nil {
		h.AfterBlindStatement(w.ctx, err, w.left)
	}
	w.mu.Lock()
	if !w.gone {
		w.res <- err
		w.mu.Unlock()
		return
	}
	conn, blind := w.conn, w.blind
	w.mu.Unlock()
	// Discarded even when f's answer came just before the caller left:
	// the cancel of the abandoned wait may still be watching this
	// backend, and would hit the next wait run on it.
	DiscardConn(conn)
	blind.conns.Delete(conn)
	blind.Budget.Give()
	idleBlindWorkers.put(w)
}

// GetConn is db.Conn, except that a connection being set up for the
// caller is not thrown away when ctx ends: the setup goes on (bounded by
// ConnectTimeout), in the background, and the connection goes to the pool
// for the next call (a spare of b's); left is then true, and b counts
// the connection until it is (see wait.Engine.TakeConn). Under deadlines
// shorter than a connection's setup (password authentication on a busy
// server), calls that abort their own setups would otherwise never get a
// connection at all. It also bounds a driver that dials with no context
// (lib/pq opened with sql.Open: about two minutes of SYN retries when the
// server stopped answering). When the pool has an idle connection, it is
// db.Conn.
func GetConn(ctx context.Context, db *sql.DB, b *Budget) (conn *sql.Conn, err error, left bool) {
	if ctx.Done() == nil || db.Stats().Idle > 0 {
		conn, err = db.Conn(ctx)
		return conn, err, false
	}
	if err := ctx.Err(); err != nil {
		return nil, err, false
	}
	conn, err = LeaveAtEnd(ctx, 0,
		func(func() bool) (*sql.Conn, error) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ConnectTimeout)
			defer cancel()
			return db.Conn(cctx)
		},
		func() {},
		func(conn *sql.Conn, err error) {
			if err == nil {
				b.Done(conn, true) // a spare, for the next call
				return
			}
			b.Give()
		})
	if errors.Is(err, ErrAbandoned) {
		return nil, ctx.Err(), true
	}
	return conn, err, false
}

// Bounded runs f, statements on a transaction or a querier of the
// caller's, and returns its result; when f has not returned AbandonGrace
// after ctx ended (a driver that does not give up a read when its context
// ends, on a network that stopped answering), it returns an error wrapping
// ErrAbandoned and ctx's error, and f finishes alone, its result handed to
// cleanup (nil: dropped).
func Bounded[T any](ctx context.Context, f func() (T, error), cleanup func(T, error)) (T, error) {
	if ctx.Done() == nil {
		return f()
	}
	if cleanup == nil {
		cleanup = func(T, error) {}
	}
	return LeaveAtEnd(ctx, AbandonGrace, func(func() bool) (T, error) { return f() }, func() {}, cleanup)
}

// ConnectTimeout bounds the setup of a connection whose caller left.
const ConnectTimeout = 30 * time.Second

// LeaveAtEnd runs work in a goroutine and returns its result, or, when it
// has not returned grace after ctx ended, an error wrapping
// ErrAbandoned and ctx's error. Leaving calls onLeave; work can ask whether
// its caller left (left); a result that comes after the caller left goes
// to cleanup. onLeave and cleanup never overlap the decision to leave.
func LeaveAtEnd[T any](ctx context.Context, grace time.Duration, work func(left func() bool) (T, error), onLeave func(), cleanup func(T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	var mu sync.Mutex
	gone := false // guarded by mu: the caller left
	left := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return gone
	}
	res := make(chan result, 1)
	go func() {
		v, err := work(left)
		mu.Lock()
		defer mu.Unlock()
		if gone {
			cleanup(v, err)
			return
		}
		res <- result{v, err}
	}()
	select {
	case r := <-res:
		return r.v, r.err
	case <-ctx.Done():
	}
	select {
	case r := <-res:
		return r.v, r.err
	case <-time.After(grace):
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-res:
		return r.v, r.err
	default:
		gone = true
		onLeave()
		var zero T
		return zero, fmt.Errorf("%w: %w", ErrAbandoned, ctx.Err())
	}
}

// DiscardConn closes conn's session instead of returning it to the pool:
// database/sql closes a connection whose Raw returns driver.ErrBadConn.
func DiscardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// monoEpoch is the origin of MonoNow.
var monoEpoch = time.Now()

// MonoNow is the monotonic time, in nanoseconds since monoEpoch.
func MonoNow() int64 { return int64(time.Since(monoEpoch)) }
