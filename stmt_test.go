package sqllock

import (
	"database/sql/driver"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
)

type otherDriver struct{ driver.Driver }

func TestDetectMode(t *testing.T) {
	tests := []struct {
		name string
		d    driver.Driver
		want stmtMode
	}{
		{"lib/pq renders keys (one round trip instead of two)", &pq.Driver{}, inlineKeys},
		{"pgx binds keys (its statement cache)", stdlib.GetDefaultDriver(), bindKeys},
		{"any other driver binds keys", otherDriver{}, bindKeys},
	}
	for _, tt := range tests {
		if got := detectMode(tt.d); got != tt.want {
			t.Errorf("%s: detectMode = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestStatements(t *testing.T) {
	tests := []struct {
		mode stmtMode
		kind lockKind
		k    Key
		want string
		args int
	}{
		{bindKeys, kindTry, Int64(5), "SELECT pg_try_advisory_lock($1), pg_backend_pid(), pg_is_in_recovery()", 1},
		{bindKeys, kindShared, Pair(1, 2), "SELECT true, pg_backend_pid(), pg_is_in_recovery() FROM pg_advisory_lock_shared($1, $2)", 2},
		{inlineKeys, kindTry, Int64(-5), "SELECT pg_try_advisory_lock((-5)::bigint), pg_backend_pid(), pg_is_in_recovery()", 0},
		{inlineKeys, 0, Pair(-1, 2), "SELECT true, pg_backend_pid(), pg_is_in_recovery() FROM pg_advisory_lock(-1, 2)", 0},
	}
	for _, tt := range tests {
		q, args := tt.mode.sessionLockSQL(tt.kind, tt.k)
		if q != tt.want || len(args) != tt.args {
			t.Errorf("sessionLockSQL(%v, %v) = %q, %v; want %q with %d args", tt.kind, tt.k, q, args, tt.want, tt.args)
		}
	}
	q, args := inlineKeys.unlockSQL(false, Int64(7), 42)
	if q != "SELECT pg_advisory_unlock((7)::bigint) WHERE pg_backend_pid() = 42" || len(args) != 0 {
		t.Errorf("inline unlockSQL = %q, %v", q, args)
	}
	q, args = bindKeys.unlockSQL(true, Pair(3, 4), 42)
	if q != "SELECT pg_advisory_unlock_shared($1, $2) WHERE pg_backend_pid() = $3::int4" || len(args) != 3 || args[2] != int64(42) {
		t.Errorf("bind unlockSQL = %q, %v", q, args)
	}
	if q, _ := bindKeys.xactLockSQL(kindTry|kindShared, Int64(1)); q != "SELECT pg_try_advisory_xact_lock_shared($1)" {
		t.Errorf("xactLockSQL = %q", q)
	}
}

// TestLockFuncs: every kind names its PostgreSQL function, and the cached
// bind-mode statements match the ones built on demand.
func TestLockFuncs(t *testing.T) {
	want := map[lockKind]string{
		0: "pg_advisory_lock", kindTry: "pg_try_advisory_lock", kindShared: "pg_advisory_lock_shared",
		kindTry | kindShared: "pg_try_advisory_lock_shared", kindXact: "pg_advisory_xact_lock",
		kindXact | kindTry: "pg_try_advisory_xact_lock", kindXact | kindShared: "pg_advisory_xact_lock_shared",
		kindXact | kindTry | kindShared: "pg_try_advisory_xact_lock_shared",
	}
	for kind, fn := range want {
		if kind.fn() != fn {
			t.Errorf("lockKind(%d).fn() = %q, want %q", kind, kind.fn(), fn)
		}
		for _, k := range []Key{Int64(9), Pair(1, 2)} {
			var cached, built string
			if kind&kindXact != 0 {
				cached, _ = bindKeys.xactLockSQL(kind, k)
				built, _ = bindKeys.buildXactLockSQL(kind, k)
			} else {
				cached, _ = bindKeys.sessionLockSQL(kind, k)
				built, _ = bindKeys.buildSessionLockSQL(kind, k)
			}
			if cached != built || !strings.Contains(cached, fn+"(") {
				t.Errorf("kind %d, key %v: cached %q, built %q", kind, k, cached, built)
			}
		}
	}
	for _, shared := range []bool{false, true} {
		for _, k := range []Key{Int64(9), Pair(1, 2)} {
			cached, _ := bindKeys.unlockSQL(shared, k, 1)
			built, _ := bindKeys.buildUnlockSQL(shared, k, 1)
			if cached != built || !strings.Contains(cached, unlockFn(shared)+"(") {
				t.Errorf("unlock shared=%v key %v: cached %q, built %q", shared, k, cached, built)
			}
		}
	}
}
