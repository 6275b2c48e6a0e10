package poolguard

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
)

// Leak describes a connection that came back to the pool holding advisory
// locks.
type Leak struct {
	PID       int                // the backend process id of the session
	Locks     []sqllock.HeldLock // the advisory locks the session holds or awaits
	LastQuery string             // the last statement of this checkout that made the connection suspect, else its last statement ("" when unknown)
	Err       error              // non-nil when the check itself failed (then Locks is empty)
	Policy    Policy             // what the guard did about it
}

// ownLocksSQL lists the advisory locks of the session that runs it.
const ownLocksSQL = `SELECT pg_backend_pid(), l.classid::int8, l.objid::int8, l.objsubid::int4, l.mode, l.granted
FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid()`

// check runs on a dirty connection as it returns to the pool; the result is
// IsValid's.
func (g *Conn) check() bool {
	c := g.c
	c.checks.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.checkTimeout)
	defer cancel()
	pid, locks, err := ownLocks(ctx, g.inner)
	if err == nil && len(locks) == 0 {
		g.dirty = false
		return true
	}
	last := g.lastQuery
	if last == "" {
		last = g.lastAny
	}
	leak := Leak{PID: pid, Locks: locks, LastQuery: last, Err: err, Policy: c.cfg.policy}
	c.leaks.Add(1)
	keep := false
	switch {
	case err != nil:
		leak.Policy = Discard // cannot tell: never keep it
	case c.cfg.policy == Report:
		keep = true
	case c.cfg.policy == UnlockAll:
		if uerr := exec(ctx, g.inner, "SELECT pg_advisory_unlock_all()"); uerr == nil {
			if _, left, verr := ownLocks(ctx, g.inner); verr == nil && len(left) == 0 {
				keep = true
				c.released.Add(1)
			}
		}
		if !keep {
			leak.Policy = Discard
		}
	}
	if !keep {
		c.discarded.Add(1)
	} else {
		g.dirty = false
	}
	c.cfg.logger.LogAttrs(context.Background(), slog.LevelWarn, "poolguard: advisory lock leak",
		slog.Int("pid", pid), slog.Int("locks", len(locks)), slog.String("policy", leak.Policy.String()),
		slog.String("last_query", leak.LastQuery), slog.Any("error", err))
	if c.cfg.onLeak != nil {
		c.cfg.onLeak(leak)
	}
	return keep
}

// ownLocks reads the advisory locks of the session behind dc.
func ownLocks(ctx context.Context, dc driver.Conn) (int, []sqllock.HeldLock, error) {
	q, ok := dc.(driver.QueryerContext)
	if !ok {
		return 0, nil, errNotQueryer
	}
	rows, err := q.QueryContext(ctx, ownLocksSQL, nil)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	var pid int
	var locks []sqllock.HeldLock
	vals := make([]driver.Value, 6)
	for {
		if err := rows.Next(vals); err == io.EOF {
			break
		} else if err != nil {
			return pid, nil, err
		}
		p, classid, objid, subid := asInt(vals[0]), asInt(vals[1]), asInt(vals[2]), asInt(vals[3])
		mode, _ := vals[4].(string)
		if b, ok := vals[4].([]byte); ok {
			mode = string(b)
		}
		granted, _ := vals[5].(bool)
		pid = int(p)
		k := sqllock.Int64(classid<<32 | objid)
		if subid == 2 {
			k = sqllock.Pair(int32(uint32(classid)), int32(uint32(objid)))
		}
		locks = append(locks, sqllock.HeldLock{Key: k, Shared: mode == "ShareLock", Granted: granted, PID: pid})
	}
	return pid, locks, nil
}

func asInt(v driver.Value) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case int32:
		return int64(n)
	}
	return 0
}

func exec(ctx context.Context, dc driver.Conn, query string) error {
	if e, ok := dc.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, query, nil)
		return err
	}
	return errNotQueryer
}

// Check returns the advisory locks, held or awaited, that any session holds
// in db's current database (it calls sqllock.Inspect). It is the core of
// [VerifyNone].
func Check(ctx context.Context, db *sql.DB) ([]sqllock.HeldLock, error) {
	return sqllock.Inspect(ctx, db)
}

// VerifyNone fails t when any session of db's database holds or awaits an
// advisory lock. It looks at pg_locks for the current database (every
// session, not only db's pool; session- and transaction-level alike),
// retrying for up to one second so that sessions that are ending can
// release theirs. Call it at the end of a test, or with defer:
//
//	defer poolguard.VerifyNone(t, db)
func VerifyNone(t testing.TB, db *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		locks, err := Check(context.Background(), db)
		if err != nil {
			t.Errorf("poolguard: VerifyNone: %v", err)
			return
		}
		if len(locks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("poolguard: %d advisory lock(s) still held:", len(locks))
			for _, l := range locks {
				state := "held"
				if !l.Granted {
					state = "waiting"
				}
				msg += fmt.Sprintf("\n  key %s %s by pid %d (%s): %q", l.Key, state, l.PID, l.ApplicationName, l.Query)
			}
			t.Error(msg)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
