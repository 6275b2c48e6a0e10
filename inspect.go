package sqllock

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sqllock/sqllock/internal/core/stmt"

	"github.com/sqllock/sqllock/internal/core"
	"github.com/sqllock/sqllock/internal/pglocks"
	"github.com/sqllock/sqllock/internal/sqltext"
)

// Querier runs a query: *sql.DB, *sql.Conn, *sql.Tx and *sqlx.DB satisfy it.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// HeldLock is one advisory lock, held or awaited, as [Inspect] reports it.
type HeldLock struct {
	Key             Key
	Name            string // from the Registry given to Inspect, else ""
	Shared          bool
	Granted         bool // false: still waiting
	PID             int  // 0 for a lock of a prepared transaction
	ApplicationName string
	State           string // pg_stat_activity.state; "" when hidden
	// Query is the session's current or last statement. PostgreSQL shows
	// "<insufficient privilege>" to roles that may not see other roles'
	// sessions; see Hidden.
	Query     string
	Hidden    bool      // the role may not see this session's activity
	WaitStart time.Time // when the wait began; zero when granted or unknown
	// BlockedBy are the sessions this one waits for (pg_blocking_pids; for
	// a wait that ended as it was read, those holding its key in a
	// conflicting mode then).
	BlockedBy []int
	// ClientAddr is the session's client address ("" over a Unix socket,
	// or when hidden).
	ClientAddr string
	// Since is when the session entered its state (pg_stat_activity's
	// state_change): for a holder that runs nothing, about when it took
	// the lock; zero when hidden.
	Since time.Time
	// Waiters is, for a held lock, how many sessions wait for its key.
	Waiters int
	// Semaphore names the semaphore whose slot the key is, when the
	// Registry given to Inspect knows it (RegisterSemaphore).
	Semaphore string
}

// Inspect returns the advisory locks, held and awaited, in the current
// database: pg_locks joined with pg_stat_activity, with keys decoded
// correctly (a bigint key is classid<<32 | objid; reading objid alone is
// wrong for keys of 2^32 and above and for negative keys), sorted by key,
// granted before waiting, waiters in the order their waits began, then by
// pid.
//
// It needs no privileges; a role that may not see other roles' sessions
// gets their locks with Hidden set and no query text. PostgreSQL cannot tell
// a session-level from a transaction-level lock in pg_locks, and shows a lock
// taken several times by one session once.
//
// A Locker's waiter in a key's line (see [Locker.Lock]) holds a ticket in
// it, an advisory lock of its own: Inspect reports it as a waiter for the
// key, whether it waits for the key in the server or for the waiter ahead
// of it, for the keys it knows of (those given, or held or awaited by
// anyone): Granted false, WaitStart its arrival in the line, and BlockedBy
// the key's holders in a conflicting mode (for a semaphore's waiter, the
// holders of its slots). The line's own locks are not reported.
//
// r, which may be nil, names the keys it knows. Given keys, Inspect
// reports those keys only.
func Inspect(ctx context.Context, q Querier, r *Registry, keys ...Key) ([]HeldLock, error) {
	mustContext(ctx, "Inspect")
	if isNil(q) {
		return nil, fmt.Errorf("sqllock: Inspect: nil Querier")
	}
	// Bounded by ctx whatever the driver does (see stmt.Bounded).
	out, err := stmt.Bounded(ctx, func() ([]HeldLock, error) { return readLocks(ctx, q, r) }, nil)
	if err != nil {
		return nil, err
	}
	out = inLine(out, r, keys)
	if len(keys) > 0 {
		only := make(map[Key]bool, len(keys))
		for _, k := range keys {
			only[k] = true
		}
		kept := out[:0]
		for _, h := range out {
			if only[h.Key] {
				kept = append(kept, h)
			}
		}
		out = kept
	}
	waiters := map[Key]int{}
	for _, h := range out {
		if !h.Granted {
			waiters[h.Key]++
		}
	}
	for i := range out {
		if out[i].Granted {
			out[i].Waiters = waiters[out[i].Key]
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Key != b.Key {
			return a.Key.less(b.Key)
		}
		if a.Granted != b.Granted {
			return a.Granted
		}
		if !a.Granted && !a.WaitStart.Equal(b.WaitStart) {
			return !a.WaitStart.IsZero() && (b.WaitStart.IsZero() || a.WaitStart.Before(b.WaitStart))
		}
		return a.PID < b.PID
	})
	return out, nil
}

// readLocks runs Inspect's query on q and decodes its rows.
func readLocks(ctx context.Context, q Querier, r *Registry) ([]HeldLock, error) {
	// On a pool or a connection, pgx sends the statement in its simple
	// protocol: behind a transaction pooler, a statement its cache
	// prepared would meet another server session than the one it was
	// prepared on.
	var args []any
	switch c := q.(type) {
	case *sql.DB:
		conn, err := c.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("sqllock: inspect: %w", err)
		}
		defer conn.Close()
		q, args = conn, core.SimpleProtocol(conn)
	case *sql.Conn:
		args = core.SimpleProtocol(c)
	}
	rows, err := q.QueryContext(ctx, sqltext.InspectSQL, args...)
	if err != nil {
		return nil, fmt.Errorf("sqllock: inspect: %w", err)
	}
	defer rows.Close()
	var out []HeldLock
	for rows.Next() {
		var classid, objid int64
		var subid int
		var mode, wait, since, blocked string
		var h HeldLock
		if err := rows.Scan(&classid, &objid, &subid, &mode, &h.Granted, &h.PID, &h.ApplicationName,
			&h.State, &h.Query, &wait, &h.ClientAddr, &since, &blocked); err != nil {
			return nil, fmt.Errorf("sqllock: inspect: %w", err)
		}
		k, ok := keyFromLockTag(pglocks.Tag{Classid: uint32(classid), Objid: uint32(objid), Objsubid: subid})
		if !ok {
			continue
		}
		h.Key = k
		h.Shared = mode == "ShareLock"
		h.Name, _ = r.name(k)
		if sem, slot, ok := r.semaphore(k); ok {
			h.Semaphore, h.Name = sem, fmt.Sprintf("%s[%d]", sem, slot)
		}
		h.Hidden = h.Query == "<insufficient privilege>"
		if wait != "" {
			h.WaitStart, _ = time.Parse(time.RFC3339Nano, wait)
		}
		if since != "" {
			h.Since, _ = time.Parse(time.RFC3339Nano, since)
		}
		h.BlockedBy = parseIntArray(blocked)
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqllock: inspect: %w", err)
	}
	return out, nil
}

// inLine reports the tickets and doorbells of the lines of the keys it
// knows (keys, and those of out) as what they are: a ticket as a waiter
// for its key, since its arrival (the ticket's time), blocked by the key's
// holders of a conflicting mode; a doorbell not at all. A session that
// waits for the key in the server meanwhile is reported once: its row of
// the server's wait, with the ticket's time.
func inLine(out []HeldLock, r *Registry, keys []Key) []HeldLock {
	// A line's key: for a semaphore's line (sem), its slot 0, which stands
	// for the semaphore.
	type lineKey struct {
		k   Key
		sem bool
	}
	lineOf := map[int32]lineKey{}
	add := func(k Key) {
		lineOf[sqltext.TicketClass(k.sqlKey())] = lineKey{k: k}
		if c, _, ok := k.Pair(); ok {
			lineOf[sqltext.SemaphoreTicketClass(c)] = lineKey{k: Pair(c, 0), sem: true}
		}
	}
	for _, k := range keys {
		add(k)
	}
	for _, h := range out {
		if _, ok := lineOf[lineClass(h.Key)]; !ok {
			add(h.Key)
		}
	}
	type waiter struct {
		k   Key
		pid int
	}
	waiting := map[waiter]int{} // the index in out of a session's server wait
	holders := map[Key][]HeldLock{}
	slotHolders := map[int32][]HeldLock{} // by a pair key's class
	for i, h := range out {
		if !h.Granted {
			waiting[waiter{h.Key, h.PID}] = i
			if c, _, ok := h.Key.Pair(); ok {
				waiting[waiter{Pair(c, 0), h.PID}] = i // a semaphore's waiter waits on one of its slots
			}
		} else {
			holders[h.Key] = append(holders[h.Key], h)
			if c, _, ok := h.Key.Pair(); ok {
				slotHolders[c] = append(slotHolders[c], h)
			}
		}
	}
	for i, h := range out {
		if !h.Granted && len(h.BlockedBy) == 0 {
			// Its wait ended between the reads of pg_locks and of
			// pg_blocking_pids (a wait's slice ran out, to be sent again):
			// it waited, as pg_locks read, for those holding its key then.
			out[i].BlockedBy = blockedBy(h, holders[h.Key])
		}
	}
	now := time.Now()
	// ticket returns the key and time of h when it is a ticket or a
	// doorbell of a line.
	ticket := func(h HeldLock) (lk lineKey, at time.Time, ok bool) {
		lk, ok = lineOf[lineClass(h.Key)]
		if !ok || !h.Granted {
			return lineKey{}, time.Time{}, false
		}
		if _, id, _ := h.Key.Pair(); id != 0 {
			at = ticketTime(id, now)
		}
		return lk, at, true // at is zero for a doorbell
	}
	for _, h := range out {
		if lk, at, ok := ticket(h); ok && !at.IsZero() {
			if i, ok := waiting[waiter{lk.k, h.PID}]; ok {
				out[i].WaitStart = at
			}
		}
	}
	kept := out[:0]
	for _, h := range out {
		lk, at, ok := ticket(h)
		k := lk.k
		if !ok {
			if _, line := lineOf[lineClass(h.Key)]; !line || h.Granted {
				kept = append(kept, h)
			} // else a wait for a ticket (the waiter ahead) or a doorbell: its waiter's ticket reports it
			continue
		}
		if at.IsZero() {
			continue // a doorbell
		}
		if _, ok := waiting[waiter{k, h.PID}]; ok {
			continue // its session waits for k in the server: reported once
		}
		h.Key, h.Granted, h.WaitStart = k, false, at
		h.Name, _ = r.name(k)
		h.Semaphore = ""
		if sem, slot, ok := r.semaphore(k); ok && lk.sem {
			h.Semaphore, h.Name = sem, fmt.Sprintf("%s[%d]", sem, slot)
		}
		blockers := holders[k]
		if lk.sem {
			c, _, _ := k.Pair()
			blockers = slotHolders[c]
		}
		h.BlockedBy = blockedBy(h, blockers)
		kept = append(kept, h)
	}
	return kept
}

// blockedBy returns the pids of those of holders, other than h's session,
// whose mode conflicts with h's.
func blockedBy(h HeldLock, holders []HeldLock) []int {
	var pids []int
	for _, o := range holders {
		if (!h.Shared || !o.Shared) && o.PID != 0 && o.PID != h.PID && !slices.Contains(pids, o.PID) {
			pids = append(pids, o.PID)
		}
	}
	return pids
}

// ticketTime returns the time a ticket of id was taken: id is the server's
// clock in milliseconds, modulo 2^32 (about 50 days), near now.
func ticketTime(id int32, now time.Time) time.Time {
	ms := now.UnixMilli()
	d := int64(int32(uint32(id) - uint32(ms))) // id - now, modulo 2^32, signed
	return time.UnixMilli(ms + d)
}

// lineClass returns the pair class of k, which may be a line's ticket
// class, or 0 for a bigint key.
func lineClass(k Key) int32 {
	c, _, ok := k.Pair()
	if !ok {
		return 0
	}
	return c
}

// parseIntArray reads PostgreSQL's text form of an int[] such as "{1,2}".
func parseIntArray(s string) []int {
	s = strings.Trim(s, "{}")
	if s == "" {
		return nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		if v, err := strconv.Atoi(strings.TrimSpace(f)); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// String describes the lock on one line: key (and name), mode, state, and
// the session, as in "key 42 "cron:x" exclusive held by pid 1234 (app,
// idle)" or "... waiting since 15:04:05.000 by pid 1235 (app, active),
// blocked by [1234]".
func (h HeldLock) String() string {
	var b strings.Builder
	b.WriteString("key " + h.Key.String())
	if h.Name != "" {
		b.WriteString(" " + strconv.Quote(h.Name))
	}
	if h.Shared {
		b.WriteString(" shared")
	} else {
		b.WriteString(" exclusive")
	}
	if h.Granted {
		b.WriteString(" held")
	} else {
		b.WriteString(" waiting")
		if !h.WaitStart.IsZero() {
			b.WriteString(" since " + h.WaitStart.Format("15:04:05.000"))
		}
	}
	b.WriteString(" by " + h.holder())
	return b.String()
}

// holder describes the session of the lock and its hold, as the end of
// String: "pid 1234 (application "app", idle) from ADDR since 15:04:05, 2
// waiting", "pid 1235 (...), blocked by [1234]".
func (h HeldLock) holder() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pid %d", h.PID)
	var about []string
	if h.ApplicationName != "" {
		about = append(about, "application "+strconv.Quote(h.ApplicationName))
	}
	if h.State != "" {
		about = append(about, h.State)
	}
	if h.Hidden {
		about = append(about, "a session of another role")
	}
	if len(about) > 0 {
		b.WriteString(" (" + strings.Join(about, ", ") + ")")
	}
	if h.ClientAddr != "" {
		fmt.Fprintf(&b, " from %s", h.ClientAddr)
	}
	if h.Granted && !h.Since.IsZero() {
		fmt.Fprintf(&b, " since %s", h.Since.Format("15:04:05"))
	}
	if h.Waiters > 0 {
		fmt.Fprintf(&b, ", %d waiting", h.Waiters)
	}
	if len(h.BlockedBy) > 0 {
		fmt.Fprintf(&b, ", blocked by %v", h.BlockedBy)
	}
	return b.String()
}
