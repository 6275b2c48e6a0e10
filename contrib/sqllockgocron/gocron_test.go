package sqllockgocron_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/contrib/sqllockgocron"
	"github.com/sqllock/sqllock/pgtest"
)

// helperEnv names the variable that makes the test binary a scheduler
// process: "elector" or "locker".
const helperEnv = "SQLLOCKGOCRON_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := scheduler(mode, os.Getenv("HELPER_DSN"), os.Getenv("HELPER_INSTANCE")); err != nil {
			fmt.Fprintln(os.Stderr, "scheduler:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(pgtest.Run(m))
}

// orphanBound is the schedulers' Lockers' orphan bound: the longest a dead
// leader's term outlives it.
const orphanBound = 10 * time.Second

// electionKey is the schedulers' election.
var electionKey = sqllock.Hash("gocron:leader")

// scheduler runs a gocron scheduler, coordinated as mode says, whose one
// job fires every second and records its tick (the second it fired in)
// and instance in the ticks table. It runs until the process is killed or
// its standard input closes.
func scheduler(mode, dsn, instance string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	locker := sqllock.New(db, sqllock.WithOrphanBound(orphanBound))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var opt gocron.SchedulerOption
	switch mode {
	case "elector":
		el := sqllockgocron.NewElector(locker.Election(electionKey), instance)
		go el.Run(ctx)
		opt = gocron.WithDistributedElector(el)
	case "locker":
		// A window of 700 ms: longer than the schedulers' skew, shorter
		// than the period.
		opt = gocron.WithDistributedLocker(sqllockgocron.NewLocker(locker, sqllockgocron.WithHoldAtLeast(700*time.Millisecond)))
	default:
		return fmt.Errorf("mode %q", mode)
	}
	s, err := gocron.NewScheduler(opt)
	if err != nil {
		return err
	}
	_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
		tick := time.Now().Truncate(time.Second)
		if _, err := db.Exec("INSERT INTO ticks (tick, instance) VALUES ($1, $2)", tick, instance); err != nil {
			fmt.Fprintln(os.Stderr, "scheduler: tick:", err)
		}
	}), gocron.WithName("tick"))
	if err != nil {
		return err
	}
	s.Start()
	fmt.Println("started")
	bufio.NewReader(os.Stdin).ReadString('\n') // until the test closes stdin
	return s.Shutdown()
}

// start starts a scheduler process and returns it once it has started; it
// is killed when t ends.
func start(t *testing.T, mode, dsn, instance string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "HELPER_DSN="+dsn, "HELPER_INSTANCE="+instance)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "started" {
		t.Fatalf("scheduler %s: %q, %v", instance, line, err)
	}
	return cmd
}

// ticksDB returns the DSN of a fresh database with the ticks table, and a
// pool on it.
func ticksDB(t *testing.T) (string, *sql.DB) {
	t.Helper()
	dsn := pgtest.Start(t).NewDatabase(t)
	db := pgtest.Open(t, "pgx", dsn)
	if _, err := db.Exec("CREATE TABLE ticks (tick timestamptz NOT NULL, instance text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return dsn, db
}

// count returns the ticks recorded, and the ticks recorded more than once.
func count(t *testing.T, db *sql.DB) (ticks, twice int) {
	t.Helper()
	err := db.QueryRow(`SELECT count(DISTINCT tick), (SELECT count(*) FROM (SELECT tick FROM ticks GROUP BY tick HAVING count(*) > 1) d) FROM ticks`).Scan(&ticks, &twice)
	if err != nil {
		t.Fatal(err)
	}
	return ticks, twice
}

// waitTicks waits until n ticks were recorded, at most a minute more than
// n seconds.
func waitTicks(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Duration(n)*time.Second + time.Minute)
	for {
		if got, _ := count(t, db); got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d ticks recorded", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestElectorTakeover: two schedulers in processes of their own, each with
// an Elector on one election; the leader is killed with SIGKILL after 8
// ticks. The other leads within the orphan bound and its scheduler goes
// on: 20 ticks in all, none run twice, each run by the leader of its time.
func TestElectorTakeover(t *testing.T) {
	t.Parallel()
	dsn, db := ticksDB(t)
	procs := map[string]*exec.Cmd{"a": start(t, "elector", dsn, "a"), "b": start(t, "elector", dsn, "b")}
	election := sqllock.New(db).Election(electionKey)
	ctx := context.Background()
	leader := func() sqllock.Leader {
		ld, err := election.Leader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ld
	}
	var first sqllock.Leader
	for deadline := time.Now().Add(time.Minute); first.Value == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader within a minute")
		}
		first = leader()
	}
	waitTicks(t, db, 8)
	other := map[string]string{"a": "b", "b": "a"}[first.Value]
	killed := time.Now()
	if err := procs[first.Value].Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var next sqllock.Leader
	for next.Value != other {
		if time.Since(killed) > orphanBound+10*time.Second {
			t.Fatalf("%s still does not lead %v after the leader's kill (leader: %v)", other, time.Since(killed), next)
		}
		time.Sleep(5 * time.Millisecond)
		next = leader()
	}
	takeover := time.Since(killed)
	if takeover > orphanBound {
		t.Errorf("%s led %v after the leader's kill, past the orphan bound (%v)", other, takeover, orphanBound)
	}
	before, _ := count(t, db)
	waitTicks(t, db, max(20, before+5))
	ticks, twice := count(t, db)
	var byFirst, byOther int
	if err := db.QueryRow("SELECT count(*) FILTER (WHERE instance = $1), count(*) FILTER (WHERE instance = $2) FROM ticks", first.Value, other).Scan(&byFirst, &byOther); err != nil {
		t.Fatal(err)
	}
	t.Logf("leader %s killed after %d ticks; %s led %v later (orphan bound %v); %d ticks in all (%d by %s, %d by %s), %d run twice",
		first.Value, before, other, takeover.Round(time.Millisecond), orphanBound, ticks, byFirst, first.Value, byOther, other, twice)
	if twice != 0 {
		t.Errorf("%d ticks ran twice", twice)
	}
	if byOther == 0 {
		t.Errorf("the new leader ran no tick")
	}
}

// TestLockerOneRunPerTick: two schedulers in processes of their own fire
// the same job every second, each through a Locker with a hold window of
// 700 ms: over 20 ticks, each ran once.
func TestLockerOneRunPerTick(t *testing.T) {
	t.Parallel()
	dsn, db := ticksDB(t)
	start(t, "locker", dsn, "a")
	start(t, "locker", dsn, "b")
	waitTicks(t, db, 20)
	ticks, twice := count(t, db)
	var a, b int
	var first, last time.Time
	if err := db.QueryRow("SELECT count(*) FILTER (WHERE instance = 'a'), count(*) FILTER (WHERE instance = 'b'), min(tick), max(tick) FROM ticks").Scan(&a, &b, &first, &last); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ticks (%d by a, %d by b) from %v to %v; %d run twice", ticks, a, b, first.Format(time.TimeOnly), last.Format(time.TimeOnly), twice)
	if twice != 0 {
		t.Errorf("%d ticks ran twice", twice)
	}
}

// TestIsLeader: an Elector leads only while its Run holds a term: not
// before Run, within the wait for a free key after it, and not once Run's
// context has ended (Run then returns that context's error).
func TestIsLeader(t *testing.T) {
	t.Parallel()
	_, db := ticksDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	el := sqllockgocron.NewElector(sqllock.New(db).Election(electionKey), "solo")
	if err := el.IsLeader(ctx); !errors.Is(err, sqllock.ErrNotLeader) {
		t.Fatalf("IsLeader() before Run = %v, want ErrNotLeader", err)
	}
	done := make(chan error, 1)
	go func() { done <- el.Run(ctx) }()
	for deadline := time.Now().Add(time.Minute); el.IsLeader(ctx) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("IsLeader() = %v a minute after Run on a free election", el.IsLeader(ctx))
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v, want context.Canceled", err)
	}
	if err := el.IsLeader(context.Background()); !errors.Is(err, sqllock.ErrNotLeader) {
		t.Errorf("IsLeader() after Run = %v, want ErrNotLeader", err)
	}
}
