// Package sqllockgocron coordinates go-co-op/gocron v2 schedulers that run
// in several processes through PostgreSQL, with sqllock:
//
//   - [Locker] is a gocron.Locker (gocron.WithDistributedLocker): each run
//     of a job takes the job's lock with TryLock, so one scheduler runs it
//     and the others skip that run. With [WithHoldAtLeast], the lock is
//     held for a window after the job returns, so that a scheduler whose
//     clock or timer is a little late does not run the same tick again.
//
//   - [Elector] is a gocron.Elector (gocron.WithDistributedElector), backed
//     by a [sqllock.Election]: only the leader's scheduler runs jobs. When
//     the leader dies, the server ends its session and another candidate,
//     already waiting in the server, leads: at once when the process died
//     (its kernel closed the connection), within the Locker's orphan bound
//     when its host vanished or froze.
//
//     locker := sqllock.New(db)
//     elector := sqllockgocron.NewElector(locker.Election(sqllock.Hash("gocron:leader")), hostname)
//     go elector.Run(ctx)
//     s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
//
// This package is a module of its own
// (github.com/sqllock/sqllock/contrib/sqllockgocron), so that gocron is a
// dependency of its users only.
package sqllockgocron
