package poolguard

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
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

// String describes the leak on one line, as in "backend 1234 kept 2
// advisory locks (key 42 exclusive held, key (1,2) shared held); policy
// Discard; last statement "SELECT pg_advisory_lock(42)"".
func (l Leak) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "backend %d ", l.PID)
	if l.Err != nil {
		fmt.Fprintf(&b, "could not be checked (%v)", l.Err)
	} else {
		fmt.Fprintf(&b, "kept %d advisory lock(s) (", len(l.Locks))
		for i, h := range l.Locks {
			if i > 0 {
				b.WriteString(", ")
			}
			mode, state := "exclusive", "held"
			if h.Shared {
				mode = "shared"
			}
			if !h.Granted {
				state = "waiting"
			}
			fmt.Fprintf(&b, "key %s %s %s", h.Key, mode, state)
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, "; policy %s", l.Policy)
	if l.LastQuery != "" {
		fmt.Fprintf(&b, "; last statement %q", l.LastQuery)
	}
	return b.String()
}

// check runs on a dirty connection as it returns to the pool; the result is
// IsValid's.
func (g *conn) check() bool {
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
	rows, err := q.QueryContext(ctx, sqltext.OwnSQL, nil)
	if err != nil {
		return 0, nil, err
	}
	defer rows.Close()
	var pid int
	var locks []sqllock.HeldLock
	vals := make([]driver.Value, len(rows.Columns()))
	for {
		if err := rows.Next(vals); err == io.EOF {
			break
		} else if err != nil {
			return pid, nil, err
		}
		r := pglocks.Scan(vals)
		pid = int(r.PID)
		if r.Tag.Objsubid == 0 {
			continue // the row of a session with no advisory lock
		}
		k := sqllock.Int64(r.Tag.BigintKey())
		if r.Tag.Objsubid == pglocks.Pair {
			k = sqllock.Pair(r.Tag.PairKey())
		}
		locks = append(locks, sqllock.HeldLock{Key: k, Shared: r.Shared, Granted: r.Granted, PID: pid})
	}
	return pid, locks, nil
}

func exec(ctx context.Context, dc driver.Conn, query string) error {
	if e, ok := dc.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, query, nil)
		return err
	}
	return errNotQueryer
}
