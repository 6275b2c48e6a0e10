package sqllock_test

// A stranger on the line's tags: another program that holds, exclusively,
// the advisory locks a waiter takes besides its key (its doorbell and the
// tickets around the server's clock: pair keys in the line's negative
// class) costs the line its order, never its progress.

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/sqltext"
	"github.com/sqllock/sqllock/internal/testkit"
)

// squat takes, on a connection of db of its own (a program that knows
// nothing of the line), the pair keys (class, id) exclusively for every
// ticket id the server's clock gives from from to to milliseconds from
// now, and, with bell, the line's doorbell (class, 0): for t's life.
func squat(t *testing.T, db *sql.DB, class int32, bell bool, from, to int) {
	t.Helper()
	conn, err := db.Conn(bg())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.ExecContext(bg(), "SELECT pg_advisory_unlock_all()")
		conn.Close()
	})
	var n int64
	err = conn.QueryRowContext(bg(), `SELECT count(pg_advisory_lock($1::int4, ((((i + 2147483648) & 4294967295) - 2147483648))::int4))
 FROM generate_series(floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 + $2::int8, floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 + $3::int8) AS i
 WHERE ((i + 2147483648) & 4294967295) - 2147483648 <> 0`, class, from, to).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if bell {
		if _, err := conn.ExecContext(bg(), "SELECT pg_advisory_lock($1::int4, 0)", class); err != nil {
			t.Fatal(err)
		}
	}
}

// waitSlice is a Locker's slice of a wait on db's server: half its
// deadlock_timeout.
func waitSlice(t testing.TB, db *sql.DB) time.Duration {
	t.Helper()
	var ms int64
	if err := db.QueryRow(sqltext.WaitSliceSQL).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ms) * time.Millisecond
}

// roundTrip is the median time, over a few calls, of a Lock and Unlock
// of a free key on l: what "at once" costs on this machine now.
func roundTrip(t testing.TB, l *sqllock.Locker) time.Duration {
	t.Helper()
	var ds []time.Duration
	for i := range 5 {
		began := time.Now()
		lk, err := l.Lock(bg(), sqllock.Hash(fmt.Sprintf("round trip %p %d", l, i)))
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, time.Since(began))
		lk.Unlock(bg())
	}
	return testkit.Median(ds)
}

// ticketClassOf returns the ticket class of the line of k.
func ticketClassOf(k sqllock.Key) int32 {
	if c, id, ok := k.Pair(); ok {
		return sqltext.TicketClass(sqltext.Key{Pair: true, Class: c, ID: id})
	}
	v, _ := k.Int64()
	return sqltext.TicketClass(sqltext.Key{V: v})
}

// keyOfTicketClass returns a pair key whose line's ticket class is
// class: FNV-1a is inverted from both ends (two bytes of the key's class
// forward, three of its id backward) and the two halves met.
func keyOfTicketClass(t testing.TB, class int32) sqllock.Key {
	t.Helper()
	const basis, prime = 2166136261, 16777619
	inv := uint32(prime) // the inverse of prime mod 2^32, by Newton's method
	for range 5 {
		inv *= 2 - prime*inv
	}
	step := func(h uint32, b byte) uint32 { return (h ^ uint32(b)) * prime }
	h0 := step(basis, 2) // the pair form's tag (see sqltext.TicketClass)
	forward := make(map[uint32]uint32, 1<<16)
	for c := range uint32(1 << 16) {
		h := step(step(step(step(h0, byte(c)), byte(c>>8)), 0x80), 0x80)
		forward[h] = c | 0x8080<<16
	}
	for _, target := range []uint32{uint32(class), uint32(class) &^ (1 << 31)} {
		for id := range uint32(1 << 24) {
			h := target
			for i := 3; i >= 0; i-- {
				h = h*inv ^ (id >> (8 * i) & 0xff)
			}
			if c, ok := forward[h]; ok {
				k := sqllock.Pair(int32(c), int32(id))
				if ticketClassOf(k) != class {
					t.Fatalf("key %v: ticket class %d, want %d", k, ticketClassOf(k), class)
				}
				return k
			}
		}
	}
	t.Fatalf("no key of ticket class %d found", class)
	return sqllock.Key{}
}

// TestLineStranger: while a stranger holds, exclusively, the locks that
// a waiter takes besides its key (its doorbell, the tickets around the
// server's clock, or the tickets just before it), Lock of a free key is
// granted at once (within a slice of a wait: today's bound is one round
// trip), and a waiter for a key released after 0.5 s is granted within
// one slice of the release. The same holds for a key whose line's class
// is a semaphore's slots' (the semaphore's permits held), and for a
// semaphore whose line a stranger holds.
func TestLineStranger(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		slice := waitSlice(t, db)
		logs := &capture{}
		waiter := sqllock.New(db, sqllock.WithLogger(slog.New(logs)))
		holder := sqllock.New(db)
		rtt := roundTrip(t, waiter)
		// A grant is "at once" within a slice of the line (the slice a
		// waiter's registration spends on a held doorbell before it
		// gives up its place), plus what a few round trips cost now.
		bound := slice + 4*rtt
		t.Logf("slice %v, round trip %v", slice, rtt)

		type subject struct {
			take func(ctx context.Context, l *sqllock.Locker) (*sqllock.Lock, error)
			// occupy makes the subject busy (its key held, or every permit),
			// from holder, until the returned func frees it.
			occupy func() func()
		}
		keySubject := func(k sqllock.Key) subject {
			return subject{
				take: func(ctx context.Context, l *sqllock.Locker) (*sqllock.Lock, error) { return l.Lock(ctx, k) },
				occupy: func() func() {
					lk, err := holder.Lock(bg(), k)
					if err != nil {
						t.Fatal(err)
					}
					return func() { lk.Unlock(bg()) }
				},
			}
		}
		semSubject := func(name string, n int) subject {
			return subject{
				take: func(ctx context.Context, l *sqllock.Locker) (*sqllock.Lock, error) {
					return l.Semaphore(name, n).Acquire(ctx)
				},
				occupy: func() func() {
					var held []*sqllock.Lock
					for range n {
						lk, err := holder.Semaphore(name, n).Acquire(bg())
						if err != nil {
							t.Fatal(err)
						}
						held = append(held, lk)
					}
					return func() {
						for _, lk := range held {
							lk.Unlock(bg())
						}
					}
				},
			}
		}
		semClass := func(name string) int32 {
			c, _, _ := sqllock.SemaphoreSlots(name, 1)[0].Pair()
			return c
		}
		collide := keyOfTicketClass(t, semClass("stranger slots"))

		tests := []struct {
			name  string
			subj  subject
			squat func(t *testing.T) // the stranger, for the subtest's life
		}{
			{"doorbell and tickets", keySubject(sqllock.Hash("stranger 1")), func(t *testing.T) {
				squat(t, db, ticketClassOf(sqllock.Hash("stranger 1")), true, -200, 2500)
			}},
			{"tickets around the clock", keySubject(sqllock.Hash("stranger 2")), func(t *testing.T) {
				squat(t, db, ticketClassOf(sqllock.Hash("stranger 2")), false, -200, 2500)
			}},
			{"earlier tickets", keySubject(sqllock.Hash("stranger 3")), func(t *testing.T) {
				squat(t, db, ticketClassOf(sqllock.Hash("stranger 3")), false, -200, -1)
			}},
			{"a semaphore's slots in the key's class", keySubject(collide), func(t *testing.T) {
				release := semSubject("stranger slots", 2).occupy()
				t.Cleanup(release)
			}},
			{"a semaphore's line", semSubject("stranger semaphore", 1), func(t *testing.T) {
				squat(t, db, sqltext.SemaphoreTicketClass(semClass("stranger semaphore")), true, -200, 2500)
			}},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				tc.squat(t)
				ctx, cancel := context.WithTimeout(bg(), 5*time.Second)
				defer cancel()
				// Free: granted at once.
				began := time.Now()
				lk, err := tc.subj.take(ctx, waiter)
				free := time.Since(began)
				if err != nil {
					t.Fatalf("free: %v (after %v)", err, free)
				}
				lk.Unlock(bg())
				if free > bound {
					t.Errorf("free: granted after %v, want within %v", free, bound)
				}
				// Busy, freed after 0.5 s: granted within a slice of it.
				release := tc.subj.occupy()
				type grant struct {
					at  time.Time
					err error
				}
				got := make(chan grant, 1)
				go func() {
					lk, err := tc.subj.take(ctx, waiter)
					g := grant{time.Now(), err}
					if err == nil {
						lk.Unlock(bg())
					}
					got <- g
				}()
				time.Sleep(500 * time.Millisecond)
				freed := time.Now()
				release()
				g := <-got
				if g.err != nil {
					t.Fatalf("waiter: %v (%v after the release)", g.err, g.at.Sub(freed))
				}
				after := g.at.Sub(freed)
				t.Logf("free key granted in %v; waiter granted %v after the release", free, after)
				if after > bound {
					t.Errorf("waiter granted %v after the release, want within %v", after, bound)
				}
			})
		}
		// Its waiters bypassed lines (held doorbells, no free ticket):
		// the Locker said so once.
		n := 0
		logs.mu.Lock()
		for _, r := range logs.records {
			if r.Level == slog.LevelWarn && strings.Contains(r.Message, "ticket class") {
				n++
			}
		}
		logs.mu.Unlock()
		if n != 1 {
			t.Errorf("%d warnings of a bypassed line, want 1", n)
		}
	})
}
