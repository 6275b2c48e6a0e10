package sqllock_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestTokensDurableAcrossCrash: fencing tokens never go back across crash
// restarts of the server. Each round takes a token and crashes the server
// (immediate shutdown) at once, while other sessions commit transactions
// asynchronously (the server runs with synchronous_commit off, as many
// do): a token whose commit was not flushed would be issued again, or a
// smaller one, after the restart. SQLLOCK_CRASHES sets the number of
// crashes per driver (20 by default).
func TestTokensDurableAcrossCrash(t *testing.T) {
	long(t)
	t.Parallel()
	crashes := 20
	if n, err := strconv.Atoi(os.Getenv("SQLLOCK_CRASHES")); err == nil && n > 0 {
		crashes = n
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			srv := pgtest.Private(t) // crashed below: a server of its own
			dsn := srv.NewDatabase(t)
			db := pgtest.Open(t, drv, dsn)
			if _, err := db.Exec(`CREATE TABLE traffic (id bigserial PRIMARY KEY, v int)`); err != nil {
				t.Fatal(err)
			}
			// Write traffic: transactions that take transaction ids and
			// are committed without waiting for their flush.
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if _, err := db.ExecContext(ctx, `INSERT INTO traffic (v) VALUES (1)`); err != nil {
						time.Sleep(5 * time.Millisecond) // down while it restarts
					}
				}
			}()
			defer func() { stop(); wg.Wait() }()

			k := sqllock.Int64(9200)
			var last int64
			var took []time.Duration
			for i := range crashes {
				opts := []sqllock.Option{sqllock.WithKeepAlive(0)}
				if i%2 == 1 {
					opts = append(opts, sqllock.WithDedicatedSessions())
				}
				l := sqllock.New(db, opts...)
				lctx, cancel := context.WithTimeout(bg(), 30*time.Second)
				lk, err := l.Lock(lctx, k)
				if err != nil {
					cancel()
					t.Fatalf("crash %d: Lock() = %v", i, err)
				}
				tok, err := lk.Token(lctx)
				cancel()
				if err != nil {
					t.Fatalf("crash %d: Token() = %v", i, err)
				}
				if tok <= last {
					t.Fatalf("crash %d: token %d after %d: tokens went back across a crash restart", i, tok, last)
				}
				last = tok
				began := time.Now()
				if err := srv.Crash(bg()); err != nil {
					t.Fatalf("crash %d: %v", i, err)
				}
				took = append(took, time.Since(began))
				lk.Unlock(bg()) // its session ended with the crash
			}
			var rows int64
			if err := db.QueryRow(`SELECT count(*) FROM traffic`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d crash restarts (%v .. %v each), last token %d, %d rows of traffic kept", crashes, minDur(took), maxDur(took), last, rows)
			if rows == 0 {
				t.Fatal("no write traffic reached the server")
			}
		})
	}
}

func minDur(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = min(m, d)
	}
	return m
}

func maxDur(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}
