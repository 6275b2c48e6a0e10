package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/jmoiron/sqlx"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
	"github.com/sqllock/sqllock/sqllockmock"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

var day = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

// TestGenerateDailyUnit is a unit test with go-sqlmock: sqllockmock
// registers the lock statement, the test only writes its own SQL.
func TestGenerateDailyUnit(t *testing.T) {
	for _, exists := range []bool{false, true} {
		mockDB, mock, err := sqlmock.New()
		if err != nil {
			t.Fatal(err)
		}
		repo := NewReportRepo(sqlx.NewDb(mockDB, "pgx"))
		mock.ExpectBegin()
		sqllockmock.ExpectLockTx(mock, ReportKey(day))
		mock.ExpectQuery("SELECT EXISTS").WithArgs("2026-11-29").
			WillReturnRows(sqlmock.NewRows([]string{"exists"}).AddRow(exists))
		if !exists {
			mock.ExpectExec("INSERT INTO daily_reports").WithArgs("2026-11-29").WillReturnResult(sqlmock.NewResult(1, 1))
			mock.ExpectCommit()
		} else {
			mock.ExpectRollback()
		}
		generated, err := repo.GenerateDaily(context.Background(), day)
		if err != nil || generated == exists {
			t.Fatalf("exists=%v: GenerateDaily() = %v, %v", exists, generated, err)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatal(err)
		}
		mockDB.Close()
	}
}

// TestGenerateDailyIntegration runs 8 concurrent calls against PostgreSQL:
// exactly one generates the report.
func TestGenerateDailyIntegration(t *testing.T) {
	srv := pgtest.Start(t)
	db := sqlx.NewDb(pgtest.Open(t, "pgx", srv.NewDatabase(t)), "pgx")
	if _, err := db.Exec(Schema); err != nil {
		t.Fatal(err)
	}
	repo := NewReportRepo(db)
	var generated atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := repo.GenerateDaily(context.Background(), day)
			if err != nil {
				t.Error(err)
			}
			if ok {
				generated.Add(1)
			}
		}()
	}
	wg.Wait()
	reports, err := repo.Reports(context.Background())
	if generated.Load() != 1 || err != nil || len(reports) != 1 || reports[0].Posts != 3 {
		t.Fatalf("generated %d times, reports %+v, %v", generated.Load(), reports, err)
	}
	// Recount takes the same lock through sqllock.InTxWith and a *sqlx.Tx:
	// while another transaction holds it, Recount waits.
	if _, err := db.Exec(`INSERT INTO posts (body) VALUES ('one more')`); err != nil {
		t.Fatal(err)
	}
	holder, err := db.BeginTxx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sqllock.LockTx(context.Background(), holder, ReportKey(day)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- repo.Recount(context.Background(), day) }()
	select {
	case err := <-done:
		t.Fatalf("Recount ran while the lock was held: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	holder.Rollback()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if reports, err := repo.Reports(context.Background()); err != nil || reports[0].Posts != 4 {
		t.Fatalf("after Recount: %+v, %v", reports, err)
	}
}

func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), &out); err != nil {
		t.Fatalf("run() = %v\n%s", err, out.String())
	}
	s := out.String()
	if strings.Count(s, "generated=true") != 1 || strings.Count(s, "generated=false") != 3 ||
		!strings.Contains(s, "report 2026-11-29: 3 posts") || !strings.Contains(s, "advisory locks left: 0") {
		t.Fatalf("unexpected output:\n%s", s)
	}
}
