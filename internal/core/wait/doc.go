// Package wait is the core's wait layer: it tries and waits for advisory
// locks on a connection or in a transaction, and knows no session, held
// lock or Pool.
//
// It holds:
//   - the Engine, which runs a try and a wait on a Waiter (a connection,
//     ConnWaiter, or a transaction, TxWaiter) and returns an Outcome:
//     what the server answered, for the core's judge to read (wait.go);
//   - the line that serves waiters of every process in their order of
//     arrival (fcfs.go);
//   - a transaction's waits (tx.go);
//   - deadlines kept by the server and read past by a little
//     (deadline.go), and the stop of a wait whose caller left (stop.go).
//
// It imports the leaf layer (stmt) only.
package wait
