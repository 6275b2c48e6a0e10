package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
)

// The examples without an "Output:" comment need a PostgreSQL server: the
// tests compile and vet them but do not run them (the same code runs
// against a real server in the package's tests). The examples of keys,
// registries and errors run, and their output is checked.

var (
	db  *sql.DB // opened with any PostgreSQL driver, e.g. sql.Open("pgx", dsn)
	ctx = context.Background()
)

func reindexPosts(context.Context) error { return nil }

// A program's lock names, registered under their hashes at start-up; a
// second name for the same key panics there (docs/traps.md, docs/guide.md).
var (
	locks   = sqllock.NewRegistry()
	reindex = locks.MustRegister("cron:reindex_posts", sqllock.Hash("cron:reindex_posts"))
	cleanup = locks.MustRegister("cron:cleanup_old_logs", sqllock.Hash("cron:cleanup_old_logs"))
)

// Example is the cron pattern from the README.
func Example() {
	db, _ := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	locker := sqllock.New(db)

	// The cron pattern: if the previous run is still going, back out.
	ran, err := locker.TryDo(ctx, sqllock.Hash("cron:reindex_posts"), func(ctx context.Context) error {
		return reindexPosts(ctx) // ctx is cancelled if the lock is lost
	})
	switch {
	case err != nil:
		log.Fatal(err)
	case !ran:
		log.Print("another reindex is running: skipping")
	}
}

// Example_wait waits for a lock with a deadline, as in the README.
func Example_wait() {
	locker := sqllock.New(db)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lk, err := locker.Lock(ctx, sqllock.Pair(1, 67890))
	if errors.Is(err, sqllock.ErrNotAcquired) { /* timed out; nothing is held */
		return
	}
	defer lk.Unlock(ctx) // safe twice, on nil, and with a cancelled ctx
}

// Example_transaction takes a transaction-scoped lock, as in the README.
func Example_transaction() {
	locker := sqllock.New(db)
	err := locker.InTx(ctx, sqllock.Hash("report:daily"), nil, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO reports ...")
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleLocker_TryDo() {
	locker := sqllock.New(db)
	ran, err := locker.TryDo(context.Background(), sqllock.Hash("cron:reindex_posts"), func(ctx context.Context) error {
		// Only one instance runs this at a time. ctx is cancelled if the
		// lock is lost.
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if !ran {
		log.Print("another reindex is running: skipping")
	}
}

func ExampleLocker_Do() {
	locker := sqllock.New(db)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Migrations wait their turn; give up after a minute.
	err := locker.Do(ctx, interop.Goose(), func(ctx context.Context) error {
		return nil // run the migrations
	})
	if errors.Is(err, sqllock.ErrNotAcquired) {
		log.Print("timed out waiting for the migration lock")
	}
}

func ExampleLocker_Lock() {
	locker := sqllock.New(db)
	ctx := context.Background()
	lk, err := locker.Lock(ctx, sqllock.Pair(1, 67890))
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Unlock(ctx) // safe even if Unlock was already called

	select {
	case <-lk.Done(): // lost: the session died or the server restarted
		log.Print(lk.Err())
	case <-time.After(time.Second): // the work
	}
}

func ExampleLocker_TryLock() {
	locker := sqllock.New(db)
	lk, err := locker.TryLock(context.Background(), sqllock.Int64(1001))
	switch {
	case errors.Is(err, sqllock.ErrNotAcquired):
		return // held elsewhere
	case err != nil:
		log.Fatal(err)
	}
	defer lk.Unlock(context.Background())
	// ... the work ...
}

func ExampleLocker_RLock() {
	locker := sqllock.New(db)
	// Many readers may hold the shared lock; a writer's Lock waits for all of them.
	lk, err := locker.RLock(context.Background(), sqllock.Hash("mv:top_posts"))
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Unlock(context.Background())
}

func ExampleLocker_InTx() {
	locker := sqllock.New(db)
	err := locker.InTx(context.Background(), sqllock.Hash("report:daily"), nil, func(tx *sql.Tx) error {
		// The lock is released when this transaction commits or rolls back.
		_, err := tx.Exec("INSERT INTO reports (day) VALUES (current_date) ON CONFLICT DO NOTHING")
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleLockTx() {
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := sqllock.LockTx(ctx, tx, sqllock.Pair(2, 100)); err != nil {
		log.Fatal(err)
	}
	// ... work under the lock ...
	if err := tx.Commit(); err != nil { // releases the lock
		log.Fatal(err)
	}
}

func ExampleInspect() {
	locks, err := sqllock.Inspect(context.Background(), db, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range locks {
		fmt.Println(l.Key, l.Granted, l.PID, l.ApplicationName, l.BlockedBy)
	}
}

func ExampleParseKey() {
	for _, s := range []string{"12345", "(1,67890)", "1, 2", "x"} {
		k, err := sqllock.ParseKey(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		_, _, pair := k.Pair()
		fmt.Println(k, pair)
	}
	// Output:
	// 12345 false
	// (1,67890) true
	// (1,2) true
	// sqllock: invalid key "x": bigint key: "x" is not a decimal integer
}

func ExampleHash() {
	fmt.Println(sqllock.Hash("cron:reindex_posts"))
	fmt.Println(interop.CRC32("cron:reindex_posts")) // Python's zlib.crc32(name)
	// Output:
	// 4387803684103558220
	// 3230921880
}

func ExampleRegistry() {
	reg := sqllock.NewRegistry()
	reg.MustRegister("cron:reindex_posts", sqllock.Int64(1001))
	reg.MustRegister("cron:cleanup_old_logs", sqllock.Int64(1002))
	err := reg.Register("cron:copy_paste", sqllock.Int64(1001))
	fmt.Println(errors.Is(err, sqllock.ErrDuplicate))
	fmt.Println(err)
	// Output:
	// true
	// sqllock: duplicate registry entry: key 1001 of "cron:copy_paste" is already registered as "cron:reindex_posts"
}

func ExampleLocker_Session() {
	locker := sqllock.New(db)
	// One connection holds a lock per job: claim up to 100 free jobs in one round trip.
	s, err := locker.Session(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx) // releases every lock, confirmed
	jobs := make([]sqllock.Key, 0, 100)
	for id := int32(1); id <= 100; id++ {
		jobs = append(jobs, sqllock.Pair(2, id))
	}
	claimed, err := s.TryLock(ctx, jobs...)
	if err != nil {
		log.Fatal(err)
	}
	for _, k := range claimed {
		_, id, _ := k.Pair()
		log.Printf("working on job %d", id)
	}
	if err := s.Unlock(ctx, claimed...); err != nil {
		log.Fatal(err)
	}
}

func ExampleSession_Conn() {
	// Statements that must run in the session that holds a lock (a
	// session-level SET, CREATE INDEX CONCURRENTLY in the holder's
	// session) run on a Session's connection.
	ctx := context.Background()
	s, err := sqllock.New(db).Session(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx) // releases its locks, confirmed; do not close s.Conn()
	if err := s.Lock(ctx, sqllock.Hash("reindex:posts")); err != nil {
		log.Fatal(err)
	}
	if _, err := s.Conn().ExecContext(ctx, "REINDEX INDEX CONCURRENTLY posts_pkey"); err != nil {
		log.Fatal(err)
	}
}

func ExampleWithLogger() {
	locker := sqllock.New(db,
		sqllock.WithLogger(slog.Default()),     // waiting, acquired, released, lost, discarded
		sqllock.WithKeepAlive(2*time.Second),   // check held locks every 2 s
		sqllock.WithUnlockTimeout(time.Second), // bound every unlock
	)
	st := locker.Stats()
	log.Printf("held %d, acquired %d, contended %d, timed out %d, lost %d", st.Held, st.Acquired, st.Contended, st.TimedOut, st.Lost)
}

func ExampleInt64() {
	fmt.Println(sqllock.Int64(42), sqllock.Int64(-5))
	fmt.Println(sqllock.Pair(1, 67890))
	v, ok := sqllock.Int64(42).Int64()
	fmt.Println(v, ok)
	// Output:
	// 42 -5
	// (1,67890)
	// 42 true
}

// Errors match sentinels with errors.Is; handles are safe to release twice
// or when nil.
func Example_errors() {
	_, err := sqllock.ParseKey("(1,2")
	fmt.Println(errors.Is(err, sqllock.ErrInvalidKey))
	fmt.Println(err)
	var lk *sqllock.Lock // as left by a failed Lock
	fmt.Println(errors.Is(lk.Unlock(ctx), sqllock.ErrReleased))
	// Output:
	// true
	// sqllock: invalid key "(1,2": unbalanced parentheses
	// true
}

func ExampleRegistry_MustRegister() {
	fmt.Println(reindex == sqllock.Hash("cron:reindex_posts"), cleanup != reindex)
	for name, k := range locks.All() {
		fmt.Println(name, k == sqllock.Hash(name))
	}
	// Output:
	// true true
	// cron:cleanup_old_logs true
	// cron:reindex_posts true
}

func runScheduler(context.Context, int64) error { return nil }

// One replica of a fleet runs the scheduler: each campaigns with its name;
// the elected one runs the scheduler until its term ends, and campaigns
// again after a loss.
func ExampleElection_Lead() {
	host := os.Getenv("HOSTNAME") // what names this replica
	election := sqllock.New(db).Election(sqllock.Hash("leader:scheduler"))
	err := election.Lead(ctx, host, func(ctx context.Context, term *sqllock.Lock) error {
		token, err := term.Token(ctx) // the term's fencing token
		if err != nil {
			return err
		}
		return runScheduler(ctx, token) // ctx ends with the term
	})
	log.Print(err) // ctx ended, runScheduler failed, or HOSTNAME is empty
}

// Anyone can ask who leads, and watch the leadership change.
func ExampleElection_Leader() {
	election := sqllock.New(db).Election(sqllock.Hash("leader:scheduler"))
	leader, err := election.Leader(ctx)
	if err == nil && leader.PID != 0 {
		fmt.Printf("%s leads (backend %d)\n", leader.Value, leader.PID)
	}
	for l := range election.Observe(ctx) { // until ctx ends
		fmt.Println("now:", l)
	}
}

// fencedStore is a store outside PostgreSQL that keeps, per object, the
// largest token it has accepted, and refuses writes with smaller ones (an
// object store's conditional write, a service's version check).
type fencedStore interface {
	Put(ctx context.Context, name string, data []byte, token int64) error
}

var store fencedStore

// A write to a store outside PostgreSQL carries the token; the store
// refuses it once it has seen a larger one.
func ExampleLock_Token_outsideStore() {
	lk, err := sqllock.New(db).Lock(ctx, sqllock.Hash("report:daily"))
	if err != nil {
		return
	}
	defer lk.Unlock(ctx)
	token, err := lk.Token(ctx)
	if err == nil {
		err = store.Put(ctx, "reports/daily.csv", []byte("..."), token)
	}
	if err != nil {
		log.Print(err)
	}
}

// A job that hangs no longer keeps its lock: at the bound its context
// ends and the lock is released.
func ExampleWithHoldAtMost() {
	locker := sqllock.New(db)
	k := sqllock.Hash("cron:reindex_posts")
	job := reindexPosts // stops when its ctx ends
	err := locker.Do(ctx, k, job, sqllock.WithHoldAtMost(10*time.Minute))
	// errors.Is(err, sqllock.ErrLockLost) && errors.Is(err, context.DeadlineExceeded): the job ran too long
	if err != nil {
		log.Print(err)
	}
}

// The leader changes its value without losing its term.
func ExampleElection_Proclaim() {
	election := sqllock.New(db).Election(sqllock.Hash("leader:scheduler"))
	if _, err := election.Campaign(ctx, "host-a"); err != nil {
		return
	}
	if err := election.Proclaim(ctx, "host-a:8080"); errors.Is(err, sqllock.ErrNotLeader) {
		log.Print("not the leader any more") // also ErrLockLost when the term was lost
	}
}

// ExampleWithTransactionPooler takes locks through a transaction-mode
// pooler (PgBouncer in transaction mode, Supavisor, a pooled endpoint),
// as in docs/deployment.md.
func ExampleWithTransactionPooler() {
	locker := sqllock.New(db, sqllock.WithTransactionPooler())
	defer locker.Close(ctx)

	err := locker.Do(ctx, sqllock.Hash("cron:reindex_posts"), func(ctx context.Context) error {
		return reindexPosts(ctx)
	})
	if err != nil {
		log.Print(err)
	}
}

// ExampleLocker_Close leaves nothing behind as a program shuts down: it
// waits out the hold windows for up to ten seconds, then releases every
// lock.
func ExampleLocker_Close() {
	locker := sqllock.New(db)
	// ... the program runs its jobs ...
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := locker.Close(ctx); err != nil {
		log.Print(err)
	}
}

// Machines whose clocks differ by up to 5 s fire the same job every
// minute: a hold window of 55 s runs it once per tick (docs/guide.md).
func ExampleWithHoldAtLeast() {
	locker := sqllock.New(db)
	// Every minute on every machine; their clocks agree within 5 s.
	ran, err := locker.TryDo(ctx, sqllock.Hash("cron:send_digest"), reindexPosts,
		sqllock.WithHoldAtLeast(55*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("ran this tick: %v", ran)
}

// At most three report generators run at once across the fleet.
func ExampleLocker_Semaphore() {
	locker := sqllock.New(db)
	sem := locker.Semaphore("reports", 3) // every process uses the same N
	permit, err := sem.Acquire(ctx)       // waits for a free slot
	if err != nil {
		log.Fatal(err)
	}
	defer permit.Unlock(ctx)
	// ... generate the report ...
}

// Replicas that start together run the migrations one at a time, in the
// order they asked for the lock, whichever process each runs in.
func ExampleLocker_Do_arrivalOrder() {
	locker := sqllock.New(db)
	migrate := reindexPosts
	// Each replica, at start-up: served in arrival order, across processes.
	err := locker.Do(ctx, sqllock.Hash("migrations"), migrate)
	if err != nil {
		log.Fatal(err)
	}
}
