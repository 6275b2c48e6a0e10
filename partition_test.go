package sqllock_test

import (
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// The fault trials: a holder's link to the server is broken at the kernel
// level (pgtest.Isolated), and each trial reports t_client (when the holder
// was told: Done closed) and t_server (when another session, watching over
// the server's Unix socket, was first granted the lock), both from the
// moment of the fault. The safety rule: the holder is told first.

// Scaled-down settings for the trials: an orphan bound of a few seconds and
// a keep-alive that tells a cut-off holder well within it.
const (
	trialBound     = 4 * time.Second
	trialKeepAlive = 200 * time.Millisecond
	trials         = 10
)

// trial is one holder of one key.
type trial struct {
	key              sqllock.Key
	lk               *sqllock.Lock
	tClient, tServer time.Duration // -1: did not happen
}

// startTrials takes one lock per trial, each through a Locker of its own on
// drv over TCP, and an observer that watches the keys over the Unix socket.
func startTrials(t *testing.T, srv *pgtest.Isolated, drv, dsn string, n int, opts ...sqllock.Option) ([]*trial, *sql.DB) {
	t.Helper()
	observer := pgtest.Open(t, "pgx", srv.SocketDSN(pgtest.DatabaseOf(dsn)))
	var ts []*trial
	for i := 0; i < n; i++ {
		db := pgtest.Open(t, drv, dsn)
		l := sqllock.New(db, append([]sqllock.Option{sqllock.WithKeepAlive(trialKeepAlive), sqllock.WithOrphanBound(trialBound)}, opts...)...)
		k := sqllock.Pair(900, int32(i))
		lk, err := l.Lock(bg(), k)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, &trial{key: k, lk: lk, tClient: -1, tServer: -1})
	}
	return ts, observer
}

// watch records, from start, when each trial's holder is told and when the
// observer is first granted its key, until both happened or limit passed.
func watch(t *testing.T, ts []*trial, observer *sql.DB, start time.Time, limit time.Duration) {
	t.Helper()
	ol := sqllock.New(observer, sqllock.WithKeepAlive(0), sqllock.WithOrphanBound(0))
	var wg sync.WaitGroup
	for _, tr := range ts {
		wg.Add(2)
		go func() {
			defer wg.Done()
			select {
			case <-tr.lk.Done():
				tr.tClient = time.Since(start)
			case <-time.After(limit):
			}
		}()
		go func() {
			defer wg.Done()
			for time.Since(start) < limit {
				lk, err := ol.TryLock(bg(), tr.key)
				if err == nil {
					tr.tServer = time.Since(start)
					lk.Unlock(bg())
					return
				}
				if !errors.Is(err, sqllock.ErrNotAcquired) {
					t.Errorf("observer: %v", err)
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
}

// report logs every trial and returns how many broke the rule (the server
// freed the lock no later than the holder was told).
func report(t *testing.T, name string, ts []*trial) (violations int) {
	t.Helper()
	var lines []string
	for i, tr := range ts {
		v := ""
		if tr.tServer >= 0 && (tr.tClient < 0 || tr.tServer <= tr.tClient) {
			violations++
			v = "  VIOLATION"
		}
		lines = append(lines, fmt.Sprintf("  trial %2d: t_client %v  t_server %v%s", i, round(tr.tClient), round(tr.tServer), v))
	}
	sort.Strings(lines)
	t.Logf("%s (orphan bound %v, keep-alive %v):\n%s", name, trialBound, trialKeepAlive, strings.Join(lines, "\n"))
	return violations
}

func round(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}

// TestFullPartition: the holder's host is cut off from the server (every
// connection, keep-alive included). The server must free the lock within
// the orphan bound (+5 s), and the holder must be told first, in every
// trial, on both drivers.
func TestFullPartition(t *testing.T) {
	long(t)
	srv := pgtest.StartIsolated(t)
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			dsn := srv.NewDatabase(t)
			ts, observer := startTrials(t, srv, drv, dsn, trials)
			start := time.Now()
			if err := srv.Cut(); err != nil {
				t.Fatal(err)
			}
			watch(t, ts, observer, start, trialBound+10*time.Second)
			if err := srv.Restore(); err != nil {
				t.Fatal(err)
			}
			if v := report(t, "full partition", ts); v != 0 {
				t.Errorf("%d of %d trials: the server freed the lock before the holder was told", v, len(ts))
			}
			for i, tr := range ts {
				if tr.tServer < 0 || tr.tServer > trialBound+5*time.Second {
					t.Errorf("trial %d: lock freed after %v, want within the bound %v + 5s", i, round(tr.tServer), trialBound)
				}
				if !errors.Is(tr.lk.Err(), sqllock.ErrLockLost) {
					t.Errorf("trial %d: Err() = %v, want ErrLockLost", i, tr.lk.Err())
				}
				tr.lk.Unlock(bg())
			}
		})
	}
}
