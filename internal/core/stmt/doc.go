// Package stmt is the core's leaf layer: it runs one statement on one
// connection and reads its answer, and knows nothing of sessions, locks
// held or waits.
//
// It holds:
//   - the statements' execution on a driver connection (QueryRow and kin,
//     row.go), bounded for drivers that do not give up a read when their
//     context ends (blind.go), prepared where the driver would otherwise
//     cost two round trips (prepared.go), in pgx's simple protocol on a
//     pinned session (simple.go);
//   - the batch statements' sending and reading (batch.go);
//   - the sets of connections: those counted outside sessions (Budget),
//     those left to finish a statement alone (AbandonSet), and what is
//     known per driver connection (ConnSet);
//   - the errors, and every comparison of a SQLSTATE (errors.go).
//
// It imports no other package of the core.
package stmt
