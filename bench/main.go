// Command bench measures sqllock against the raw statements, against other
// Go advisory-lock implementations (goose v3, golang-migrate v4, atlas) and
// against pgbench, on one throwaway PostgreSQL, and writes the results to
// docs/benchmarks.md with a PNG chart per table.
//
//	cd bench && go run . -out ../docs
//
// Every comparison uses the method of the module's go test benchmarks
// (internal/testkit): its variants run one call each per round, in a
// random order, in one process, and are summed up by their median wall
// time, mean process CPU time and allocations per call.
//
// Four modes measure one thing each and print its tables, for the
// hand-written sections of docs/benchmarks.md: -sharing (sessions per
// locks), -etcd (leader election against etcd's, under faults of the
// leader; needs etcd-server), -tokens (the fencing token's statement,
// durable or not, with fsync off and on) and -observe (Election.Observe:
// its statements' cost by the server's lock table, an observer's cost at
// rest and to a lock workload, and how soon it reports a change).
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"golang.org/x/sys/unix"

	etcdversion "go.etcd.io/etcd/api/v3/version"

	"github.com/sqllock/sqllock/pgtest"
)

func main() {
	if os.Getenv(candidateEnv) != "" {
		os.Exit(candidateMain())
	}
	if os.Getenv(xhandoffEnv) != "" {
		os.Exit(xhandoffWaiter())
	}
	out := flag.String("out", "../docs", "directory for benchmarks.md and the charts")
	calls := flag.Int("calls", 2000, "rounds per comparison (each runs one call of every variant, in a random order)")
	hotRounds := flag.Int("hot", 8, "rounds of the hot-key comparison (each a 500 ms phase per contender)")
	handoffs := flag.Int("handoffs", 40, "samples per handoff variant (goose: fewer, it polls in seconds)")
	cpu := flag.Int("cpu", 0, "pin this process and the PostgreSQL server it starts to this CPU (-1: do not pin)")
	sharing := flag.Bool("sharing", false, "measure only the sessions-per-locks curve: its chart to -out, its table to stdout")
	etcdCmp := flag.Bool("etcd", false, "compare leader election with etcd's (needs etcd-server): faults of the leader, time to the next; its table to stdout")
	trials := flag.Int("trials", 5, "-etcd: trials of each fault at 5 s bounds, and of resign and fairness everywhere")
	fairness := flag.Bool("fairness", false, "-etcd: run only the fairness trials (who is elected among queued candidates), their rows to stdout")
	longTrials := flag.Int("long-trials", 2, "-etcd: trials of each fault that waits for a default bound (etcd's 60 s TTL, sqllock's 30 s orphan bound)")
	throughput := flag.Bool("throughput", false, "measure only locks/s against goroutines (sqllock, raw SQL, the hand-batched ceiling) and memory per held lock: its chart to -out, its tables to stdout")
	phase := flag.Duration("phase", 500*time.Millisecond, "-throughput, -observe: the length of one phase")
	rounds := flag.Int("rounds", 3, "-throughput, -observe: rounds of phases (medians are reported)")
	observe := flag.Bool("observe", false, "measure Election.Observe: an ask's cost by the server's lock table, observers' cost at rest and under a lock workload, and how soon changes are reported: its tables to stdout")
	terms := flag.Int("terms", 50, "-observe: terms of 100 ms to report")
	kills := flag.Int("kills", 10, "-observe: leader processes to kill")
	xhandoff := flag.Int("xhandoff", 0, "measure this many handoffs to a waiter in another process, on the server of DATABASE_URL: median and p99 to stdout (run two builds in turn to compare them)")
	tokens := flag.Bool("tokens", false, "measure the fencing token's statement, before and after it became durable, with fsync off and on: its table to stdout")
	flag.Parse()
	if *xhandoff > 0 {
		if err := runXHandoff(*xhandoff, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *sharing || *etcdCmp || *throughput || *observe {
		*cpu = -1 // thousands of goroutines, or processes: every CPU
	}
	if *cpu >= 0 && os.Getenv("SQLLOCK_BENCH_PINNED") == "" {
		// On a small virtual machine, a client and a server that ping-pong
		// between two CPUs are served several times slower than on one, and
		// the scheduler moves them between the two regimes unpredictably:
		// pinning both to one CPU gives every variant the same regime. The
		// affinity is set on this thread, and the program executes itself
		// again, so that every thread of the process, and the server it
		// starts, inherit it.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(*cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			fmt.Fprintln(os.Stderr, "bench: pin to CPU:", err)
			os.Exit(1)
		}
		self, err := os.Executable()
		if err == nil {
			err = syscall.Exec(self, os.Args, append(os.Environ(), "SQLLOCK_BENCH_PINNED=1", "GOMAXPROCS=1"))
		}
		fmt.Fprintln(os.Stderr, "bench: pin to CPU:", err)
		os.Exit(1)
	}
	if *etcdCmp || *tokens {
		onlyFairness = *fairness
		if err := runAlone(*etcdCmp, *tokens, *calls, *longTrials, *trials); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *observe {
		ctx := context.Background()
		srv, err := pgtest.Embedded(ctx)
		if err == nil {
			err = runObserve(ctx, srv, *calls, *terms, *kills, *phase, *rounds, os.Stdout)
			srv.Close()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *throughput {
		if err := runThroughput(*out, *phase, *rounds, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *sharing {
		if err := runSharingOnly(*out); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*out, *calls, *hotRounds, *handoffs, *cpu); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(outDir string, calls, hotRounds, handoffs, cpu int) error {
	ctx := context.Background()
	srv, err := pgtest.Embedded(ctx)
	if err != nil {
		return err
	}
	defer srv.Close()
	dsn := srv.DSN()
	e := &env{ctx: ctx, srv: srv, dsn: dsn, pq: open("postgres", dsn), pgx: open("pgx", dsn)}
	defer e.pq.Close()
	defer e.pgx.Close()
	if err := warmUp(e); err != nil {
		return err
	}
	var r report
	r.when = time.Now().UTC()
	r.machine = fmt.Sprintf("%d cores, %s, %s", runtime.NumCPU(), runtime.Version(), serverVersion(e))
	r.args = fmt.Sprintf("-calls %d -hot %d -handoffs %d -cpu %d", calls, hotRounds, handoffs, cpu)
	r.pinned = cpu >= 0
	step := func(name string) func() {
		t := time.Now()
		fmt.Fprintf(os.Stderr, "%s...", name)
		return func() { fmt.Fprintf(os.Stderr, " %v\n", time.Since(t).Round(time.Millisecond)) }
	}

	done := step("uncontended cycles")
	if r.cycles, err = measureCycles(e, calls, 5*time.Second); err != nil {
		return err
	}
	done()
	done = step("hot key")
	if r.hot, err = measureHotKey(e, hotRounds); err != nil {
		return err
	}
	done()
	done = step("round trip")
	if r.rtt, err = roundTrip(ctx, e.pgx, 20*time.Millisecond); err != nil {
		return err
	}
	if r.hotRTT, err = roundTrip(ctx, e.pgx, 0); err != nil {
		return err
	}
	done()
	done = step("handoffs")
	if r.handoffs, err = measureHandoffs(e, handoffs); err != nil {
		return err
	}
	done()
	done = step("distinct keys, pool of 10")
	if r.scale, err = measureScale(e, 2*time.Second); err != nil {
		return err
	}
	done()
	done = step("5,000 locks on one Session")
	if r.session, err = measureSession(e); err != nil {
		return err
	}
	done()
	done = step("poolguard")
	if r.guard, err = measureGuard(e, calls); err != nil {
		return err
	}
	done()
	return r.write(outDir)
}

// runSharingOnly is the -sharing mode.
func runSharingOnly(outDir string) error {
	ctx := context.Background()
	srv, err := pgtest.Embedded(ctx)
	if err != nil {
		return err
	}
	defer srv.Close()
	e := &env{ctx: ctx, srv: srv, dsn: srv.DSN(), pq: open("postgres", srv.DSN()), pgx: open("pgx", srv.DSN())}
	defer e.pq.Close()
	defer e.pgx.Close()
	return runSharing(e, outDir, os.Stdout)
}

// runAlone is the -etcd and -tokens modes: tables to stdout.
func runAlone(elections, tokens bool, calls, longTrials, trials int) error {
	ctx := context.Background()
	srv, err := pgtest.Embedded(ctx)
	if err != nil {
		return err
	}
	defer srv.Close()
	db := open("pgx", srv.DSN())
	defer db.Close()
	fmt.Printf("%s, %d cores, %s, %s\n\n", time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), serverVersion(&env{ctx: ctx, pgx: db}))
	if tokens {
		if err := runTokens(ctx, srv, calls, os.Stdout); err != nil {
			return err
		}
	}
	if elections {
		etcd, err := pgtest.NewEtcd(ctx)
		if err != nil {
			return err
		}
		defer etcd.Close()
		fmt.Printf("etcd server %s, client go.etcd.io/etcd/client/v3 %s\n\n", etcdVersion(etcd.ClientURL), etcdversion.Version)
		if err := runElections(srv.DSN(), etcd.Addr(), longTrials, trials, os.Stdout); err != nil {
			return err
		}
	}
	return nil
}

func warmUp(e *env) error {
	for _, db := range []*sql.DB{e.pq, e.pgx} {
		for i := 0; i < 200; i++ {
			var one int
			if err := db.QueryRowContext(e.ctx, "SELECT 1").Scan(&one); err != nil {
				return err
			}
		}
	}
	return nil
}

func serverVersion(e *env) string {
	var v string
	e.pgx.QueryRowContext(e.ctx, "SHOW server_version").Scan(&v)
	return "PostgreSQL " + v
}
