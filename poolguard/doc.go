// Package poolguard wraps a database/sql driver.Connector so that no
// PostgreSQL advisory lock rides back into the connection pool.
//
// A session-level advisory lock belongs to the database session. Taken
// through a pool, with db.Exec("SELECT pg_advisory_lock(1)"), it stays on
// whichever connection ran the statement; database/sql puts that connection
// back in the pool, still holding the lock, and hands it to the next caller.
// The lock then blocks everyone, or is "re-taken" re-entrantly by a stranger.
//
// The guard checks connections as they come back: database/sql calls
// driver.Validator.IsValid synchronously as it returns a connection to the
// pool, and the guard's IsValid asks pg_locks, on that very session, whether
// it holds any advisory lock. Only "dirty" connections are checked: those
// whose statements mentioned an advisory function since their last check,
// those that prepared such a statement, and those whose last call ended with
// its context already done (the driver may have been granted a lock it never
// reported). Clean traffic costs a string scan per statement and nothing
// else.
//
// What happens to a leaking connection is the [Policy]: [Discard] (the
// default) closes it, so PostgreSQL frees its locks as the session ends;
// [UnlockAll] runs pg_advisory_unlock_all() and keeps it; [Report] only
// reports. [WithOnLeak] is called for every leak, whatever the policy. A check
// that fails or times out counts as a leak.
//
// What it cannot see: a lock taken by a stored function or a DO block whose
// call text does not mention an advisory function; use [WithCheckAlways] for
// those. It does not look at transaction-level locks, which PostgreSQL
// releases when the transaction ends.
//
// Locks held through the sqllock package cost nothing here: sqllock runs its
// own statements through [Conn.WithoutGuard], since it already returns a
// connection only after a confirmed unlock. A connection a Session handed
// out (Session.Conn) is closed, not pooled, when the Session closes.
package poolguard
