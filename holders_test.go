package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// TestHolders: who holds a key, from Holders and from a refused lock's
// error, with the application name the Locker gave its sessions.
func TestHolders(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Hash("report:nightly")
		holder := sqllock.New(db, sqllock.WithApplicationName("billing-worker"))
		lk, err := holder.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Unlock(bg())
		wdb := pgtest.Open(t, "pgx", dsn)
		waiter := sqllock.New(wdb, sqllock.WithHolders())
		// The waiter waits until the checks below are done (a loaded
		// machine can take seconds to set its sessions up).
		wctx, wcancel := context.WithTimeout(bg(), 30*time.Second)
		waited := make(chan struct{})
		go func() {
			defer close(waited)
			if lk, err := waiter.Lock(wctx, k); err == nil {
				lk.Unlock(bg())
			}
		}()
		defer func() { wcancel(); <-waited }()
		testkit.WaitWaiters(t, db, k, 1)
		hs, err := sqllock.Inspect(bg(), db, nil, k)
		if err != nil || len(hs) != 2 {
			t.Fatalf("Holders = %v, %v; want the holder and the waiter", hs, err)
		}
		h := hs[0]
		var addr string // as the server sees this client: loopback, or a container's gateway
		if err := db.QueryRow("SELECT coalesce(host(inet_client_addr()), '')").Scan(&addr); err != nil {
			t.Fatal(err)
		}
		if !h.Granted || h.PID != lk.PID() || h.ApplicationName != "billing-worker" || h.ClientAddr != addr || h.Since.IsZero() || h.Waiters != 1 {
			t.Fatalf("holder row = %+v", h)
		}
		t.Logf("Holders: %v", h)
		// A refusal asks who holds the key on a connection of the
		// waiter's pool, bounded to a second (and says nothing of them
		// past it): two are set up first, so that what is measured is
		// the error, not how long a loaded machine takes to set up a
		// connection (the TryLock's shared session takes one).
		warmPool(t, wdb, 2)
		// A refused lock says who holds it.
		_, err = waiter.TryLock(bg(), k)
		var held *sqllock.HeldError
		if !errors.As(err, &held) || !errors.Is(err, sqllock.ErrNotAcquired) || len(held.Holders) == 0 || held.Holders[0].PID != lk.PID() {
			t.Fatalf("TryLock of a held key = %v, want a HeldError naming pid %d", err, lk.PID())
		}
		if !strings.Contains(err.Error(), `"billing-worker"`) {
			t.Fatalf("error %q does not name the holder", err)
		}
		ctx, cancel := context.WithTimeout(bg(), 100*time.Millisecond)
		defer cancel()
		called := time.Now()
		_, err = waiter.Lock(ctx, k)
		if !errors.As(err, &held) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock past its deadline = %v, want a HeldError and DeadlineExceeded", err)
		}
		switch took := time.Since(called); {
		case len(held.Holders) > 0 && held.Holders[0].PID != lk.PID():
			t.Fatalf("Lock past its deadline = %v, want the holder's pid %d", err, lk.PID())
		case len(held.Holders) == 0 && took < 100*time.Millisecond+time.Second:
			// Its holders query is bounded to a second: only a call that
			// returned past the deadline and that bound may name none.
			t.Fatalf("Lock past its deadline = %v after %v: names no holder within the holders query's bound", err, took)
		case len(held.Holders) == 0:
			t.Logf("Lock past its deadline returned after %v, its holders query past its bound: %v", took, err)
		}
		// A name set on the DSN is never overwritten.
		named := sqllock.New(pgtest.Open(t, "pgx", withAppName(t, dsn, "mine")), sqllock.WithApplicationName("other"))
		lk2, err := named.Lock(bg(), sqllock.Int64(8))
		if err != nil {
			t.Fatal(err)
		}
		defer lk2.Unlock(bg())
		if hs, err := sqllock.Inspect(bg(), db, nil, sqllock.Int64(8)); err != nil || len(hs) != 1 || hs[0].ApplicationName != "mine" {
			t.Fatalf("Holders of a lock whose DSN names its application = %v, %v", hs, err)
		}
	})
}

func TestApplicationNameIsChecked(t *testing.T) {
	for _, bad := range []string{"", "it's", `back\slash`, strings.Repeat("x", 64), "tab\there"} {
		if err := sqllock.CheckOptions(sqllock.WithApplicationName(bad)); err == nil {
			t.Errorf("CheckOptions(WithApplicationName(%q)) = nil, want an error", bad)
		}
	}
	if err := sqllock.CheckOptions(sqllock.WithApplicationName("billing-worker")); err != nil {
		t.Errorf("CheckOptions(WithApplicationName(billing-worker)) = %v", err)
	}
}

// TestHeldErrorOfAnotherRole: a refusal by a session of another role says
// which backend holds the key, and nothing that role named its session;
// HeldLock's text has no empty fields.
func TestHeldErrorOfAnotherRole(t *testing.T) {
	t.Parallel()
	user, privileged := heldByAnotherRole(t, 321, "secret-batch")
	_, err := sqllock.New(user, sqllock.WithHolders()).TryLock(bg(), sqllock.Int64(321))
	var held *sqllock.HeldError
	if !errors.As(err, &held) || len(held.Holders) == 0 {
		t.Fatalf("TryLock of a key held by another role = %v, want a HeldError", err)
	}
	msg := err.Error()
	if strings.Contains(msg, ", )") || strings.Contains(msg, `("`) {
		t.Errorf("HeldError %q has an empty field", msg)
	}
	if privileged {
		t.Logf("the test role may read all statistics: %s", msg)
		return
	}
	if strings.Contains(msg, "secret-batch") || !strings.Contains(msg, "another role") {
		t.Fatalf("HeldError = %q: want the backend and \"another role\", not the other role's application name", msg)
	}
	if s := held.Holders[0].String(); strings.Contains(s, ", )") || !strings.Contains(s, "another role") {
		t.Fatalf("HeldLock.String() = %q", s)
	}
}

// TestHeldErrorText: a WithHolders error names the holder once, in the
// refusal's own words: "…42 is held by pid N (…)", not "…is held by
// another session; held by key 42 exclusive held by pid N (…)".
func TestHeldErrorText(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		k := sqllock.Int64(4242)
		holder := sqllock.New(db, sqllock.WithApplicationName("billing-worker"))
		lk, err := holder.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Unlock(bg())
		sem, err := holder.Semaphore("exports", 1).TryAcquire(bg())
		if err != nil {
			t.Fatal(err)
		}
		defer sem.Unlock(bg())
		wdb := pgtest.Open(t, "pgx", dsn)
		waiter := sqllock.New(wdb, sqllock.WithHolders())
		// by is how the error must name the holder h: its session, once.
		by := func(h sqllock.HeldLock, pid int) string {
			s := fmt.Sprintf(`pid %d (application "billing-worker", idle)`, pid)
			if h.ClientAddr != "" {
				s += " from " + h.ClientAddr
			}
			return s + " since " + h.Since.Format("15:04:05")
		}
		_, err = waiter.TryLock(bg(), k)
		var held *sqllock.HeldError
		if !errors.As(err, &held) || len(held.Holders) == 0 {
			t.Fatalf("TryLock of a held key = %v, want a HeldError", err)
		}
		if want := "sqllock: lock not acquired: 4242 is held by " + by(held.Holders[0], lk.PID()); err.Error() != want {
			t.Errorf("TryLock's error:\n got %q\nwant %q", err, want)
		}
		_, err = waiter.Semaphore("exports", 1).TryAcquire(bg())
		if !errors.As(err, &held) || len(held.Holders) == 0 {
			t.Fatalf("TryAcquire of a full semaphore = %v, want a HeldError", err)
		}
		if want := `sqllock: lock not acquired: all 1 slots of semaphore "exports" are held; one slot held by ` + by(held.Holders[0], sem.PID()); err.Error() != want {
			t.Errorf("TryAcquire's error:\n got %q\nwant %q", err, want)
		}
		ctx, cancel := context.WithTimeout(bg(), 100*time.Millisecond)
		defer cancel()
		_, err = waiter.Lock(ctx, k)
		if !errors.As(err, &held) || len(held.Holders) == 0 {
			t.Fatalf("Lock past its deadline = %v, want a HeldError", err)
		}
		if want := "sqllock: lock not acquired: 4242: context deadline exceeded; held by " + by(held.Holders[0], lk.PID()); !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Lock's error past its deadline:\n got %q\nwant %q (and the waiters, if any)", err, want)
		}
	})
}

// warmPool leaves n connections set up and idle in db's pool.
func warmPool(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg(), 30*time.Second)
	defer cancel()
	db.SetMaxIdleConns(max(n, 2))
	conns := make([]*sql.Conn, 0, n)
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.PingContext(ctx); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
}
