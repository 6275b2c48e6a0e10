package sqllock_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// runTicks runs schedulers that fire the same 10 ms job with TryDo every
// period, each at its own offset, for ticks ticks, and returns how many
// schedulers ran each tick.
func runTicks(t *testing.T, drv, dsn string, offsets []time.Duration, period time.Duration, ticks int, opts ...sqllock.DoOption) []int {
	t.Helper()
	k := sqllock.Hash("cron:every-tick")
	runs := make([]int, ticks)
	var mu sync.Mutex
	// Each scheduler is warm before the first tick: its pool holds a
	// session and its Locker has checked the server. A cold first call
	// (a new connection, under a loaded suite hundreds of milliseconds) is
	// not clock skew, and it made tick 0 run twice.
	lockers := make([]*sqllock.Locker, len(offsets))
	for i := range lockers {
		lockers[i] = sqllock.New(pgtest.Open(t, drv, dsn))
		ok, err := lockers[i].TryDo(bg(), sqllock.Hash("cron:warm-up"), func(context.Context) error { return nil })
		if err != nil || !ok {
			t.Fatalf("warm-up TryDo = %v, %v", ok, err)
		}
	}
	start := time.Now().Add(200 * time.Millisecond).Truncate(10 * time.Millisecond)
	var wg sync.WaitGroup
	for i, off := range offsets {
		l := lockers[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tick := 0; tick < ticks; tick++ {
				time.Sleep(time.Until(start.Add(time.Duration(tick)*period + off)))
				ran, err := l.TryDo(bg(), k, func(context.Context) error {
					time.Sleep(10 * time.Millisecond)
					return nil
				}, opts...)
				if err != nil {
					t.Errorf("tick %d: TryDo: %v", tick, err)
				}
				if ran {
					mu.Lock()
					runs[tick]++
					mu.Unlock()
				}
			}
		}()
	}
	waitGroup(t, &wg, hangCeiling)
	return runs
}

// TestHoldWindowOncePerTick: five schedulers whose clocks differ by up to
// skew fire the same 10 ms job every period. With plain TryDo, a tick runs
// on several machines (the job ends before the late ones fire); with a
// hold window of period less a margin (between skew and period), exactly
// one runs each tick. Scaled down (period 500 ms, skew 300 ms: 100 ms of
// scheduling jitter tolerated each way), and at the settings
// (period 1 s, skew 900 ms, 50 ms each way) outside -short.
func TestHoldWindowOncePerTick(t *testing.T) {
	long(t) // a timing trial: clocks skewed by hundreds of milliseconds
	t.Parallel()
	type setting struct {
		period, skew, margin time.Duration
		ticks                int
	}
	settings := []setting{{500 * time.Millisecond, 300 * time.Millisecond, 100 * time.Millisecond, 20}}
	if testkit.Short() {
		settings[0].ticks = 8
	} else {
		settings = append(settings, setting{time.Second, 900 * time.Millisecond, 50 * time.Millisecond, 20})
	}
	srv := pgtest.Start(t)
	for _, st := range settings {
		for _, drv := range drivers {
			t.Run(fmt.Sprintf("period=%v/%s", st.period, drv), func(t *testing.T) {
				t.Parallel()
				dsn := srv.NewDatabase(t)
				offsets := make([]time.Duration, 5)
				for i := range offsets {
					offsets[i] = st.skew * time.Duration(i) / 4
				}
				plain := runTicks(t, drv, dsn, offsets, st.period, st.ticks)
				twice := 0
				for _, n := range plain {
					if n > 1 {
						twice++
					}
				}
				window := st.period - st.margin
				held := runTicks(t, drv, dsn, offsets, st.period, st.ticks, sqllock.WithHoldAtLeast(window))
				t.Logf("%d ticks, skew %v: plain TryDo ran %v (ticks run more than once: %d); with a %v window: %v",
					st.ticks, st.skew, plain, twice, window, held)
				if twice == 0 {
					t.Errorf("the baseline never ran a tick twice: the test does not exercise the flaw")
				}
				for tick, n := range held {
					if n != 1 {
						t.Errorf("tick %d ran %d times with a %v window, want exactly once", tick, n, window)
					}
				}
			})
		}
	}
}

// TestUnlockAfter: the release waits for the window, in the background.
func TestUnlockAfter(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	l := sqllock.New(db)
	k := sqllock.Int64(606)
	lk, err := l.Lock(bg(), k)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := lk.UnlockAfter(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Fatalf("UnlockAfter waited %v", d)
	}
	if st := l.Stats(); st.Windows != 1 || st.Held != 1 {
		t.Fatalf("Stats() during the window = %+v", st)
	}
	if len(holders(t, db, k)) != 1 {
		t.Fatal("released before the window ended")
	}
	<-lk.Done()
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("released after %v, want about 300ms", d)
	}
	waitFree(t, db, k, time.Second)
	if st := l.Stats(); st.Windows != 0 || st.Held != 0 {
		t.Fatalf("Stats() after the window = %+v", st)
	}
	if err := lk.UnlockAfter(time.Second); err == nil {
		t.Fatal("UnlockAfter of a released lock = nil")
	}
}

// TestHoldWindowRefused: a negative window is an error of the call, before
// any lock is taken or fn runs.
func TestHoldWindowRefused(t *testing.T) {
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	l := sqllock.New(db)
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	err := l.Do(bg(), sqllock.Int64(1), fn, sqllock.WithHoldAtLeast(-time.Second))
	if err == nil || !strings.Contains(err.Error(), "negative window") {
		t.Errorf("Do(WithHoldAtLeast(-1s)) = %v, want a negative-window error", err)
	}
	did, err := l.TryDo(bg(), sqllock.Int64(1), fn, sqllock.WithHoldAtLeast(-time.Second))
	if did || err == nil || !strings.Contains(err.Error(), "negative window") {
		t.Errorf("TryDo(WithHoldAtLeast(-1s)) = %v, %v, want false and a negative-window error", did, err)
	}
	if ran {
		t.Errorf("fn ran")
	}
	if st := l.Stats(); st.Acquired != 0 {
		t.Errorf("Stats().Acquired = %d, want 0", st.Acquired)
	}
}

// TestDurationMaxima: a Locker made with the longest unlock timeout takes
// and releases a lock (unlockTimeout plus its epoch overflowed once, and
// every call failed), and a hold window longer than the maximum is refused
// with the lock left as it was.
func TestDurationMaxima(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db, sqllock.WithUnlockTimeout(sqllock.MaxUnlockTimeout), sqllock.WithKeepAlive(sqllock.MaxKeepAlive))
		k := sqllock.Int64(607)
		lk, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatalf("Lock with the longest unlock timeout = %v", err)
		}
		if err := lk.UnlockAfter(sqllock.MaxHoldWindow + 1); err == nil || !strings.Contains(err.Error(), "at most") {
			t.Errorf("UnlockAfter(%v) = %v, want an error", sqllock.MaxHoldWindow+1, err)
		}
		if err := lk.Err(); err != nil || len(holders(t, db, k)) != 1 || l.Stats().Windows != 0 {
			t.Fatalf("after a refused window: Err() = %v, holders %v, %+v; want the lock held as before", err, holders(t, db, k), l.Stats())
		}
		if err := lk.UnlockAfter(sqllock.MaxHoldWindow); err != nil {
			t.Fatalf("UnlockAfter(%v) = %v", sqllock.MaxHoldWindow, err)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Fatalf("Unlock during the window = %v", err)
		}
		waitFree(t, db, k, time.Second)
		ran, err := l.TryDo(bg(), k, func(context.Context) error { return nil })
		if !ran || err != nil {
			t.Fatalf("TryDo with the longest unlock timeout = %v, %v", ran, err)
		}
		waitFree(t, db, k, time.Second)
	})
}
