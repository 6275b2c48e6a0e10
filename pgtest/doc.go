// Package pgtest starts throwaway PostgreSQL servers for integration tests
// and examples: this module's, and yours.
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
//
//	func TestJob(t *testing.T) {
//		db := pgtest.Open(t, "pgx", pgtest.Start(t).NewDatabase(t))
//		...
//	}
//
// [Start] gives a test binary one shared server, started on first use and
// stopped by [Run] from TestMain. The server comes from, in order:
//
//  1. the DSN in SQLLOCK_TEST_DSN (a server you run; it must let its role
//     create databases);
//  2. a throwaway cluster made with the local PostgreSQL binaries (initdb and
//     postgres on PATH or under /usr/lib/postgresql/*/bin) in a temporary
//     directory, on a free loopback port, with fsync off; as root the server
//     runs as the postgres (or nobody) user, since PostgreSQL refuses root;
//  3. a [Provider], with [StartWith] and [EmbeddedWith]: the module
//     github.com/sqllock/sqllock/pgtest/pgdocker runs a Docker container
//     (pgdocker.Start). SQLLOCK_TEST_SERVER=docker takes this path even
//     where local binaries exist (=local: never).
//
// When none is available, the test is skipped with a message saying how to
// get PostgreSQL, or fails when CI=true. Restart, standby and PgBouncer
// ([Server.Restart], [Server.Standby], [Server.PgBouncer]) and network
// namespaces ([StartIsolated]) need a local cluster.
//
// pgtest is part of the sqllock module and depends on nothing but the pgx
// driver: Docker's client libraries live in the pgdocker module, so that
// they stay out of the module graph of programs that use sqllock.
//
// Tests connect as an ordinary role (not a superuser), so everything the
// module does is proven to work with least privilege; [Server.AdminDSN] is a
// superuser for the harness itself. [Server.NewDatabase] gives a test its own
// database. A local cluster can also be restarted ([Server.Restart]), fronted
// by PgBouncer ([Server.PgBouncer]) and followed by a streaming standby
// ([Server.Standby]).
//
// [StartPatroni] starts a 3-node PostgreSQL cluster run by Patroni, with
// etcd, for tests of code under failover: multi-host DSNs for pgx and
// lib/pq, and faults (a switchover, a host's death, a PostgreSQL crash, a
// replication stall). It needs the patroni and etcd programs (Debian:
// patroni, etcd-server) and skips the test without them (fails when
// CI=true).
//
// [Embedded] starts the same kind of server outside tests, for the examples.
//
// Without [Run] in TestMain the tests work as well, and a throwaway cluster
// is still removed: a small reaper process deletes its directory once the
// test binary has exited, however it exited (the server itself stops with
// the binary through a parent-death signal). Run stops it sooner.
//
// Importing pgtest registers the "pgx" database/sql driver, as a side
// effect of github.com/jackc/pgx/v5/stdlib, which the harness uses for its
// own connections.
//
// Outside Go tests, a throwaway server for a shell:
//
//	go run github.com/sqllock/sqllock/pgtest/cmd/pgtest@latest
//
// prints its DATABASE_URL and keeps it running until interrupted.
package pgtest
