package main

import (
	"context"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sqllock/sqllock"
)

// ReportsClass is the key namespace of the reports module: its locks are
// Pair(ReportsClass, day number), so they can never collide with another
// module's.
const ReportsClass int32 = 3

// ReportKey returns the lock key of the daily report for day.
func ReportKey(day time.Time) sqllock.Key {
	return sqllock.Pair(ReportsClass, int32(day.UTC().Unix()/86400))
}

// ReportRepo generates and reads daily reports.
type ReportRepo struct {
	db     *sqlx.DB
	locker *sqllock.Locker
}

// NewReportRepo returns a repository on db.
func NewReportRepo(db *sqlx.DB) *ReportRepo {
	return &ReportRepo{db: db, locker: sqllock.New(db.DB)}
}

// GenerateDaily generates the report of day unless it exists, and reports
// whether this call generated it. Any number of instances may call it at
// once: a transaction-scoped lock on the day's key serialises them, and the
// lock is released when the transaction commits or rolls back.
func (r *ReportRepo) GenerateDaily(ctx context.Context, day time.Time) (generated bool, err error) {
	tx, err := r.db.BeginTxx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	if err := sqllock.LockTx(ctx, tx, ReportKey(day)); err != nil {
		return false, err
	}
	var exists bool
	if err := tx.GetContext(ctx, &exists, `SELECT EXISTS (SELECT 1 FROM daily_reports WHERE day = $1)`, day.Format(time.DateOnly)); err != nil {
		return false, err
	}
	if exists {
		return false, tx.Rollback()
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO daily_reports (day, posts) SELECT $1, count(*) FROM posts`, day.Format(time.DateOnly)); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// Recount recomputes the report of day, under the same lock as
// GenerateDaily. sqllock.InTxWith begins the transaction with sqlx, takes
// the lock in it, and hands fn the *sqlx.Tx; it commits when fn returns nil
// and rolls back otherwise.
func (r *ReportRepo) Recount(ctx context.Context, day time.Time) error {
	begin := func(ctx context.Context) (*sqlx.Tx, error) { return r.db.BeginTxx(ctx, nil) }
	return sqllock.InTxWith(ctx, r.locker, ReportKey(day), begin, func(tx *sqlx.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE daily_reports SET posts = (SELECT count(*) FROM posts) WHERE day = $1`, day.Format(time.DateOnly))
		return err
	})
}

// Report is one row of daily_reports.
type Report struct {
	Day   time.Time `db:"day"`
	Posts int       `db:"posts"`
}

// Reports returns all reports, oldest first.
func (r *ReportRepo) Reports(ctx context.Context) ([]Report, error) {
	var out []Report
	err := r.db.SelectContext(ctx, &out, `SELECT day, posts FROM daily_reports ORDER BY day`)
	return out, err
}

// Schema creates the example's tables.
const Schema = `
CREATE TABLE IF NOT EXISTS posts (id bigserial PRIMARY KEY, body text NOT NULL);
CREATE TABLE IF NOT EXISTS daily_reports (day date PRIMARY KEY, posts int NOT NULL);
INSERT INTO posts (body) VALUES ('hello'), ('advisory locks'), ('sqlx');`
