package sqllock_test

import (
	"context"
	"math"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/pgtest"
)

// TestLockTagGroundTruth takes pg_advisory_lock on edge keys in both forms
// and reads back from pg_locks how PostgreSQL stores each one. It is the
// ground truth the key decoding in Inspect is built on.
func TestLockTagGroundTruth(t *testing.T) {
	t.Parallel()
	srv := pgtest.Start(t)
	db := pgtest.Open(t, "pgx", srv.NewDatabase(t))
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tests := []struct {
		key      sqllock.Key
		sql      string
		classid  int64
		objid    int64
		objsubid int
	}{
		{sqllock.Int64(12345), "SELECT pg_advisory_lock(12345::bigint)", 0, 12345, 1},
		{sqllock.Int64(-1), "SELECT pg_advisory_lock((-1)::bigint)", math.MaxUint32, math.MaxUint32, 1},
		{sqllock.Int64(1<<40 + 5), "SELECT pg_advisory_lock(1099511627781)", 256, 5, 1},
		{sqllock.Int64(math.MaxInt64), "SELECT pg_advisory_lock(9223372036854775807)", math.MaxInt32, math.MaxUint32, 1},
		{sqllock.Int64(math.MinInt64), "SELECT pg_advisory_lock((-9223372036854775808)::bigint)", 1 << 31, 0, 1},
		{sqllock.Pair(1, 2), "SELECT pg_advisory_lock(1, 2)", 1, 2, 2},
		{sqllock.Pair(-1, -2), "SELECT pg_advisory_lock(-1, -2)", math.MaxUint32, math.MaxUint32 - 1, 2},
		{sqllock.Pair(math.MinInt32, math.MaxInt32), "SELECT pg_advisory_lock(-2147483648, 2147483647)", 1 << 31, math.MaxInt32, 2},
		{sqllock.Pair(0, 12345), "SELECT pg_advisory_lock(0, 12345)", 0, 12345, 2},
	}
	for _, tt := range tests {
		t.Run(tt.key.String(), func(t *testing.T) {
			if _, err := conn.ExecContext(ctx, tt.sql); err != nil {
				t.Fatal(err)
			}
			var classid, objid, signed int64
			var objsubid int
			err := conn.QueryRowContext(ctx, `SELECT classid::bigint, objid::bigint, objsubid::int,
				(classid::bigint << 32) | objid::bigint
				FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
				AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = $3`,
				tt.classid, tt.objid, tt.objsubid).Scan(&classid, &objid, &objsubid, &signed)
			if err != nil {
				t.Fatalf("lock %v not found in pg_locks as (%d,%d,%d): %v", tt.key, tt.classid, tt.objid, tt.objsubid, err)
			}
			if v, ok := tt.key.Int64(); ok && signed != v {
				t.Errorf("(classid << 32) | objid = %d, want %d", signed, v)
			}
			parsed, err := sqllock.ParseKey(tt.key.String())
			if err != nil || parsed != tt.key {
				t.Errorf("ParseKey(String()) = %v, %v", parsed, err)
			}
		})
	}
	// Int64(12345) and Pair(0, 12345) are both held by this session: two rows.
	var n int
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND pid = pg_backend_pid() AND classid = 0 AND objid = 12345`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows for 12345 in both forms = %d, %v; want 2 (disjoint key spaces)", n, err)
	}
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
}
