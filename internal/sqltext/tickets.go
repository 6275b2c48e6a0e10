package sqltext

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Tickets: first come, first served among the waiters of every process,
// from advisory locks alone. A waiter for a key registers its arrival by
// taking a ticket: an advisory lock on the pair key (class, id), where
// class is the key's ticket class (TicketClass) and id the server's clock
// in milliseconds (modulo 2^32, compared with wrap-around; 0 is never a
// ticket), taken exclusively by a writer and shared by a reader. It also
// rings the key's doorbell, the pair key (class, 0) taken shared, for as
// long as it waits, so that a holder can learn in one lock-manager call
// whether anyone waits (DoorbellSQL). Then it waits only for its
// predecessor, the latest earlier ticket (for a reader, the latest
// earlier writer's), and, when it has none, for the key itself, in
// statements shorter than half the server's deadlock_timeout (SliceSQL):
// so at most one waiter waits on the key, and no waiter holds a snapshot
// for longer than a slice, which a holder's CREATE INDEX CONCURRENTLY
// would wait for. Granted, it gives its ticket and its doorbell back in
// the same statement; giving up, it gives them back (LeaveLineSQL), or its
// session ends, which gives back everything it held. A waiter rings the
// doorbell for as long as it holds a ticket: a backend that holds a
// ticket without ringing is a stranger, whose ticket is no predecessor.

// TicketClass returns the ticket class of k: a 31-bit hash of it, with
// the top bit set (a negative int4, as a semaphore's class has).
//
// The library's own locks are pair keys in such negative classes: a
// semaphore's slots (class, 0..N-1), and each line's doorbell (class, 0)
// and tickets (class, id ≠ 0), where class is TicketClass of the key or
// SemaphoreTicketClass of the semaphore. Users' pair keys belong in
// classes from 0 up. A stranger that holds a line's tags anyway costs the
// line its order, not its progress: a ticket whose backend does not ring
// the doorbell is no predecessor (SliceSQL), a doorbell held exclusively
// is silent (PoliteTrySQL, DoorbellSQL), and a waiter that cannot ring it
// or finds no ticket free waits without one (RegisterSQL).
func TicketClass(k Key) int32 {
	h := fnv.New32a()
	var b [9]byte
	if k.Pair {
		b[0] = 2
		putInt32(b[1:], k.Class)
		putInt32(b[5:], k.ID)
	} else {
		b[0] = 1
		for i := range 8 {
			b[1+i] = byte(uint64(k.V) >> (8 * i))
		}
	}
	h.Write(b[:])
	return int32(h.Sum32() | 1<<31)
}

// SemaphoreTicketClass returns the ticket class of the semaphore whose
// slots have the pair class class.
func SemaphoreTicketClass(class int32) int32 {
	h := fnv.New32a()
	var b [5]byte
	b[0] = 3
	putInt32(b[1:], class)
	h.Write(b[:])
	return int32(h.Sum32() | 1<<31)
}

func putInt32(b []byte, v int32) {
	for i := range 4 {
		b[i] = byte(uint32(v) >> (8 * i))
	}
}

// signed32 is the SQL of x, an int8 expression of an oid or an int4, as a
// signed 32-bit value (for ticket ids, which wrap around).
func signed32(x string) string {
	return "((((" + x + ") + 2147483648) & 4294967295) - 2147483648)"
}

// tagOf is the SQL that selects, in pg_locks l, the rows of the advisory
// lock whose tag is ($kc, $ko, $ks) (int8, int8, int4).
func tagOf(kc, ko, ks string) string {
	return "l.classid::int8 = " + kc + "::int8 AND l.objid::int8 = " + ko + "::int8 AND l.objsubid = " + ks + "::int4"
}

// currentDB selects the current database's rows of pg_locks l.
const currentDB = "l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())"

// silent returns the SQL that reports whether the doorbell of the line
// of ticket class c (an int4 expression) is silent: nobody holds it in
// shared mode, as a registered waiter does. It first takes the doorbell
// exclusively for a moment, which fails while any waiter rings it; only
// when that fails does it read pg_locks, for the doorbell may be held
// exclusively by a program that knows nothing of the line (its own pair
// keys in a negative class), or, for a moment, by a holder asking this
// very question: neither is a waiter.
func silent(c string) string {
	return "CASE WHEN pg_try_advisory_lock(" + c + ", 0) THEN pg_advisory_unlock(" + c + ", 0)" +
		" ELSE NOT EXISTS (SELECT FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ShareLock'" +
		" AND l.classid::int8 = (" + c + "::int8 & 4294967295) AND l.objid = 0 AND l.objsubid = 2 AND " + currentDB + ") END"
}

// registered is the SQL of a window column, over rows l of pg_locks of
// the line of ticket class c, that says whether l's backend is a
// registered waiter of the line: one that rings its doorbell (holds it in
// shared mode). A backend that holds a ticket without ringing the
// doorbell is a stranger (a program that uses the line's class for keys
// of its own), and its ticket no predecessor.
func registered(c string) string {
	return "coalesce(bool_or(l.classid::int8 = (" + c + "::int8 & 4294967295) AND l.objsubid = 2 AND l.objid = 0 AND l.mode = 'ShareLock') OVER (PARTITION BY l.pid), false)"
}

// release returns the SQL with which a waiter gives back its ticket me
// (0: it has none; in mode shared) of class c when its session holds it
// (held, a boolean expression: a place taken on another of its Pool's
// sessions is given back there; see PlaceSQL) and, when it holds it
// (bell), its doorbell: true when what it holds went.
func release(shared bool, c, me, held, bell string) string {
	return "(CASE WHEN " + me + " = 0 OR NOT " + held + " THEN true ELSE " + unlockFn(shared, c+", "+me) + " END AND CASE WHEN " + bell + " THEN " + unlockFn(true, c+", 0") + " ELSE true END)"
}

// lockFn returns the call of the session-level lock function of kind (Try,
// Shared) on args.
func lockFn(kind Kind, args string) string { return kind.Fn() + "(" + args + ")" }

// unlockFn returns the call of the unlock function (shared or not) on
// args.
func unlockFn(shared bool, args string) string { return UnlockFn(shared) + "(" + args + ")" }

// RegisterSQL returns the statement with which a waiter for a key of
// ticket class class registers (a reader when shared), on a session marked
// mark (see Statements): within lock_timeout slice (the doorbell can wait,
// a moment, for a holder's DoorbellSQL), it rings the doorbell, takes the
// first free ticket from the server's clock on, and applies the lock
// session's settings: its name, and what bounds an orphan (a waiter whose
// client froze or was cut off leaves the line as the server ends its
// session). A waiter that gives up sets them back (LeaveLineSQL). Its single row is
// (ticket, 0 when none was free; pid; in_recovery; whether the mark
// allowed it: false means it took nothing). When ring is false it takes
// nothing, and only applies the settings: a waiter that bypasses the line
// (its doorbell is held by a stranger; see waitInLine) registers so, and
// waits without a ticket. With ring, a ticket of 0 means that the
// doorbell rings but no ticket was free: the waiter waits without one.
func (s *Statements) RegisterSQL(class int32, shared bool, slice, mark string, ring bool) (string, []any) {
	c := "$1::int4"
	var b strings.Builder
	b.WriteString(markLine + "SELECT coalesce(t.id, 0), pg_backend_pid(), pg_is_in_recovery(), s.v IS NOT NULL")
	b.WriteString(" FROM (SELECT $3::text AS m OFFSET 0) AS o")
	set := "concat(set_config('lock_timeout', $2::text, true), " + s.tune + ")"
	b.WriteString(" CROSS JOIN LATERAL (SELECT CASE WHEN " + s.gate + " THEN " + set + " END AS v OFFSET 0) AS s")
	b.WriteString(" LEFT JOIN LATERAL (SELECT " + lockFn(Shared, c+", 0") + " IS NOT NULL AS bell WHERE s.v IS NOT NULL AND $4::bool OFFSET 0) AS d ON true")
	b.WriteString(" LEFT JOIN LATERAL (SELECT " + signed32("floor(extract(epoch FROM clock_timestamp()) * 1000)::int8") + " AS base WHERE d.bell OFFSET 0) AS b ON true")
	b.WriteString(" LEFT JOIN LATERAL (SELECT c.i::int4 AS id FROM (SELECT " + signed32("b.base + g") + " AS i FROM generate_series(0, 63) AS g OFFSET 0) AS c")
	b.WriteString(" WHERE c.i <> 0 AND " + lockFn(Try|SharedKind(shared), c+", c.i::int4") + " LIMIT 1) AS t ON true")
	return s.mode.params(b.String(), int64(class), slice, mark, ring)
}

// SliceSQL returns one slice of a registered waiter's wait for k (kind:
// exclusive or Shared), its ticket mine of class class, on a session marked
// mark, for at most lock_timeout slice: it reads pg_locks for the key and
// its tickets, and then, when the session holds k already (granted as the
// last slice's lock_timeout fired), or when no earlier ticket is left and
// it is granted k, it gives its ticket and its doorbell back (answering
// true; the lock session's settings are the session's since its
// registration: see RegisterSQL); when an earlier ticket is left, it waits for it to go (answering false: look again). It also
// gives back tickets of its own left from before. Its single row is
// (0 when granted, -1 when not: look again; pid, in_recovery, the number
// of other tickets of the class, whether the session held k already as
// the slice began);
// no row on a session of another mark; error 55P03 when the slice ends.
func (s *Statements) SliceSQL(kind Kind, k Key, class, mine int32, slice, mark string) (string, []any) {
	shared := kind.IsShared()
	kc, ko, ks := tagArgs(k)
	c, me := "$1::int4", "$2::int4"
	mode := "ExclusiveLock"
	if shared {
		mode = "ShareLock"
	}
	readerFilter := ""
	if shared {
		readerFilter = " AND l.mode = 'ExclusiveLock'"
	}
	release := release(shared, c, me, "x.held", "x.bell")
	keyArgs, keyVals := s.mode.keyArgsAt(k, 8)
	var b strings.Builder
	s.sliceHead(&b, "CASE WHEN r.granted THEN 0 ELSE -1 END", "x.have")
	b.WriteString(" coalesce(bool_or(l.iskey AND l.mine AND l.mode = '" + mode + "'), false) AS have,")
	b.WriteString(" coalesce(bool_or(NOT l.iskey AND l.mine AND l.id = 0 AND l.mode = 'ShareLock'), false) AS bell,")
	b.WriteString(" coalesce(bool_or(NOT l.iskey AND l.mine AND l.id = " + me + " AND l.id <> 0), false) AS held,")
	b.WriteString(" count(CASE WHEN l.mode = 'ShareLock' THEN " + unlockFn(true, c+", l.id") + " ELSE " + unlockFn(false, c+", l.id") + " END)")
	b.WriteString(" FILTER (WHERE NOT l.iskey AND l.mine AND l.id NOT IN (" + me + ", 0)) AS stale,")
	b.WriteString(" (array_agg(l.id ORDER BY l.d DESC) FILTER (WHERE NOT l.iskey AND NOT l.mine AND l.reg AND l.id <> 0 AND " + me + " <> 0 AND l.d < 0" + readerFilter + "))[1] AS pred,")
	b.WriteString(" count(*) FILTER (WHERE NOT l.iskey AND NOT l.mine AND l.id <> 0) AS others")
	b.WriteString(" FROM (SELECT " + tagOf("$5", "$6", "$7") + " AS iskey, l.pid = pg_backend_pid() AS mine, l.mode, " + registered(c) + " AS reg,")
	b.WriteString(" " + signed32("l.objid::int8") + "::int4 AS id, " + signed32("l.objid::int8 - ("+me+"::int8 & 4294967295)") + " AS d")
	b.WriteString(" FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND " + currentDB)
	b.WriteString(" AND ((l.classid::int8 = (" + c + "::int8 & 4294967295) AND l.objsubid = 2) OR " + tagOf("$5", "$6", "$7") + ")")
	b.WriteString(" AND s.v IS NOT NULL) AS l) AS x")
	b.WriteString(" CROSS JOIN LATERAL (SELECT CASE")
	b.WriteString(" WHEN x.have THEN " + release)
	b.WriteString(" WHEN x.pred IS NULL THEN " + lockFn(kind&^Try, keyArgs) + " IS NOT NULL AND " + release)
	b.WriteString(" ELSE NOT (" + lockFn(kind&^Try, c+", x.pred") + " IS NOT NULL AND " + unlockFn(shared, c+", x.pred") + ")")
	b.WriteString(" END AS granted WHERE s.v IS NOT NULL OFFSET 0) AS r")
	vals := append([]any{int64(class), int64(mine), slice, mark, kc, ko, ks}, keyVals...)
	return s.mode.params(b.String(), vals...)
}

// sliceHead writes the beginning of a slice statement (SliceSQL,
// SemaphoreSliceSQL): its select list, granted and late its first and last
// columns, then its mark ($4), its lock_timeout ($3, with what a waiting
// session shows) under the mark's condition, and the start of the
// subquery that reads pg_locks.
func (s *Statements) sliceHead(b *strings.Builder, granted, late string) {
	set := "set_config('lock_timeout', $3::text, true)"
	if s.waiting != "" {
		set = "concat(" + set + ", " + s.waiting + ")"
	}
	b.WriteString(markWait + "SELECT " + granted + ", pg_backend_pid(), pg_is_in_recovery(), x.others, " + late)
	b.WriteString(" FROM (SELECT $4::text AS m OFFSET 0) AS o")
	b.WriteString(" CROSS JOIN LATERAL (SELECT CASE WHEN " + s.gate + " THEN " + set + " END AS v OFFSET 0) AS s")
	b.WriteString(" CROSS JOIN LATERAL (SELECT")
}

// LeaveLineSQL returns the statement with which a registered waiter for k
// (its ticket class class), on a session marked mark, that gives up takes
// itself out of the line: it gives back every ticket and doorbell of the
// class its session holds. Its single row is (0 when the session holds k
// in kind's mode: granted as its last slice's lock_timeout fired, else -1; pid; the
// locks given back; the settings' text, applied when it holds k, and
// otherwise set back).
func (s *Statements) LeaveLineSQL(kind Kind, k Key, class int32, mark string) (string, []any) {
	kc, ko, ks := tagArgs(k)
	mode := "ExclusiveLock"
	if kind.IsShared() {
		mode = "ShareLock"
	}
	c := "$1::int4"
	q := markLine + "SELECT CASE WHEN x.have THEN 0 ELSE -1 END, pg_backend_pid(), x.released, CASE WHEN x.have THEN " + s.tune + " ELSE " + s.untune + " END" +
		" FROM (SELECT $5::text AS m OFFSET 0) AS o CROSS JOIN LATERAL (SELECT" +
		" coalesce(bool_or(" + tagOf("$2", "$3", "$4") + " AND l.mode = '" + mode + "'), false) AS have," +
		" count(CASE WHEN l.mode = 'ShareLock' THEN " + unlockFn(true, c+", "+signed32("l.objid::int8")+"::int4") +
		" ELSE " + unlockFn(false, c+", "+signed32("l.objid::int8")+"::int4") + " END) FILTER (WHERE l.objsubid = 2 AND l.classid::int8 = (" + c + "::int8 & 4294967295)) AS released" +
		" FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_backend_pid()" +
		" AND ((l.classid::int8 = (" + c + "::int8 & 4294967295) AND l.objsubid = 2) OR " + tagOf("$2", "$3", "$4") + ")) AS x"
	return s.mode.params(q, int64(class), kc, ko, ks, mark)
}

// SemaphoreSliceSQL is SliceSQL for a waiter for a permit of the
// semaphore whose n slots have the pair class slots (its ticket class
// class): with no earlier ticket left, it takes the first free slot, or,
// with none free, waits for slot wait (the caller picks one at random)
// for the slice. Its single row is SliceSQL's, but for the first column:
// the slot granted, or -1 (look again).
func (s *Statements) SemaphoreSliceSQL(class, mine, slots int32, n int, wait int32, slice, mark string) (string, []any) {
	c, me, sc := "$1::int4", "$2::int4", "$5::int4"
	release := release(false, c, me, "x.held", "x.bell")
	var b strings.Builder
	s.sliceHead(&b, "r.slot", "x.have IS NOT NULL")
	b.WriteString(" min(l.id) FILTER (WHERE l.isslot AND l.mine) AS have,")
	b.WriteString(" coalesce(bool_or(NOT l.isslot AND l.mine AND l.id = 0 AND l.mode = 'ShareLock'), false) AS bell,")
	b.WriteString(" coalesce(bool_or(NOT l.isslot AND l.mine AND l.id = " + me + " AND l.id <> 0), false) AS held,")
	b.WriteString(" count(" + unlockFn(false, c+", l.id") + ") FILTER (WHERE NOT l.isslot AND l.mine AND l.id NOT IN (" + me + ", 0)) AS stale,")
	b.WriteString(" (array_agg(l.id ORDER BY l.d DESC) FILTER (WHERE NOT l.isslot AND NOT l.mine AND l.reg AND l.id <> 0 AND " + me + " <> 0 AND l.d < 0))[1] AS pred,")
	b.WriteString(" count(*) FILTER (WHERE NOT l.isslot AND NOT l.mine AND l.id <> 0) AS others")
	b.WriteString(" FROM (SELECT l.classid::int8 = (" + sc + "::int8 & 4294967295) AS isslot, l.pid = pg_backend_pid() AS mine, l.mode, " + registered(c) + " AS reg,")
	b.WriteString(" " + signed32("l.objid::int8") + "::int4 AS id, " + signed32("l.objid::int8 - ("+me+"::int8 & 4294967295)") + " AS d")
	b.WriteString(" FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND " + currentDB)
	b.WriteString(" AND l.classid::int8 IN ((" + c + "::int8 & 4294967295), (" + sc + "::int8 & 4294967295))")
	b.WriteString(" AND (l.classid::int8 <> (" + sc + "::int8 & 4294967295) OR l.pid = pg_backend_pid())")
	b.WriteString(" AND s.v IS NOT NULL) AS l) AS x")
	b.WriteString(" CROSS JOIN LATERAL (SELECT CASE")
	b.WriteString(" WHEN x.have IS NOT NULL THEN CASE WHEN " + release + " THEN x.have END")
	b.WriteString(" WHEN x.pred IS NULL THEN (SELECT CASE WHEN t.slot >= 0 AND " + release + " THEN t.slot END")
	b.WriteString(" FROM (SELECT CASE")
	for i := range n {
		b.WriteString(" WHEN pg_try_advisory_lock(" + sc + ", " + strconv.Itoa(i) + ") THEN " + strconv.Itoa(i))
	}
	b.WriteString(" WHEN pg_advisory_lock(" + sc + ", $6::int4) IS NOT NULL THEN $6::int4 END AS slot OFFSET 0) AS t)")
	b.WriteString(" ELSE CASE WHEN " + lockFn(0, c+", x.pred") + " IS NOT NULL AND " + unlockFn(false, c+", x.pred") + " THEN -1 END")
	b.WriteString(" END AS slot WHERE s.v IS NOT NULL OFFSET 0) AS r")
	return s.mode.params(b.String(), int64(class), int64(mine), slice, mark, int64(slots), int64(wait))
}

// SemaphoreLeaveLineSQL is LeaveLineSQL for a waiter for a permit of the
// semaphore whose slots have the pair class slots: the first column is
// the slot its session holds (granted as its last slice's lock_timeout
// fired), or -1.
func (s *Statements) SemaphoreLeaveLineSQL(class, slots int32, mark string) (string, []any) {
	c, sc := "$1::int4", "$2::int4"
	id := signed32("l.objid::int8") + "::int4"
	isTicket := "l.classid::int8 = (" + c + "::int8 & 4294967295)"
	q := markLine + "SELECT coalesce(x.have, -1), pg_backend_pid(), x.released, CASE WHEN x.have IS NOT NULL THEN " + s.tune + " ELSE " + s.untune + " END" +
		" FROM (SELECT $3::text AS m OFFSET 0) AS o CROSS JOIN LATERAL (SELECT" +
		" min(" + id + ") FILTER (WHERE NOT " + isTicket + ") AS have," +
		" count(CASE WHEN l.mode = 'ShareLock' THEN " + unlockFn(true, c+", "+id) + " ELSE " + unlockFn(false, c+", "+id) + " END) FILTER (WHERE " + isTicket + ") AS released" +
		" FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = pg_backend_pid() AND l.objsubid = 2" +
		" AND l.classid::int8 IN ((" + c + "::int8 & 4294967295), (" + sc + "::int8 & 4294967295))) AS x"
	return s.mode.params(q, int64(class), int64(slots), mark)
}

// SemaphorePoliteTrySQL is SemaphoreTrySQL for a call that will wait when
// every slot is held: it takes a slot only when no one waits in the
// semaphore's line (its ticket class class). Its parameters are $1, the
// mark (render it with Mode.Arrays), and the row is SemaphoreTrySQL's.
func (s *Statements) SemaphorePoliteTrySQL(slots int32, n int, class int32) string {
	q := s.SemaphoreTrySQL(slots, n)
	bell := strconv.Itoa(int(class))
	return strings.Replace(q, "THEN -2", "THEN -2 WHEN NOT ("+silent(bell)+") THEN -1", 1)
}

// TerminateHolderSQL ends backend $1 when it holds the advisory lock
// whose tag is ($2, $3, $4): a connection abandoned as its wait was
// granted, whose lock must go before the call that gave it up returns.
// Its single row is whether it did.
const TerminateHolderSQL = markCancel + `SELECT coalesce(bool_or(pg_terminate_backend(l.pid)), false) FROM pg_catalog.pg_locks l
 WHERE l.locktype = 'advisory' AND l.granted AND l.pid = $1::int4 AND ` + currentDB + ` AND l.classid::int8 = $2::int8 AND l.objid::int8 = $3::int8 AND l.objsubid = $4::int4`

// DiscardHolderArgs returns TerminateHolderSQL's arguments.
func DiscardHolderArgs(pid int64, k Key) []any {
	c, o, sub := tagArgs(k)
	return []any{pid, c, o, sub}
}

// tagArgs returns k's lock tag as SliceSQL and LeaveLineSQL take it.
func tagArgs(k Key) (classid, objid int64, objsubid int64) {
	if k.Pair {
		return int64(uint32(k.Class)), int64(uint32(k.ID)), 2
	}
	return int64(uint64(k.V) >> 32), int64(uint32(k.V)), 1
}

// keyArgsAt returns the argument list of k for a lock function, its
// parameters numbered from first.
func (m Mode) keyArgsAt(k Key, first int) (string, []any) {
	if k.Pair {
		return "$" + strconv.Itoa(first) + "::int4, $" + strconv.Itoa(first+1) + "::int4", []any{int64(k.Class), int64(k.ID)}
	}
	return "$" + strconv.Itoa(first) + "::int8", []any{k.V}
}

// params returns q, whose parameters $1, $2, ... are vals (integers,
// booleans and text of this package's own making: numbers, durations,
// owner marks), bound, or, in Inline mode, rendered into the text.
func (m Mode) params(q string, vals ...any) (string, []any) {
	if m != Inline {
		return q, vals
	}
	for i := len(vals); i >= 1; i-- { // $10 before $1
		var lit string
		switch v := vals[i-1].(type) {
		case int64:
			lit = "(" + strconv.FormatInt(v, 10) + ")"
		case bool:
			lit = strconv.FormatBool(v)
		case string:
			lit = "'" + strings.ReplaceAll(v, "'", "''") + "'"
		}
		q = strings.ReplaceAll(q, "$"+strconv.Itoa(i)+"::", lit+"::")
	}
	return q, nil
}

// DoorbellSQL returns the statement with which the session that holds a
// key asks, on backend pid, whether anyone waits for it (with a ticket)
// before the next waiter of the holder's own Pool: one row per class of
// classes, (class, ticket, whether it rings), and no row on another
// backend. tickets, by position, are those next waiters' tickets: 0 asks
// whether the doorbell rings at all (it takes the doorbell exclusively
// for a moment, which fails while any waiter rings it); a ticket asks
// whether a registered waiter holds an earlier one (see earlier).
func (m Mode) DoorbellSQL(pid int64, classes, tickets []int32) (string, []any) {
	q := markLine + "SELECT u.c, u.t, CASE WHEN u.t = 0 THEN NOT (" + silent("u.c") + ") ELSE " + earlier("u.c", "u.t") + " END" +
		" FROM unnest($1::text::int4[], $3::text::int4[]) AS u(c, t) WHERE pg_backend_pid() = $2::int4"
	cs, ts := int4Array(classes), int4Array(tickets)
	if m == Inline {
		q = strings.Replace(q, "$1::text", "'"+cs+"'::text", 1)
		q = strings.Replace(q, "$3::text", "'"+ts+"'::text", 1)
		return strings.Replace(q, "$2::int4", strconv.FormatInt(pid, 10)+"::int4", 1), nil
	}
	return q, []any{cs, pid, ts}
}

// int4Array is vs as the text of an int4[].
func int4Array(vs []int32) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(v)))
	}
	b.WriteByte('}')
	return b.String()
}

// earlier returns the SQL that reports whether a registered waiter of the
// line of ticket class c (an int4 expression) holds a ticket earlier than
// t (an int4 expression, compared with wrap-around): one that rings the
// doorbell, as any waiter's session, or the session that holds its place
// (PlaceSQL), does.
func earlier(c, t string) string {
	return "EXISTS (SELECT FROM pg_catalog.pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2" +
		" AND l.classid::int8 = (" + c + "::int8 & 4294967295) AND l.objid <> 0 AND " + currentDB +
		" AND " + signed32("l.objid::int8 - ("+t+"::int8 & 4294967295)") + " < 0" +
		" AND EXISTS (SELECT FROM pg_catalog.pg_locks r WHERE r.locktype = 'advisory' AND r.granted AND r.pid = l.pid" +
		" AND r.mode = 'ShareLock' AND r.classid = l.classid AND r.objid = 0 AND r.objsubid = 2 AND r.database = l.database))"
}

// PlaceSQL returns the statement with which a waiter queued in its Pool
// behind the head of its queue takes its place in the line of ticket
// class class (a reader's when shared) at once, on one of the Pool's
// sessions (backend pid), rather than when it becomes the head: it rings
// the doorbell and takes the first free ticket from the server's clock
// on, as RegisterSQL does, without waiting (a doorbell held exclusively
// is a stranger's, or, for a moment, a holder's: the waiter then has no
// place); from floor on instead (0: none), when floor is later than the
// clock. The Pool's floor is the ticket of the caller queued just ahead
// plus one, so that its callers' tickets follow its queue's order: when
// waiters come faster than one a millisecond, the line's tickets run
// ahead of the clock, and one given back leaves a free ticket there,
// earlier than tickets taken before it; a caller queued behind the head
// that took it would be the head's predecessor, while it waits for the
// head. Its single row is the ticket (0: none was taken, the doorbell
// given back; PlaceKeptBell: the doorbell could not be given back); no
// row on another backend. The waiter, once the head, slices with that ticket
// (SliceSQL), which its own session never holds; the place is given back
// with PlaceBackSQL.
func (m Mode) PlaceSQL(class int32, shared bool, pid int64, floor int32) (string, []any) {
	c := "$1::int4"
	const now = "floor(extract(epoch FROM clock_timestamp()) * 1000)::int8"
	var b strings.Builder
	b.WriteString(markLine + "SELECT CASE WHEN t.id IS NOT NULL THEN t.id::int8 WHEN NOT d.bell THEN 0")
	b.WriteString(" WHEN " + unlockFn(true, c+", 0") + " THEN 0 ELSE " + strconv.FormatInt(PlaceKeptBell, 10) + " END")
	b.WriteString(" FROM (SELECT " + lockFn(Try|Shared, c+", 0") + " AS bell WHERE pg_backend_pid() = $2::int4 OFFSET 0) AS d")
	b.WriteString(" LEFT JOIN LATERAL (SELECT CASE WHEN $3::int4 <> 0 AND " + signed32("$3::int8 - "+now) + " > 0 THEN $3::int8 ELSE " + signed32(now) + " END AS base WHERE d.bell OFFSET 0) AS b ON true")
	b.WriteString(" LEFT JOIN LATERAL (SELECT c.i::int4 AS id FROM (SELECT " + signed32("b.base + g") + " AS i FROM generate_series(0, 63) AS g OFFSET 0) AS c")
	b.WriteString(" WHERE c.i <> 0 AND " + lockFn(Try|SharedKind(shared), c+", c.i::int4") + " LIMIT 1) AS t ON true")
	return m.params(b.String(), int64(class), pid, int64(floor))
}

// PlaceKeptBell is PlaceSQL's answer when it took no ticket and could not
// give its doorbell back: outside the int4 range of tickets, which are
// negative half the time (the clock in milliseconds, modulo 2^32, read
// as a signed int4: from 2^31 on, for 24.8 days of every 49.7).
const PlaceKeptBell = -1 << 32

// PlaceBackSQL returns the statement with which a place in the line of
// ticket class class, its ticket id (a reader's when shared), held on
// backend pid, is given back: its ticket and one hold of the doorbell,
// each tried whatever the other's answer. Its single row is how many of
// the two went (2: the place was held); no row on another backend.
func (m Mode) PlaceBackSQL(class, id int32, shared bool, pid int64) (string, []any) {
	c := "$1::int4"
	q := markLine + "SELECT ((" + unlockFn(shared, c+", $2::int4") + ")::int4 + (" + unlockFn(true, c+", 0") + ")::int4)::int8" +
		" WHERE pg_backend_pid() = $3::int4"
	return m.params(q, int64(class), int64(id), pid)
}

// PoliteTrySQL is TrySQL for a call that will wait when the key is held:
// it takes the key only when no one waits in the line of its ticket
// class (the doorbell is silent), so that it never passes a waiter who is,
// for a moment, between two slices of its wait. Its single row is
// TrySQL's (Plain's: its first column only).
func (s *Statements) PoliteTrySQL(kind Kind, k Key, class int32, mark string) (string, []any) {
	keyArgs, keyVals := s.mode.keyArgsAt(k, 3)
	if s.plain() { // as TrySQL's
		q := markTry + "SELECT CASE WHEN " + sessionMark + " = $2::text THEN (" + silent("$1::int4") + ") AND " +
			lockFn(kind|Try, keyArgs) + " END"
		return s.mode.params(q, append([]any{int64(class), mark}, keyVals...)...)
	}
	q := markTry + "SELECT CASE WHEN " + s.gate + " THEN CASE WHEN (" + silent("$1::int4") + ") AND " +
		lockFn(kind|Try, keyArgs) + " THEN " + s.tune + " IS NOT NULL ELSE false END END, pg_backend_pid(), pg_is_in_recovery()" +
		" FROM (SELECT $2::text AS m OFFSET 0) AS o"
	return s.mode.params(q, append([]any{int64(class), mark}, keyVals...)...)
}

// BackendSQL answers who runs it: (pid, backend start in microseconds
// since the epoch). The transaction pooler probe compares two client
// connections' answers, and one connection's answers over time: a direct
// connection has a backend of its own, for its whole life.
var BackendSQL = markCheck + `SELECT pg_backend_pid(), coalesce((SELECT ` + micros("a.backend_start") + ` FROM pg_catalog.pg_stat_get_activity(pg_backend_pid()) AS a), 0)`

// StrandedSQL ends backend $1, started at $2 (microseconds since the
// epoch, as VersionSQL reads it; 0: any start), when it holds an advisory
// lock in the current database (with key, the lock whose tag is ($3,
// $4, $5)) while idle, outside any transaction: a session-level lock on a
// server session that a transaction pooler hands to other clients, which
// the client connection that took it can no longer reach. A backend in a
// transaction is left alone (the lock it shows may be that transaction's
// own); the statement is asked again once it is idle. Its single row is 1
// when it ended the backend, 0 when there is nothing to end (no such
// backend, or no such lock), and 2 when the backend is busy.
func StrandedSQL(key bool) string {
	lock := "l.locktype = 'advisory' AND l.granted AND l.pid = a.pid AND " + currentDB
	if key {
		lock += " AND l.classid::int8 = $3::int8 AND l.objid::int8 = $4::int8 AND l.objsubid = $5::int4"
	}
	return markFree + `SELECT coalesce(max(CASE WHEN NOT EXISTS (SELECT FROM pg_catalog.pg_locks l WHERE ` + lock + `) THEN 0
 WHEN a.state = 'idle' OR a.pid = pg_backend_pid() THEN CASE WHEN pg_terminate_backend(a.pid) THEN 1 ELSE 0 END
 ELSE 2 END), 0)::int8 FROM pg_catalog.pg_stat_get_activity($1::int4) AS a
 WHERE $2::int8 = 0 OR (extract(epoch FROM a.backend_start) * 1000000)::int8 = $2::int8`
}

// StrandedArgs returns StrandedSQL's arguments: of backend pid, started
// at start, holding any advisory lock, or k when key is set.
func StrandedArgs(pid, start int64, key bool, k Key) []any {
	if !key {
		return []any{pid, start}
	}
	c, o, sub := tagArgs(k)
	return []any{pid, start, c, o, sub}
}
