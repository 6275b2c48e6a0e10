package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/sqllockmock"
)

// panicky is an Observer that panics wherever it is called.
type panicky struct{ calls atomic.Int64 }

func (p *panicky) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	p.calls.Add(1)
	return func(*sqllock.Lock, error) { p.calls.Add(1); panic("observer: end") }
}

func (p *panicky) Event(context.Context, sqllock.Event) { p.calls.Add(1); panic("observer: event") }

// panicHandler is a slog.Handler that panics on every record.
type panicHandler struct{}

func (panicHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (panicHandler) Handle(context.Context, slog.Record) error { panic("handler") }
func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panicHandler) WithGroup(string) slog.Handler           { return h }

// TestObserverPanicsLeaveNoLock: an Observer (or a log handler) that
// panics in AcquireStart's end and in Event leaves the lock path whole:
// TryLock and Lock return their Lock, Unlock releases it (confirmed by
// the server), Done closes and Err says released, a second Unlock says
// ErrReleased, Stats agree, and nothing stays held.
func TestObserverPanicsLeaveNoLock(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		obs := &panicky{}
		l := sqllock.New(db, sqllock.WithObserver(obs), sqllock.WithLogger(slog.New(panicHandler{})), sqllock.WithKeepAlive(0))
		other := sqllock.New(pgtest.Open(t, "pgx", dsn), sqllock.WithKeepAlive(0))
		k := sqllock.Int64(71)
		for _, take := range []func(context.Context, sqllock.Key) (*sqllock.Lock, error){l.TryLock, l.Lock} {
			lk, err := take(bg(), k)
			if err != nil || lk == nil {
				t.Fatalf("lock with a panicking observer = %v, %v; want the lock", lk, err)
			}
			if st := l.Stats(); st.Held != 1 {
				t.Fatalf("Stats().Held = %d while held", st.Held)
			}
			if _, err := other.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) {
				t.Fatalf("another session's TryLock = %v, want ErrNotAcquired", err)
			}
			if err := lk.Unlock(bg()); err != nil {
				t.Fatalf("Unlock with a panicking observer = %v", err)
			}
			select {
			case <-lk.Done():
			default:
				t.Fatalf("Done not closed after Unlock")
			}
			if !errors.Is(lk.Err(), sqllock.ErrReleased) {
				t.Fatalf("Err() = %v after Unlock, want ErrReleased", lk.Err())
			}
			if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrReleased) {
				t.Fatalf("second Unlock = %v, want ErrReleased", err)
			}
			if len(holders(t, db, k)) != 0 {
				t.Fatalf("key still held after Unlock")
			}
		}
		st := l.Stats()
		if st.Held != 0 || st.Acquired != 2 || st.ObserverPanics == 0 || obs.calls.Load() == 0 {
			t.Fatalf("Stats() = %+v (observer calls %d), want 2 acquired, 0 held, panics counted", st, obs.calls.Load())
		}
	})
}

// counting is an Observer that keeps a gauge of held locks the way the
// otel module does: +1 when a lock call returns a Lock, -1 on each
// EventReleased and on each EventLost of a Lock.
type counting struct {
	mu       sync.Mutex
	held     int64
	released int64
	lost     int64
	failed   int64 // EventReleased with an error
}

func (c *counting) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	return func(lk *sqllock.Lock, err error) {
		if lk != nil {
			c.mu.Lock()
			c.held++
			c.mu.Unlock()
		}
	}
}

func (c *counting) Event(_ context.Context, e sqllock.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case e.Kind == sqllock.EventReleased:
		c.held--
		c.released++
		if e.Err != nil {
			c.failed++
		}
	case e.Kind == sqllock.EventLost && e.Key != (sqllock.Key{}):
		c.held--
		c.lost++
	}
}

func (c *counting) gauge() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}

// TestEveryEndIsEmitted: every path that ends a lock ends it once for
// Stats and for the observers alike: a clean unlock, a loss found by the
// keep-alive, and a loss found at unlock.
func TestEveryEndIsEmitted(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		obs := &counting{}
		l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithObserver(obs), sqllock.WithKeepAlive(100*time.Millisecond))
		check := func(step string) {
			t.Helper()
			if g, h := obs.gauge(), l.Stats().Held; g != h || h != 0 {
				t.Fatalf("%s: observer gauge %d, Stats().Held %d; want both 0", step, g, h)
			}
		}
		lk, err := l.Lock(bg(), sqllock.Int64(1))
		if err != nil {
			t.Fatal(err)
		}
		lk.Unlock(bg())
		check("clean unlock")

		lk, err = l.Lock(bg(), sqllock.Int64(2))
		if err != nil {
			t.Fatal(err)
		}
		terminate(t, srv, lk.PID())
		<-lk.Done()
		lk.Unlock(bg())
		check("lost, found by the keep-alive")

		quiet := sqllock.New(db, sqllock.WithObserver(obs), sqllock.WithKeepAlive(0))
		lk, err = quiet.Lock(bg(), sqllock.Int64(3))
		if err != nil {
			t.Fatal(err)
		}
		terminate(t, srv, lk.PID())
		if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrLockLost) {
			t.Fatalf("Unlock of a terminated session = %v, want ErrLockLost", err)
		}
		if g, h := obs.gauge(), quiet.Stats().Held; g != h || h != 0 {
			t.Fatalf("lost at unlock: observer gauge %d, Stats().Held %d", g, h)
		}
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestFailedUnlocksEndTheirLocks: an unlock statement that fails (the
// connection is discarded and the server releases the lock as the session
// ends) is one EventReleased carrying the error, so a gauge kept by an
// observer comes back to zero with Stats().Held. (go-sqlmock: a real
// server's unlock statement cannot be made to fail on demand.)
func TestFailedUnlocksEndTheirLocks(t *testing.T) {
	obs := &counting{}
	var held, discarded int64
	for i := range 3 {
		db, mock := newMock(t) // one connection each: a discarded one is gone
		l := sqllock.New(db, sqllock.WithDedicatedSessions(), sqllock.WithObserver(obs), sqllock.WithKeepAlive(0))
		sqllockmock.ExpectServerCheck(mock)
		k := sqllock.Int64(int64(100 + i))
		sqllockmock.ExpectTryLock(mock, k, true)
		lk, err := l.TryLock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		mock.ExpectQuery(".*pg_advisory_unlock.*").WillReturnError(errors.New("network blip"))
		if err := lk.Unlock(bg()); err == nil {
			t.Fatalf("Unlock with a failing statement = nil")
		}
		if !errors.Is(lk.Err(), sqllock.ErrReleased) {
			t.Fatalf("Err() = %v, want ErrReleased", lk.Err())
		}
		st := l.Stats()
		held += st.Held
		discarded += st.Discarded
	}
	if g := obs.gauge(); g != 0 || held != 0 || obs.failed != 3 || discarded != 3 {
		t.Fatalf("after 3 failed unlocks: gauge %d, Held %d, failed events %d, discarded %d; want 0, 0, 3, 3", g, held, obs.failed, discarded)
	}
}

// TestWindowsCount: Stats.Windows counts open hold windows: an early
// Unlock closes the window, a second UnlockAfter replaces it, and a lock
// lost during its window leaves it.
func TestWindowsCount(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithKeepAlive(100*time.Millisecond))
		lk, err := l.Lock(bg(), sqllock.Int64(5))
		if err != nil {
			t.Fatal(err)
		}
		lk.UnlockAfter(time.Hour)
		lk.UnlockAfter(2 * time.Hour)
		if w := l.Stats().Windows; w != 1 {
			t.Fatalf("Windows = %d after two UnlockAfter of one lock, want 1", w)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		if st := l.Stats(); st.Windows != 0 || st.Held != 0 {
			t.Fatalf("after an early Unlock: %+v, want Windows 0, Held 0", st)
		}
		lk, err = l.Lock(bg(), sqllock.Int64(6))
		if err != nil {
			t.Fatal(err)
		}
		lk.UnlockAfter(time.Hour)
		terminate(t, srv, lk.PID())
		<-lk.Done()
		if st := l.Stats(); st.Windows != 0 || st.Held != 0 {
			t.Fatalf("after a loss during the window: %+v, want Windows 0, Held 0", st)
		}
		lk, err = l.Lock(bg(), sqllock.Int64(7))
		if err != nil {
			t.Fatal(err)
		}
		lk.UnlockAfter(150 * time.Millisecond)
		select {
		case <-lk.Done():
		case <-time.After(5 * time.Second):
			t.Fatalf("the window's release did not happen")
		}
		if st := l.Stats(); st.Windows != 0 || st.Held != 0 || !errors.Is(lk.Err(), sqllock.ErrReleased) {
			t.Fatalf("after the window: %+v, Err %v", st, lk.Err())
		}
	})
}

// unlocker is an Observer that Unlocks each lock it is told was lost,
// and records how long each Unlock took.
type unlocker struct {
	mu    sync.Mutex
	locks map[sqllock.Key]*sqllock.Lock
	took  []time.Duration
}

func (u *unlocker) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	return func(lk *sqllock.Lock, err error) {
		if lk != nil {
			u.mu.Lock()
			u.locks[lk.Key()] = lk
			u.mu.Unlock()
		}
	}
}

func (u *unlocker) Event(ctx context.Context, e sqllock.Event) {
	if e.Kind != sqllock.EventLost {
		return
	}
	u.mu.Lock()
	lk := u.locks[e.Key]
	u.mu.Unlock()
	if lk == nil {
		return
	}
	began := time.Now()
	lk.Unlock(ctx)
	u.mu.Lock()
	u.took = append(u.took, time.Since(began))
	u.mu.Unlock()
}

// TestObserverUnlocksLostLock: an observer that Unlocks a lock as it is
// told the lock was lost does not stall the keep-alive: two holders on
// one terminated session are both told within a few keep-alive
// intervals, and each Unlock returns at once (the session is ended
// before the observers are told).
func TestObserverUnlocksLostLock(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	const keepAlive = 100 * time.Millisecond
	eachDriverParallel(t, func(t *testing.T, db *sql.DB, dsn string) {
		u := &unlocker{locks: map[sqllock.Key]*sqllock.Lock{}}
		l := sqllock.New(db, sqllock.WithObserver(u), sqllock.WithKeepAlive(keepAlive))
		a, err := l.Lock(bg(), sqllock.Int64(72))
		if err != nil {
			t.Fatal(err)
		}
		b, err := l.Lock(bg(), sqllock.Int64(73))
		if err != nil {
			t.Fatal(err)
		}
		if a.PID() != b.PID() {
			t.Fatalf("the two locks are on backends %d and %d, want one shared session", a.PID(), b.PID())
		}
		began := time.Now()
		terminate(t, srv, a.PID())
		for _, lk := range []*sqllock.Lock{a, b} {
			select {
			case <-lk.Done():
			case <-time.After(20 * time.Second):
				t.Fatalf("lock %v not told of its loss", lk.Key())
			}
		}
		told := time.Since(began)
		deadline := time.Now().Add(10 * time.Second)
		for {
			u.mu.Lock()
			n, took := len(u.took), append([]time.Duration(nil), u.took...)
			u.mu.Unlock()
			if n == 2 {
				t.Logf("both told after %v; the observer's Unlocks took %v", told.Round(time.Millisecond), took)
				for _, d := range took {
					if d > time.Second {
						t.Errorf("an observer's Unlock of a lost lock took %v, want at once", d)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the observer Unlocked %d of 2 lost locks", n)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if told > 3*time.Second {
			t.Errorf("both holders told after %v, want within a few keep-alive intervals (%v)", told, keepAlive)
		}
		for _, lk := range []*sqllock.Lock{a, b} {
			if err := lk.Unlock(bg()); !errors.Is(err, sqllock.ErrReleased) {
				t.Errorf("Unlock after the observer's = %v, want ErrReleased", err)
			}
		}
		if st := l.Stats(); st.Held != 0 || st.Lost != 2 {
			t.Errorf("Stats() = %+v, want Held 0, Lost 2", st)
		}
	})
}
