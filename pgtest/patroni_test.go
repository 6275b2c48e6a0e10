package pgtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqllock/sqllock/internal/testkit"
	"github.com/sqllock/sqllock/pgtest"
)

// TestPatroniOptions: settings Patroni would refuse, or that mean nothing,
// are errors before anything starts.
func TestPatroniOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  pgtest.PatroniOption
		want string
	}{
		{"no nodes", pgtest.WithNodes(0), "at least 1"},
		{"loop_wait + 2 × retry_timeout > ttl", pgtest.WithTimings(10*time.Second, 3*time.Second, 4*time.Second), "≤ ttl"},
		{"not whole seconds", pgtest.WithTimings(10*time.Second, 1500*time.Millisecond, 4*time.Second), "whole seconds"},
		{"zero", pgtest.WithTimings(10*time.Second, 0, 4*time.Second), "whole seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := pgtest.NewPatroni(context.Background(), tt.opt)
			if err == nil {
				p.Close()
				t.Fatal("NewPatroni() = nil error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewPatroni() = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// TestPatroniDivergedReplica: in synchronous mode, an asynchronous replica
// that replayed WAL the synchronous standby never received is past the
// fork point of the standby's new timeline once it is promoted, and cannot
// follow it; Patroni rebuilds it from the new primary, and the cluster is
// whole again. The standby's WAL receiver is stopped (SIGSTOP) while the
// primary writes, a MiB at a time in one transaction, until the replica
// has replayed a MiB more than the standby was ever sent; the commit waits
// for the standby, the replica gets its record. Then the primary's host
// dies, the receiver resumes (it reads what its socket holds), the standby
// is promoted after ttl, and the replica's position is checked against
// the new timeline's fork point before the wait for a healthy cluster. A
// crash of the primary's PostgreSQL would not do: Patroni restarts it in
// place.
func TestPatroniDivergedReplica(t *testing.T) {
	testkit.Long(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	begin := time.Now()
	p := pgtest.StartPatroni(t, pgtest.WithSynchronousMode())
	t.Logf("cluster of %d nodes (sync) up in %v", len(p.Nodes()), time.Since(begin).Round(time.Millisecond))
	prim, err := p.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	primDB := pgtest.Open(t, "pgx", prim.AdminDSN())
	syncN, asyncN := standbys(t, ctx, p, primDB)
	syncDB := pgtest.Open(t, "pgx", syncN.AdminDSN())
	asyncDB := pgtest.Open(t, "pgx", asyncN.AdminDSN())
	writer := pgtest.Open(t, "pgx", prim.DSN())
	if _, err := writer.ExecContext(ctx, `CREATE TABLE diverge (pad text NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	var pid int
	if err := syncDB.QueryRowContext(ctx, `SELECT pid FROM pg_stat_wal_receiver WHERE status = 'streaming'`).Scan(&pid); err != nil {
		t.Fatalf("%s's WAL receiver: %v", syncN, err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop %s's WAL receiver %d: %v", syncN, pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("resume %s's WAL receiver %d: %v", syncN, pid, err)
			}
		}
	}
	defer resume()
	stalled := time.Now()
	stoppedAt := queryLSN(t, ctx, syncDB, `SELECT pg_last_wal_receive_lsn()::text`)

	// The writer inserts a MiB at each step it is sent true, in one
	// transaction, and commits when sent false.
	next := make(chan bool)
	wrote := make(chan struct{})
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan struct{})
	var werr error // set before wdone closes
	go func() {
		defer close(wdone)
		tx, err := writer.BeginTx(wctx, nil)
		if err != nil {
			werr = err
			return
		}
		for more := range next {
			if !more {
				werr = tx.Commit() // it waits for the standby: until the primary dies
				return
			}
			if _, err := tx.ExecContext(wctx, `INSERT INTO diverge SELECT repeat('x', 1000) FROM generate_series(1, 1000)`); err != nil {
				tx.Rollback()
				werr = err
				return
			}
			wrote <- struct{}{}
		}
	}()
	defer func() { close(next); wcancel(); <-wdone }()
	send := func(more bool) {
		select {
		case next <- more:
		case <-wdone:
			t.Fatalf("the writer ended: %v", werr)
		}
	}

	// Step by step, until the primary's socket to the standby is full
	// while the replica goes on. (A step is flushed, and sent, within
	// wal_writer_delay.) The replica stays a few MiB ahead at most: a
	// standby further behind the primary than maximum_lag_on_failover
	// (16 MiB) would refuse to be promoted.
	var replayed, sent int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		send(true)
		select {
		case <-wrote:
		case <-wdone:
			t.Fatalf("the writer ended: %v", werr)
		}
		written := queryLSN(t, ctx, primDB, `SELECT pg_current_wal_lsn()::text`)
		for replayed = 0; replayed < written && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			replayed = queryLSN(t, ctx, asyncDB, `SELECT pg_last_wal_replay_lsn()::text`)
		}
		sent = queryLSN(t, ctx, primDB, `SELECT sent_lsn::text FROM pg_stat_replication WHERE application_name = $1`, syncN.Name)
		if replayed > sent+1<<20 {
			break
		}
		if replayed-stoppedAt > 48<<20 || time.Now().After(deadline) {
			t.Fatalf("the recipe did not make %s lag %s: after %v, %s replayed %s, %s was sent %s",
				syncN, asyncN, time.Since(stalled).Round(time.Millisecond), asyncN, fmtLSN(replayed), syncN, fmtLSN(sent))
		}
	}
	send(false)
	for {
		var waiting bool
		var flushed string
		if err := primDB.QueryRowContext(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'SyncRep'),
			pg_current_wal_flush_lsn()::text`).Scan(&waiting, &flushed); err != nil {
			t.Fatal(err)
		}
		replayed = queryLSN(t, ctx, asyncDB, `SELECT pg_last_wal_replay_lsn()::text`)
		if waiting && replayed >= parseLSN(t, flushed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the commit did not reach %s: waiting for %s: %v, flushed %s, %s replayed %s", asyncN, syncN, waiting, flushed, asyncN, fmtLSN(replayed))
		}
		time.Sleep(10 * time.Millisecond)
	}
	sent = queryLSN(t, ctx, primDB, `SELECT sent_lsn::text FROM pg_stat_replication WHERE application_name = $1`, syncN.Name)
	t.Logf("%s's WAL receiver stopped at %s for %v: %s replayed %s (%.1f MiB more), %s was sent %s",
		syncN, fmtLSN(stoppedAt), time.Since(stalled).Round(time.Millisecond), asyncN, fmtLSN(replayed),
		float64(replayed-stoppedAt)/(1<<20), syncN, fmtLSN(sent))

	killed := time.Now()
	if err := p.KillHost(prim); err != nil {
		t.Fatal(err)
	}
	resume()
	pctx, pcancel := context.WithTimeout(ctx, time.Minute)
	defer pcancel()
	np, err := p.WaitPrimary(pctx, prim)
	if err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	if np != syncN {
		t.Fatalf("%s was promoted, want the synchronous standby %s", np, syncN)
	}
	fork := forkPoint(t, ctx, syncDB)
	t.Logf("%s's host killed, %s accepted writes %v later; its timeline forked off at %s", prim, np,
		promoted.Sub(killed).Round(time.Millisecond), fmtLSN(fork))
	if replayed <= fork {
		t.Fatalf("the recipe did not make %s diverge: it replayed %s, not past %s's fork point %s", asyncN, fmtLSN(replayed), np, fmtLSN(fork))
	}
	t.Logf("%s is %.1f MiB past the fork point", asyncN, float64(replayed-fork)/(1<<20))

	hctx, hcancel := context.WithTimeout(ctx, time.Minute)
	defer hcancel()
	if err := p.WaitHealthy(hctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("healthy %v after the promotion (%s streams from %s); %v in all", time.Since(promoted).Round(time.Millisecond),
		asyncN, np, time.Since(begin).Round(time.Millisecond))
}

// standbys returns the synchronous standby and the asynchronous replica
// that stream from the primary of db.
func standbys(t *testing.T, ctx context.Context, p *pgtest.Patroni, db *sql.DB) (syncN, asyncN *pgtest.Node) {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT application_name, sync_state FROM pg_stat_replication WHERE state = 'streaming'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var states []string
	for rows.Next() {
		var name, state string
		if err := rows.Scan(&name, &state); err != nil {
			t.Fatal(err)
		}
		states = append(states, name+" "+state)
		for _, n := range p.Nodes() {
			switch {
			case n.Name != name:
			case state == "sync":
				syncN = n
			case state == "async":
				asyncN = n
			}
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if syncN == nil || asyncN == nil {
		t.Fatalf("want a synchronous standby and an asynchronous replica, the primary has: %s", strings.Join(states, ", "))
	}
	return syncN, asyncN
}

// forkPoint returns where the newest timeline of db's server began: the
// switch point on the last line of its history file.
func forkPoint(t *testing.T, ctx context.Context, db *sql.DB) int64 {
	t.Helper()
	var history string
	if err := db.QueryRowContext(ctx, `SELECT pg_read_file('pg_wal/' || name) FROM pg_ls_waldir()
		WHERE name LIKE '%.history' ORDER BY name DESC LIMIT 1`).Scan(&history); err != nil {
		t.Fatalf("timeline history: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(history), "\n")
	fields := strings.Split(lines[len(lines)-1], "\t")
	if len(fields) < 2 {
		t.Fatalf("timeline history %q", history)
	}
	return parseLSN(t, fields[1])
}

// queryLSN runs q, which returns an LSN as text, on db.
func queryLSN(t *testing.T, ctx context.Context, db *sql.DB, q string, args ...any) int64 {
	t.Helper()
	var s string
	if err := db.QueryRowContext(ctx, q, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return parseLSN(t, s)
}

// parseLSN parses an LSN as PostgreSQL writes it (hex, high/low).
func parseLSN(t *testing.T, s string) int64 {
	t.Helper()
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		t.Fatalf("LSN %q: %v", s, err)
	}
	return int64(hi)<<32 | int64(lo)
}

// fmtLSN formats an LSN as PostgreSQL does.
func fmtLSN(lsn int64) string { return fmt.Sprintf("%X/%X", lsn>>32, uint32(lsn)) }
