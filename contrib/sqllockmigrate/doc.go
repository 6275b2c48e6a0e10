// Package sqllockmigrate makes golang-migrate take its lock through
// sqllock: [Wrap] turns any golang-migrate database.Driver into one whose
// Lock and Unlock take golang-migrate's own advisory key (as
// [interop.GolangMigrate] computes it) with a [sqllock.Locker]; every other
// method is the wrapped driver's. [OpenPostgres] opens golang-migrate's
// postgres driver wrapped, its opening included:
//
//	locker := sqllock.New(db) // a *sql.DB of the application's
//	drv, err := sqllockmigrate.OpenPostgres(ctx, locker, &postgres.Config{MultiStatementEnabled: true})
//	if err != nil { ... }
//	m, err := migrate.NewWithDatabaseInstance("file://migrations", "postgres", drv)
//
// What it changes against golang-migrate's PostgreSQL drivers, whose Lock
// runs pg_advisory_lock on the driver's connection:
//
//   - The wait is CIC-safe. A migration that runs CREATE INDEX
//     CONCURRENTLY (or REINDEX CONCURRENTLY, DETACH PARTITION CONCURRENTLY)
//     waits for every older snapshot, the one of a statement that waits for
//     the lock among them: with the drivers' pg_advisory_lock the build and
//     the waiting instance deadlock (golang-migrate issue 960). sqllock waits
//     in statements shorter than half the server's deadlock_timeout, so the
//     build goes on. It is the waiting instances that must use this package
//     (opened with OpenPostgres: the drivers wait for the lock as they open,
//     too); the holder may be either. Measured: with the postgres driver,
//     the waiting instance failed with "deadlock detected" after the
//     server's deadlock_timeout, 3 of 3 trials; with OpenPostgres both
//     finished, 20 of 20 (docs/benchmarks.md).
//   - The wait is bounded ([WithWait], 10 s by default), and when it ends
//     nothing stays held or queued. golang-migrate's LockTimeout (the
//     -lock-timeout flag) returns to the caller but leaves the drivers'
//     pg_advisory_lock waiting; granted later, that lock is held until the
//     driver is closed (golang-migrate issue 269). Set the Migrate's
//     LockTimeout above the wait, so that the wait's own error comes back.
//   - The lock sits on a session of the sqllock Locker, with its keep-alive
//     and orphan bound: a lock lost while migrations run makes Unlock (and
//     so the Migrate's call) return an error matching [sqllock.ErrLockLost].
//
// The key is the one golang-migrate takes for the same migrations table, so
// instances with and without this package exclude each other. Mind how
// each is opened: from a URL, golang-migrate names the database "/name";
// from a *sql.DB or *sql.Conn, "name" (see [interop.GolangMigrate]).
//
// This package is a module of its own
// (github.com/sqllock/sqllock/contrib/sqllockmigrate), so that golang-migrate is a
// dependency of its users only.
package sqllockmigrate
