package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"ariga.io/atlas/sql/postgres"
	"ariga.io/atlas/sql/schema"
	migratepg "github.com/golang-migrate/migrate/v4/database/postgres"
	gooselock "github.com/pressly/goose/v3/lock"

	"github.com/sqllock/sqllock"
)

// waiter waits for the lock that the holder of a handoff holds; it returns
// a function that releases what it got.
type waiter func(ctx context.Context) (release func() error, err error)

// handoffResult is one row of the contended-handoff table.
type handoffResult struct {
	name     string
	samples  int
	p50, p99 time.Duration
}

// measureHandoff: a holder holds the key; a waiter starts waiting; after
// settle, the holder unlocks. The latency is from just before the holder's
// unlock call to the moment the waiter holds the lock.
func measureHandoff(e *env, name string, samples int, settle time.Duration, hold func() (func() error, error), wait waiter) (handoffResult, error) {
	var s sample
	for i := 0; i < samples; i++ {
		unlockHolder, err := hold()
		if err != nil {
			return handoffResult{}, fmt.Errorf("%s holder: %w", name, err)
		}
		type got struct {
			at      time.Time
			release func() error
			err     error
		}
		done := make(chan got, 1)
		go func() {
			release, err := wait(e.ctx)
			done <- got{time.Now(), release, err}
		}()
		time.Sleep(settle)
		t0 := time.Now()
		if err := unlockHolder(); err != nil {
			return handoffResult{}, fmt.Errorf("%s holder unlock: %w", name, err)
		}
		g := <-done
		if g.err != nil {
			return handoffResult{}, fmt.Errorf("%s waiter: %w", name, g.err)
		}
		s = append(s, g.at.Sub(t0))
		if err := g.release(); err != nil {
			return handoffResult{}, fmt.Errorf("%s waiter release: %w", name, err)
		}
	}
	return handoffResult{name: name, samples: samples, p50: s.median(), p99: s.quantile(0.99)}, nil
}

// sqllockHold holds the key with sqllock from the pgx pool.
func sqllockHold(e *env, k sqllock.Key) func() (func() error, error) {
	l := sqllock.New(e.pgx)
	return func() (func() error, error) {
		lk, err := l.Lock(e.ctx, k)
		if err != nil {
			return nil, err
		}
		return func() error { return lk.Unlock(e.ctx) }, nil
	}
}

func measureHandoffs(e *env, samples int) ([]handoffResult, error) {
	var out []handoffResult
	l := sqllock.New(e.pgx)
	k := sqllock.Int64(benchKey + 2)
	r, err := measureHandoff(e, "sqllock Lock (waits in the server)", samples, 20*time.Millisecond, sqllockHold(e, k),
		func(ctx context.Context) (func() error, error) {
			lk, err := l.Lock(ctx, k)
			if err != nil {
				return nil, err
			}
			return func() error { return lk.Unlock(ctx) }, nil
		})
	if err != nil {
		return nil, err
	}
	out = append(out, r)

	// golang-migrate waits in the server too (pg_advisory_lock).
	holder, err := migratepg.WithInstance(open("postgres", e.dsn), &migratepg.Config{})
	if err != nil {
		return nil, err
	}
	defer holder.Close()
	waiterDrv, err := migratepg.WithInstance(open("postgres", e.dsn), &migratepg.Config{})
	if err != nil {
		return nil, err
	}
	defer waiterDrv.Close()
	r, err = measureHandoff(e, "golang-migrate Lock (waits in the server)", samples, 20*time.Millisecond,
		func() (func() error, error) { return holder.Unlock, holder.Lock() },
		func(context.Context) (func() error, error) { return waiterDrv.Unlock, waiterDrv.Lock() })
	if err != nil {
		return nil, err
	}
	out = append(out, r)

	// atlas polls pg_try_advisory_lock with a growing back-off (25 ms, 50 ms, ...).
	adrv, err := postgres.Open(e.pgx)
	if err != nil {
		return nil, err
	}
	al := adrv.(schema.Locker)
	atlasLock := func(ctx context.Context) (func() error, error) {
		u, err := al.Lock(ctx, "bench-handoff", time.Minute)
		return func() error { return u() }, err
	}
	r, err = measureHandoff(e, "atlas Lock (polls with back-off)", samples, 20*time.Millisecond,
		func() (func() error, error) { return atlasLock(e.ctx) }, atlasLock)
	if err != nil {
		return nil, err
	}
	out = append(out, r)

	// goose polls every 5 s by default; its smallest period is 1 s.
	for _, g := range []struct {
		name   string
		period uint64
		n      int
	}{{"goose session locker, default (polls every 5 s)", 5, min(3, samples)}, {"goose session locker, smallest period (1 s)", 1, min(5, samples)}} {
		locker, err := gooselock.NewPostgresSessionLocker(gooselock.WithLockTimeout(g.period, 600))
		if err != nil {
			return nil, err
		}
		gooseHold := func(ctx context.Context) (func() error, error) {
			conn, err := e.pgx.Conn(ctx)
			if err != nil {
				return nil, err
			}
			if err := locker.SessionLock(ctx, conn); err != nil {
				conn.Close()
				return nil, err
			}
			return func() error { defer conn.Close(); return locker.SessionUnlock(ctx, conn) }, nil
		}
		r, err := measureHandoff(e, g.name, g.n, 20*time.Millisecond, func() (func() error, error) { return gooseHold(e.ctx) }, gooseHold)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// roundTrip returns the median time of SELECT 1 on one pinned connection,
// each after settle of idleness: the conditions of a handoff, whose
// parties wait before the holder unlocks.
func roundTrip(ctx context.Context, db *sql.DB, settle time.Duration) (time.Duration, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var s sample
	for i := 0; i < 50; i++ {
		time.Sleep(settle)
		t := time.Now()
		var one int
		if err := conn.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			return 0, err
		}
		s = append(s, time.Since(t))
	}
	return s.median(), nil
}
