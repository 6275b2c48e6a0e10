package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock/internal/sqltext"
)

// The doctor's rounds: what tells a transaction pooler, beyond the probe
// a Locker runs before its first lock (core.DetectPooler), and whether a
// statement prepared on a client connection is still there in its next
// transaction (pgx's statement cache).
//
// Each round, on a pool of its own in pgx's cache_statement mode: client
// connection a runs a statement in a transaction (pgx prepares it there,
// once, and runs it from its cache after that); client connection b opens
// a transaction and runs a statement, which pins a server session for b
// as long as it stays open; a runs its statement again, in a second
// transaction. Each answers who runs it (pid and backend start). A direct
// connection (or a session-mode pooler's) keeps one backend of its own
// for its whole life, so any of these says a transaction pooler, for
// certain: a's backend changed; b runs on the backend a ran on; a's
// statement is gone (SQLSTATE 26000) or, prepared afresh, already there
// (42P05). A transaction pooler that hands out the server session it
// released last (PgBouncer) gives b the one a just released, and a
// another; other clients may take it in between, which each round makes
// less likely to hide.

// doctorRounds is how many rounds the doctor runs at most: all of them
// on a direct connection; behind a transaction pooler, until a's
// statement ran on another server session than the one it was prepared
// on (or was lost there). Other clients' traffic can hide a pooler from
// a round (they take the server session a released first), and a round
// costs a few round trips.
const doctorRounds = 32

// roundWait bounds each statement of a round: a pooler with one server
// session gives a's second transaction none while b's is open.
const roundWait = 5 * time.Second

// backend is who answered a statement: its pid and start.
type backend struct{ pid, start int64 }

// roundsOutcome is what the rounds learnt.
type roundsOutcome struct {
	// evidence says, for certain, that a transaction pooler is in the
	// way ("" when none was seen).
	evidence string
	// lost is the error of a statement that a's (or b's) next
	// transaction no longer found prepared, or found prepared already
	// (nil: none).
	lost error
	// moved counts the runs of a's prepared statement that succeeded on
	// another backend than the one it was prepared on: a pooler that
	// prepares it again there (PgBouncer's max_prepared_statements).
	moved int
	// rounds counts the rounds run to their end.
	rounds int
	// err is what ended the rounds early (nil: none did).
	err error
	// reached is the address a reached (nil when unknown).
	reached net.Addr
}

// poolerRounds runs the rounds on a pool of its own, opened from cfg.
func poolerRounds(ctx context.Context, cfg *pgx.ConnConfig) (out roundsOutcome) {
	c := cfg.Copy()
	c.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	if c.StatementCacheCapacity <= 0 {
		c.StatementCacheCapacity = 512 // pgx's default
	}
	db := stdlib.OpenDB(*c)
	defer db.Close()
	nonce := make([]byte, 8)
	rand.Read(nonce)
	q, pin := sqltext.DoctorRoundSQL(hex.EncodeToString(nonce)), sqltext.DoctorPinSQL(hex.EncodeToString(nonce))

	cctx, cancel := context.WithTimeout(ctx, roundWait)
	a, err := db.Conn(cctx)
	var b *sql.Conn
	if err == nil {
		if b, err = db.Conn(cctx); err != nil {
			a.Close()
		}
	}
	cancel()
	if err != nil {
		out.err = err
		return out
	}
	defer a.Close()
	defer b.Close()
	out.reached = remoteAddr(a)

	var preparedOn, last backend
	saw := func(format string, args ...any) {
		if out.evidence == "" {
			out.evidence = fmt.Sprintf(format, args...)
		}
	}
	// ran checks an answer of a: its backend against the one before.
	ran := func(got backend) {
		if preparedOn == (backend{}) {
			preparedOn = got
		} else if got != preparedOn {
			out.moved++
		}
		if last != (backend{}) && got != last {
			saw("a client connection that ran on backend %d answered from backend %d", last.pid, got.pid)
		}
		last = got
	}
	for i := 0; i < doctorRounds && (out.evidence == "" || out.moved == 0); i++ {
		first, err := txAnswer(ctx, a, q, int64(i))
		if err != nil {
			out.fail(err)
			return out
		}
		ran(first)
		bctx, bcancel := context.WithTimeout(ctx, roundWait)
		tx, err := b.BeginTx(bctx, nil)
		var pinned backend
		if err == nil {
			err = tx.QueryRowContext(bctx, pin).Scan(&pinned.pid, &pinned.start)
		}
		if err != nil {
			if tx != nil {
				tx.Rollback()
			}
			bcancel()
			out.fail(err) // b's statement, prepared in an earlier round, is as good as a's
			return out
		}
		if pinned == first {
			saw("two client connections ran on backend %d", pinned.pid)
		}
		second, err := txAnswer(ctx, a, q, int64(i))
		tx.Rollback()
		bcancel()
		if err != nil {
			out.fail(err)
			return out
		}
		ran(second)
		out.rounds++
	}
	return out
}

// fail records the error of a's statement (or b's): a prepared statement
// lost (or found already there) is evidence; anything else ends the
// rounds.
func (o *roundsOutcome) fail(err error) {
	switch stmt.SQLState(err) {
	case "26000":
		o.lost = err
		if o.evidence == "" {
			o.evidence = "a statement prepared on a client connection was gone in its next transaction (SQLSTATE 26000)"
		}
	case "42P05":
		o.lost = err
		if o.evidence == "" {
			o.evidence = "a statement no other client had sent was already prepared on the server session a client connection got (SQLSTATE 42P05)"
		}
	default:
		o.err = err
	}
}

// txAnswer runs q with n in a transaction of its own on c (bounded by
// roundWait), and returns who answered.
func txAnswer(ctx context.Context, c *sql.Conn, q string, n int64) (backend, error) {
	ctx, cancel := context.WithTimeout(ctx, roundWait)
	defer cancel()
	var got backend
	tx, err := c.BeginTx(ctx, nil)
	if err != nil {
		return got, err
	}
	var echo int64
	if err := tx.QueryRowContext(ctx, q, n).Scan(&echo, &got.pid, &got.start); err != nil {
		tx.Rollback()
		return got, err
	}
	if echo != n {
		tx.Rollback()
		return got, errors.New("the round's statement answered another number than it was given")
	}
	return got, tx.Commit()
}

// remoteAddr returns the address c's driver connection reached, or nil.
func remoteAddr(c *sql.Conn) net.Addr {
	var addr net.Addr
	c.Raw(func(dc any) error {
		if pc, ok := dc.(*stdlib.Conn); ok {
			if nc := pc.Conn().PgConn().Conn(); nc != nil {
				addr = nc.RemoteAddr()
			}
		}
		return nil
	})
	return addr
}
