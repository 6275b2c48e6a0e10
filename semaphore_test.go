package sqllock_test

import (
	"bytes"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

func TestSemaphoreBasics(t *testing.T) {
	eachDriver(t, func(t *testing.T, db *sql.DB, dsn string) {
		l := sqllock.New(db)
		sem := l.Semaphore("exports", 3)
		var permits []*sqllock.Lock
		for i := 0; i < 3; i++ {
			p, err := sem.TryAcquire(bg())
			if err != nil {
				t.Fatalf("TryAcquire %d: %v", i, err)
			}
			permits = append(permits, p)
		}
		if _, err := sem.TryAcquire(bg()); !errors.Is(err, sqllock.ErrNotAcquired) {
			t.Fatalf("a fourth TryAcquire = %v, want ErrNotAcquired", err)
		}
		slots := map[sqllock.Key]bool{}
		for _, p := range permits {
			slots[p.Key()] = true
		}
		for _, k := range sqllock.SemaphoreSlots("exports", 3) {
			if !slots[k] {
				t.Fatalf("slot %v not taken; permits %v", k, slots)
			}
		}
		// Inspect, given the semaphore in a registry, names its slots.
		reg := sqllock.NewRegistry()
		if err := reg.RegisterSemaphore("exports", 3); err != nil {
			t.Fatal(err)
		}
		locks, err := sqllock.Inspect(bg(), db, sqllock.WithRegistry(reg))
		if err != nil || len(locks) != 3 {
			t.Fatalf("Inspect = %v, %v", locks, err)
		}
		for _, l := range locks {
			if l.Semaphore != "exports" || !strings.HasPrefix(l.Name, "exports[") {
				t.Fatalf("slot row %+v: want semaphore exports, name exports[i]", l)
			}
		}
		// A waiter is served when a slot frees.
		got := make(chan error, 1)
		go func() {
			p, err := sem.Acquire(bg())
			if err == nil {
				err = p.Unlock(bg())
			}
			got <- err
		}()
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		if err := permits[1].Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		t.Logf("waiter served %v after a slot freed", time.Since(start).Round(time.Millisecond))
		permits[0].Unlock(bg())
		permits[2].Unlock(bg())
		waitNoLocks(t, db, 5*time.Second)
	})
}

// TestSemaphoreProcesses: 3 OS processes × 8 goroutines share a semaphore
// of 3 slots, with waits whose deadlines race the releases: never more
// than 3 inside (checked by the workers, and by pg_locks from here), every
// worker gets in, and no slot stays held.
func TestSemaphoreProcesses(t *testing.T) {
	run := 10 * time.Second
	if testing.Short() && os.Getenv("CI") != "true" {
		run = 3 * time.Second
	}
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) {
			srv := pgtest.Start(t)
			dsn := srv.NewDatabase(t)
			observer := pgtest.Open(t, "pgx", dsn)
			dir := t.TempDir()
			until := time.Now().Add(run).UnixMilli()
			var wg sync.WaitGroup
			outs := make([]bytes.Buffer, 3)
			errs := make([]error, 3)
			for i := range outs {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=semaphore", "HELPER_DRIVER="+drv, "HELPER_DSN="+dsn,
					"HELPER_DIR="+dir, "HELPER_UNTIL="+strconv.FormatInt(until, 10))
				cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = cmd.Run() }()
			}
			slots := map[sqllock.Key]bool{}
			for _, k := range sqllock.SemaphoreSlots("reports", 3) {
				slots[k] = true
			}
			most := 0
			for time.Now().UnixMilli() < until {
				locks, err := sqllock.Inspect(bg(), observer)
				if err != nil {
					t.Fatal(err)
				}
				held := 0
				for _, l := range locks {
					if l.Granted && slots[l.Key] {
						held++
					}
				}
				most = max(most, held)
				time.Sleep(20 * time.Millisecond)
			}
			wg.Wait()
			for i, err := range errs {
				t.Logf("process %d: %s", i, bytes.TrimSpace(outs[i].Bytes()))
				if err != nil {
					t.Errorf("process %d: %v: %s", i, err, outs[i].String())
				}
			}
			t.Logf("most slots held at once, as pg_locks showed them: %d", most)
			if most > 3 {
				t.Fatalf("pg_locks showed %d slots held at once", most)
			}
			waitNoLocks(t, observer, 10*time.Second)
		})
	}
}
