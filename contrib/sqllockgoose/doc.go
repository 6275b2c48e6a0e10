// Package sqllockgoose runs goose's migrations under a sqllock lock: a
// [Locker] is both a goose lock.SessionLocker and a lock.Locker, for
// goose.WithSessionLocker and goose.WithLocker:
//
//	locker := sqllock.New(db)
//	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations,
//		goose.WithSessionLocker(sqllockgoose.New(locker)))
//
// It takes goose's own default key (lock.DefaultLockID, 4097083626, as
// [interop.Goose] computes it) in the same key space, so a Provider that
// uses it and one that uses goose's lock.NewPostgresSessionLocker exclude
// each other: a fleet can move to it one instance at a time.
//
// What it changes against goose's own session locker:
//
//   - The wait is in the server and first come, first served (goose's polls
//     pg_try_advisory_lock every 5 s and fails after 5 minutes); it ends
//     when the context given to the Provider's call ends.
//   - The wait is CIC-safe: a migration's CREATE INDEX CONCURRENTLY on the
//     holder never waits for, nor deadlocks with, an instance that waits
//     for the lock.
//   - The lock sits on a session of the sqllock Locker, not on goose's
//     connection, with sqllock's keep-alive and orphan bound: a lock that is
//     lost while the migrations run makes the Provider's call return an
//     error matching [sqllock.ErrLockLost] (from the unlock), and an
//     instance that dies frees it within the orphan bound.
//
// The Locker's *sql.DB needs a connection for the lock besides the one goose
// takes for the migrations: give goose a pool of at least two connections,
// or give sqllock a *sql.DB of its own.
//
// This package is a module of its own (github.com/sqllock/sqllock/contrib/sqllockgoose),
// so that goose is a dependency of its users only.
package sqllockgoose
