package testkit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqllock/sqllock"
)

// Throughput: N goroutines each take and release distinct free keys, one
// after another, as fast as they can. A Load is one way of doing it; the
// loads run in alternating phases, in a random order each round, in one
// process, and each is summed up by its median locks per second and by
// where its time went: the client's CPU (this process) and the server's
// (its processes, read from /proc) per lock, and the client's allocations
// per lock, over all its phases.

// Load takes and releases keys with n goroutines until ctx ends, and
// returns how many locks it took.
type Load struct {
	Name string
	Run  func(ctx context.Context, n int) (int64, error)
}

// LoadResult is one Load's measurement.
type LoadResult struct {
	Name        string
	LocksPerSec float64 // median over the phases
	ClientUS    float64 // client CPU per lock, µs
	ServerUS    float64 // server CPU per lock, µs (0 when it cannot be read)
	Allocs      float64 // client allocations per lock
	// Longest is the longest time one lock and its release took, over
	// all the phases (loads that run PerGoroutine; 0 for the others).
	Longest time.Duration
}

// longestKey is the context key under which Throughput gives a phase's
// PerGoroutine the place for its longest call.
type longestKey struct{}

// Throughput measures loads at n goroutines: rounds rounds of one phase
// each. serverCPU reads the server's CPU time (see ServerCPU); nil when the
// server is not on this machine.
func Throughput(loads []Load, n int, phase time.Duration, rounds int, serverCPU func() (time.Duration, error)) ([]LoadResult, error) {
	type sum struct {
		rates                  []float64
		client, server, allocs float64
		locks                  int64
		longest                atomic.Int64 // ns
	}
	sums := make([]sum, len(loads))
	read := func() (client, server time.Duration, allocs uint64, err error) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if serverCPU != nil {
			server, err = serverCPU()
		}
		return ProcessCPU(), server, ms.Mallocs, err
	}
	for range rounds {
		for _, i := range rand.Perm(len(loads)) {
			c0, s0, a0, err := read()
			if err != nil {
				return nil, err
			}
			s := &sums[i]
			ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), longestKey{}, &s.longest), phase)
			start := time.Now()
			got, err := loads[i].Run(ctx, n)
			took := time.Since(start)
			cancel()
			if err != nil {
				return nil, fmt.Errorf("%s, %d goroutines: %w", loads[i].Name, n, err)
			}
			c1, s1, a1, err := read()
			if err != nil {
				return nil, err
			}
			s.rates = append(s.rates, float64(got)/took.Seconds())
			s.client += float64(c1 - c0)
			s.server += float64(s1 - s0)
			s.allocs += float64(a1 - a0)
			s.locks += got
		}
	}
	out := make([]LoadResult, len(loads))
	for i := range sums {
		s := &sums[i]
		per := float64(max(s.locks, 1))
		out[i] = LoadResult{Name: loads[i].Name, LocksPerSec: medianFloat(s.rates),
			ClientUS: s.client / per / 1e3, ServerUS: s.server / per / 1e3, Allocs: s.allocs / per,
			Longest: time.Duration(s.longest.Load())}
	}
	return out, nil
}

// TryUnlockLoads are the throughput measurement's three loads: l's
// TryLock and Unlock, the same statements by hand on raw's pool, and the
// batched ceiling on ceiling's.
func TryUnlockLoads(l *sqllock.Locker, raw, ceiling *sql.DB) []Load {
	return []Load{
		{Name: "sqllock", Run: func(ctx context.Context, n int) (int64, error) {
			return PerGoroutine(ctx, n, 8_000_000, func(k int64) error {
				lk, err := l.TryLock(context.Background(), sqllock.Int64(k))
				if err != nil {
					return err
				}
				return lk.Unlock(context.Background())
			})
		}},
		{Name: "raw", Run: func(ctx context.Context, n int) (int64, error) {
			return PerGoroutine(ctx, n, 8_000_000, func(k int64) error { return RawTryUnlock(raw, k) })
		}},
		{Name: "ceiling", Run: func(ctx context.Context, n int) (int64, error) { return Batched(ctx, ceiling, n, 9_000_000) }},
	}
}

// PerGoroutine runs n goroutines, each taking and releasing keys of its
// own (from base, 1000 each) with one until ctx ends, and returns how many
// locks they took. A failed lock ends the run with its error. Under
// Throughput it also records the longest call of one (see
// LoadResult.Longest).
func PerGoroutine(ctx context.Context, n int, base int64, one func(k int64) error) (int64, error) {
	var total atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	longest, _ := ctx.Value(longestKey{}).(*atomic.Int64)
	for g := range n {
		wg.Go(func() {
			keys := base + int64(g)*1000
			var most time.Duration
			defer func() {
				if longest == nil {
					return
				}
				mu.Lock()
				if int64(most) > longest.Load() {
					longest.Store(int64(most))
				}
				mu.Unlock()
			}()
			for i := int64(0); ctx.Err() == nil; i++ {
				start := time.Now()
				if err := one(keys + i%1000); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
				most = max(most, time.Since(start))
				total.Add(1)
			}
		})
	}
	wg.Wait()
	return total.Load(), first
}

// RawTryUnlock is one lock by hand: a pooled connection, the try, the
// unlock, back to the pool.
func RawTryUnlock(db *sql.DB, k int64) error {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	var ok bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", k).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("try %d: %v, %w", k, ok, err)
	}
	if err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1)", k).Scan(&ok); err != nil || !ok {
		return fmt.Errorf("unlock %d: %v, %w", k, ok, err)
	}
	return nil
}

// Batched is the ceiling for n goroutines: their keys, n at a time, sent
// by hand in statements of up to 64 keys (one unnest statement tries
// them, one releases them), on up to 16 pinned connections at once, until
// ctx ends: the server's cost per key, with no library. It returns the
// number of locks taken.
func Batched(ctx context.Context, db *sql.DB, n int, base int64) (int64, error) {
	batch := min(n, 64)
	conns := min(16, (n+batch-1)/batch)
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for c := range conns {
		wg.Go(func() {
			conn, err := db.Conn(context.Background())
			if err != nil {
				errs[c] = err
				return
			}
			defer conn.Close()
			var lit strings.Builder
			lit.WriteByte('{')
			for i := range batch {
				if i > 0 {
					lit.WriteByte(',')
				}
				lit.WriteString(strconv.FormatInt(base+int64(c*1000+i), 10))
			}
			lit.WriteByte('}')
			keys := lit.String()
			for ctx.Err() == nil {
				var got, freed int64
				if err := conn.QueryRowContext(context.Background(),
					"SELECT count(*) FILTER (WHERE pg_try_advisory_lock(k)) FROM unnest($1::text::int8[]) AS u(k)", keys).Scan(&got); err != nil {
					errs[c] = err
					return
				}
				if err := conn.QueryRowContext(context.Background(),
					"SELECT count(*) FILTER (WHERE pg_advisory_unlock(k)) FROM unnest($1::text::int8[]) AS u(k)", keys).Scan(&freed); err != nil {
					errs[c] = err
					return
				}
				if got != int64(batch) || freed != got {
					errs[c] = fmt.Errorf("batch of %d: %d taken, %d freed", batch, got, freed)
					return
				}
				total.Add(freed)
			}
		})
	}
	wg.Wait()
	return total.Load(), errors.Join(errs...)
}
