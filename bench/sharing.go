package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sqllock/sqllock"
)

// The sessions-per-locks curve: N goroutines of one Locker each take a
// lock on a distinct free key and hold it; how many server sessions hold
// them, how long taking them all took, and whether every one was granted.
// A default Locker (shared sessions) against one made
// WithDedicatedSessions (a session per lock), on the same server.

// sharingPoint is one measurement.
type sharingPoint struct {
	driver    string
	dedicated bool
	locks     int           // locks asked for
	held      int           // locks granted
	sessions  int           // server sessions holding them
	took      time.Duration // to take them all
}

// sharingSizes are the curve's numbers of locks.
var sharingSizes = []int{1, 10, 100, 1000, 5000, 10000}

// measureSharing measures the curve for both drivers; the dedicated
// Locker only up to limit locks (past the server's max_connections it can
// only fail, as the table says once).
func measureSharing(e *env, limit int) ([]sharingPoint, error) {
	var out []sharingPoint
	for _, drv := range []string{"pgx", "postgres"} {
		for _, dedicated := range []bool{false, true} {
			for _, n := range sharingSizes {
				if dedicated && n > limit {
					continue
				}
				p, err := sharingOnce(e, drv, dedicated, n)
				if err != nil {
					return nil, err
				}
				out = append(out, p)
			}
		}
	}
	return out, nil
}

func sharingOnce(e *env, drv string, dedicated bool, n int) (sharingPoint, error) {
	db := open(drv, e.dsn)
	defer db.Close()
	var opts []sqllock.Option
	if dedicated {
		opts = append(opts, sqllock.WithDedicatedSessions())
	}
	l := sqllock.New(db, opts...)
	p := sharingPoint{driver: drv, dedicated: dedicated, locks: n}
	locks := make([]*sqllock.Lock, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
			defer cancel()
			lk, err := l.TryLock(ctx, sqllock.Pair(77, int32(i)))
			if err == nil {
				locks[i] = lk
			}
		})
	}
	wg.Wait()
	p.took = time.Since(start)
	for _, lk := range locks {
		if lk != nil {
			p.held++
		}
	}
	err := e.pgx.QueryRowContext(e.ctx, `SELECT count(DISTINCT pid) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = 77`).Scan(&p.sessions)
	for _, lk := range locks {
		if lk != nil {
			wg.Go(func() {
				if uerr := lk.Unlock(e.ctx); uerr != nil && err == nil {
					err = uerr
				}
			})
		}
	}
	wg.Wait()
	return p, err
}

// writeSharing writes the curve's table to w and its chart to dir.
func writeSharing(w io.Writer, dir string, points []sharingPoint) error {
	fmt.Fprintf(w, "| driver | sessions | locks asked | locks held | server sessions | to take them all |\n|---|---|---|---|---|---|\n")
	for _, p := range points {
		kind := "shared (default)"
		if p.dedicated {
			kind = "a session per lock"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %v |\n", map[string]string{"postgres": "lib/pq", "pgx": "pgx"}[p.driver], kind, p.locks, p.held, p.sessions, p.took.Round(time.Millisecond))
	}
	names := make([]string, len(sharingSizes))
	for i, n := range sharingSizes {
		names[i] = fmt.Sprint(n)
	}
	var shared, own []float64
	for _, n := range sharingSizes {
		s, d := 0.0, float64(n) // past the measured sizes: the n sessions it would need
		for _, p := range points {
			if p.driver != "pgx" || p.locks != n {
				continue
			}
			if p.dedicated {
				d = float64(p.sessions)
			} else {
				s = float64(p.sessions)
			}
		}
		shared, own = append(shared, s), append(own, d)
	}
	return barChart(dir, "sharing.png", "Server sessions holding N locks (pgx)", "log10 sessions (0 = 1, 1 = 10, 2 = 100)",
		names, []series{{"shared (default)", shared}, {"a session per lock (needed, past the measured)", own}}, true)
}

// runSharing is the -sharing mode: the curve alone, against a server that
// admits maxConns connections.
func runSharing(e *env, dir string, w io.Writer) error {
	var maxConns int
	if err := e.pgx.QueryRowContext(e.ctx, "SELECT current_setting('max_connections')::int").Scan(&maxConns); err != nil {
		return err
	}
	points, err := measureSharing(e, maxConns/2)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "max_connections = %d; a session per lock measured up to %d locks.\n\n", maxConns, maxConns/2)
	return writeSharing(w, dir, points)
}
