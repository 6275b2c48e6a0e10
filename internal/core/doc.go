// Package core is sqllock's session core: the server sessions that hold
// advisory locks, and everything that happens on them. A session of the
// core is one server session: its connection, its server and backend
// identity, its lease, the keys it holds, its statement queue (batching is
// how every session sends), the waits on it, and one lifecycle field
// changed in one place (session.setStateLocked).
//
// Outcomes. judge is the rule book for the outcome of an acquisition: it
// turns what a lock statement answered into a verdict (granted, refused,
// unwanted, uncertain, stray), which its callers apply and never change
// (settle for a Pool's sessions, acquireShared through judgeShared,
// Owned.Lock, the transaction locks). unlockVerdict is the rule book for
// the answer to an unlock, and sendUnlocks is the only function that
// renders an unlock statement (alone, or with tries: runMixed). An uncertain verdict
// discards the session; a certain one touches one lock only.
// internal/layout's TestOnePlacePromises holds these promises, and the
// one of the lifecycle, to the code.
//
// Layers. The core is three packages, each importing only those below
// it, as the compiler keeps, and seams, the test hooks, which any of them
// may read:
//
//   - stmt, the leaf: one statement on one connection (bounded, prepared),
//     the batch statements, the sets of connections, the errors and every
//     SQLSTATE comparison;
//   - wait: tries and waits on a connection or in a transaction, the
//     line, deadlines; it knows no session, Hold or Pool, and returns
//     what the server answered (wait.Outcome) for the judge to read;
//   - core (this package): sessions, the Pool, Hold and Owned, the judge,
//     the queues of a Pool's callers.
//
// Waiting. A Pool keeps one queue per key (keyqueue.go), in arrival order,
// whose head waits on the server in the key's line (wait's fcfs.go), which
// every process's waiters share.
//
// The sqllock package's handles (Lock, Session, a semaphore's permit, an
// election's term) are thin layers over the core's Hold and Owned, which
// share one lifecycle (lifecycle.go): they observe their end (a Done
// channel and a cause), and the core never calls into them. The core tells
// its Pool's owner what happens through Hooks, one event path.
//
// The words for ending, each with one meaning:
//
//   - close: end cleanly; the thing ends holding nothing, and its
//     connection goes back to the pool as it came (a pinned session's
//     transaction commits).
//   - discard: end a session the core is not sure of (or a holder's, whose
//     backend is terminated); its connection is thrown away, and the
//     server releases whatever it held as its session ends.
//   - release: give a lock back, confirmed by the server; unlock is the
//     statement that does it (and the handles' name for it).
//   - lose: find that a lock was taken away (its session ended, or the
//     keep-alive found it gone); the holder is told.
//   - leave: a waiter gives up its place, in a Pool's queue or in a line;
//     a call gives up its share of a session.
//   - stop: end a timer, a goroutine, or a statement running on the
//     server (a wait taken out of the server's queue).
//
// No function of the core or of the sqllock package is named with
// another ending verb (internal/layout's TestEndingVerbs).
//
// Test seams, in two places only: what a test may read of a Pool, a Hold
// or an Owned, or make them do, is Probe's (probe.go); the hooks a test
// may set to run at a point of the core's work are package seams'
// (internal/layout's TestSeamsInOnePlace).
package core
