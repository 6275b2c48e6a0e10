package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// capture is a slog.Handler that keeps every record.
type capture struct {
	mu      sync.Mutex
	records []slog.Record
}

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }
func (c *capture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, r.Clone())
	return nil
}
func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

// find returns the attributes of the first record with message msg.
func (c *capture) find(msg string) (map[string]slog.Value, slog.Level, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.records {
		if r.Message == msg {
			attrs := map[string]slog.Value{}
			r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
			return attrs, r.Level, true
		}
	}
	return nil, 0, false
}

// reasons returns the reason attributes of the records with message msg
// so far, and forgets them.
func (c *capture) reasons(msg string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.records {
		if r.Message == msg {
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "reason" {
					out = append(out, a.Value.String())
				}
				return true
			})
		}
	}
	c.records = nil
	return out
}

func TestLogEvents(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		logs := &capture{}
		reg := sqllock.NewRegistry()
		k := reg.MustRegister("cron:reindex_posts", sqllock.Int64(11))
		l := sqllock.New(db, sqllock.WithLogger(slog.New(logs)), reg, sqllock.WithKeepAlive(50*time.Millisecond))
		lk, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		if err := lk.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		if _, _, ok := logs.find("sqllock: waiting"); ok {
			t.Errorf("waiting event for a lock that was free")
		}
		if a, _, ok := logs.find("sqllock: acquired"); !ok || a["wait"].Kind() != slog.KindDuration || a["pid"].Int64() != int64(lk.PID()) {
			t.Errorf("acquired event: %v %v", a, ok)
		}
		if a, _, ok := logs.find("sqllock: released"); !ok || a["held"].Duration() < 20*time.Millisecond {
			t.Errorf("released event: %v %v", a, ok)
		} else if _, has := a["error"]; has {
			t.Errorf("released event of a clean unlock carries an error attribute: %v", a)
		}
		// Lost, and the discarded connection of a cancelled wait.
		lk, err = l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		terminate(t, srv, lk.PID())
		<-lk.Done()
		if a, lvl, ok := logs.find("sqllock: lock lost"); !ok || lvl != slog.LevelWarn || a["pid"].Int64() != int64(lk.PID()) {
			t.Errorf("lost event: %v %v %v", a, lvl, ok)
		}
		lk.Unlock(bg())
		// Held by another Locker: a caller of this one waits in the server.
		held, err := sqllock.New(db).Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(bg()) // a deadline would be kept by the server
		defer cancel()
		go func() {
			defer cancel()
			testkit.WaitWaiters(t, db, k, 1) // cancelled once it waits
		}()
		l.Lock(ctx, k)
		held.Unlock(bg())
		if a, lvl, ok := logs.find("sqllock: waiting"); !ok || lvl != slog.LevelDebug || a["key"].String() != `11 "cron:reindex_posts"` || a["pid"].Int64() == 0 {
			t.Errorf("waiting event: %v %v %v", a, lvl, ok)
		}
		if a, lvl, ok := logs.find("sqllock: connection discarded"); !ok || lvl != slog.LevelWarn || a["reason"].String() == "" {
			t.Errorf("discarded event: %v %v %v", a, lvl, ok)
		}
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestRegistryNamesInErrors: a Locker given a registry names keys in its
// errors, not only in its log events.
func TestRegistryNamesInErrors(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	reg := sqllock.NewRegistry()
	k := reg.MustRegister("cron:nightly_export", sqllock.Hash("cron:nightly_export"))
	l := sqllock.New(db, reg, sqllock.WithKeepAlive(0))
	lk, err := l.Lock(bg(), k)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(bg())
	l2 := sqllock.New(db, reg)
	if _, err := l2.TryLock(bg(), k); !errors.Is(err, sqllock.ErrNotAcquired) || !strings.Contains(err.Error(), `"cron:nightly_export"`) {
		t.Fatalf("TryLock of a held key = %v, want ErrNotAcquired naming cron:nightly_export", err)
	}
	ctx, cancel := context.WithTimeout(bg(), 50*time.Millisecond)
	defer cancel()
	if _, err := l2.Lock(ctx, k); !errors.Is(err, sqllock.ErrNotAcquired) || !strings.Contains(err.Error(), `"cron:nightly_export"`) {
		t.Fatalf("Lock past its deadline = %v, want the name", err)
	}
}

// lostNames records the Name of each EventLost.
type lostNames struct {
	mu    sync.Mutex
	names []string
}

func (o *lostNames) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	return nil
}

func (o *lostNames) Event(_ context.Context, e sqllock.Event) {
	if e.Kind == sqllock.EventLost {
		o.mu.Lock()
		o.names = append(o.names, e.Name)
		o.mu.Unlock()
	}
}

// TestRegistryNamesSemaphoreSlots: a Locker given a Registry that knows a
// semaphore names its slots "name[i]", as the Registry's doc says, in its
// logs (acquired, lost), in its events (EventLost's Name) and in a lost
// permit's error; and a key registered by name keeps its name.
func TestRegistryNamesSemaphoreSlots(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		reg := sqllock.NewRegistry()
		if err := reg.RegisterSemaphore("exports", 2); err != nil {
			t.Fatal(err)
		}
		logs, events := &capture{}, &lostNames{}
		l := sqllock.New(db, reg, sqllock.WithLogger(slog.New(logs)), sqllock.WithObserver(events),
			sqllock.WithKeepAlive(50*time.Millisecond))
		lk, err := l.Semaphore("exports", 2).Acquire(bg())
		if err != nil {
			t.Fatal(err)
		}
		_, slot, _ := lk.Key().Pair()
		want := fmt.Sprintf("%s %q", lk.Key(), fmt.Sprintf("exports[%d]", slot))
		if a, _, ok := logs.find("sqllock: acquired"); !ok || a["key"].String() != want {
			t.Errorf("acquired record: key %v (found %v), want %s", a["key"], ok, want)
		}
		terminate(t, srv, lk.PID())
		<-lk.Done()
		if a, _, ok := logs.find("sqllock: lock lost"); !ok || a["key"].String() != want {
			t.Errorf("lost record: key %v (found %v), want %s", a["key"], ok, want)
		}
		if err := lk.Err(); !errors.Is(err, sqllock.ErrLockLost) || !strings.Contains(err.Error(), want) {
			t.Errorf("lost permit's Err() = %v, want it to name %s", err, want)
		}
		events.mu.Lock()
		if len(events.names) != 1 || events.names[0] != fmt.Sprintf("exports[%d]", slot) {
			t.Errorf("EventLost names = %q, want [exports[%d]]", events.names, slot)
		}
		events.mu.Unlock()
		lk.Unlock(bg())
	})
}
