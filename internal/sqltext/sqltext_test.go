package sqltext

import (
	"database/sql/driver"
	"strconv"
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
		want Mode
	}{
		{"lib/pq renders keys (one round trip instead of two)", &pq.Driver{}, Inline},
		{"pgx binds keys (its statement cache)", stdlib.GetDefaultDriver(), Bind},
		{"any other driver binds keys", otherDriver{}, Bind},
	}
	for _, tt := range tests {
		if got := DetectMode(tt.d); got != tt.want {
			t.Errorf("%s: detectMode = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestStatements(t *testing.T) {
	bind, inline := NewStatements(Bind, "T", "U"), NewStatements(Inline, "T", "U")
	tests := []struct {
		q    string
		args []any
		want string
		n    int
	}{
		{q: first(bind.TrySQL(Try, Key{V: 5}, "m.1")), args: second(bind.TrySQL(Try, Key{V: 5}, "m.1")),
			want: "/* sqllock: try */ SELECT CASE WHEN coalesce(current_setting('sqllock.owner', true), '') IN ('', o.m) THEN CASE WHEN pg_try_advisory_lock($1) THEN T IS NOT NULL ELSE false END END, pg_backend_pid(), pg_is_in_recovery() FROM (SELECT $2::text AS m OFFSET 0) AS o", n: 2},
		{q: first(inline.TrySQL(Try|Shared, Key{Pair: true, Class: -1, ID: 2}, "m.1")), args: second(inline.TrySQL(Try|Shared, Key{Pair: true, Class: -1, ID: 2}, "m.1")),
			want: "/* sqllock: try */ SELECT CASE WHEN coalesce(current_setting('sqllock.owner', true), '') IN ('', o.m) THEN CASE WHEN pg_try_advisory_lock_shared(-1, 2) THEN T IS NOT NULL ELSE false END END, pg_backend_pid(), pg_is_in_recovery() FROM (SELECT 'm.1'::text AS m OFFSET 0) AS o"},
		{q: first(Plain(Bind).TrySQL(Try, Key{V: 5}, "m.1")), args: second(Plain(Bind).TrySQL(Try, Key{V: 5}, "m.1")),
			want: "/* sqllock: try */ SELECT CASE WHEN current_setting('sqllock.owner', true) = $2::text THEN pg_try_advisory_lock($1) END", n: 2},
		{q: first(Plain(Inline).TrySQL(Try|Shared, Key{V: -5}, "m.1")), args: second(Plain(Inline).TrySQL(Try|Shared, Key{V: -5}, "m.1")),
			want: "/* sqllock: try */ SELECT CASE WHEN current_setting('sqllock.owner', true) = 'm.1'::text THEN pg_try_advisory_lock_shared((-5)::bigint) END"},
		{q: first(Plain(Inline).UnlockSQL(false, Key{V: 7}, 42)), args: second(Plain(Inline).UnlockSQL(false, Key{V: 7}, 42)),
			want: "/* sqllock: unlock */ SELECT pg_advisory_unlock((7)::bigint) WHERE pg_backend_pid() = 42"},
		{q: first(Plain(Bind).UnlockSQL(true, Key{V: 7}, 42)), args: second(Plain(Bind).UnlockSQL(true, Key{V: 7}, 42)),
			want: "/* sqllock: unlock */ SELECT pg_advisory_unlock_shared($1) WHERE pg_backend_pid() = $2::int4", n: 2},
		{q: first(inline.UnlockSQL(false, Key{V: 7}, 42)), args: second(inline.UnlockSQL(false, Key{V: 7}, 42)),
			want: "/* sqllock: unlock */ SELECT CASE WHEN pg_advisory_unlock((7)::bigint) THEN U IS NOT NULL ELSE false END WHERE pg_backend_pid() = 42"},
		{q: first(bind.UnlockSQL(true, Key{Pair: true, Class: 3, ID: 4}, 42)), args: second(bind.UnlockSQL(true, Key{Pair: true, Class: 3, ID: 4}, 42)),
			want: "/* sqllock: unlock */ SELECT CASE WHEN pg_advisory_unlock_shared($1, $2) THEN U IS NOT NULL ELSE false END WHERE pg_backend_pid() = $3::int4", n: 3},
		{q: first(bind.WaitSQL(0, Key{V: 1}, "0", "m.1")), args: second(bind.WaitSQL(0, Key{V: 1}, "0", "m.1")),
			want: "/* sqllock: wait */ SELECT T IS NOT NULL, pg_backend_pid(), pg_is_in_recovery() FROM (SELECT $3::text AS m OFFSET 0) AS o, LATERAL (SELECT CASE WHEN coalesce(current_setting('sqllock.owner', true), '') IN ('', o.m) THEN set_config('lock_timeout', $2, true) END OFFSET 0) AS s(v), LATERAL (SELECT pg_advisory_lock($1) WHERE s.v IS NOT NULL) AS l", n: 3},
	}
	for _, tt := range tests {
		if tt.q != tt.want || len(tt.args) != tt.n {
			t.Errorf("statement = %q, %v; want %q with %d args", tt.q, tt.args, tt.want, tt.n)
		}
	}
	if q, _ := Bind.XactLockSQL(Shared, Key{V: 1}); q != "/* sqllock: wait */ SELECT true FROM pg_advisory_xact_lock_shared($1)" {
		t.Errorf("XactLockSQL = %q", q)
	}
	// Every transaction-level call's first statement, whether it may wait
	// or not: the try function, called only off a standby.
	for _, kind := range []Kind{0, Try} {
		if q, _ := Bind.XactTrySQL(kind|Shared, Key{V: 1}); q != "/* sqllock: try */ SELECT CASE WHEN s.r THEN false ELSE pg_try_advisory_xact_lock_shared($1) END, pg_backend_pid(), s.r FROM (SELECT pg_is_in_recovery() AS r OFFSET 0) AS s" {
			t.Errorf("XactTrySQL(%d) = %q", kind, q)
		}
	}
	if q, args := Inline.XactTrySQL(0, Key{Pair: true, Class: 3, ID: -4}); q != "/* sqllock: try */ SELECT CASE WHEN s.r THEN false ELSE pg_try_advisory_xact_lock(3, -4) END, pg_backend_pid(), s.r FROM (SELECT pg_is_in_recovery() AS r OFFSET 0) AS s" || len(args) != 0 {
		t.Errorf("inline XactTrySQL = %q, %v", q, args)
	}
}

func first(q string, _ []any) string { return q }
func second(_ string, a []any) []any { return a }

// TestLockFuncs: every kind names its PostgreSQL function, and the cached
// bind-mode statements match the ones built on demand.
func TestLockFuncs(t *testing.T) {
	want := map[Kind]string{
		0: "pg_advisory_lock", Try: "pg_try_advisory_lock", Shared: "pg_advisory_lock_shared",
		Try | Shared: "pg_try_advisory_lock_shared", Xact: "pg_advisory_xact_lock",
		Xact | Try: "pg_try_advisory_xact_lock", Xact | Shared: "pg_advisory_xact_lock_shared",
		Xact | Try | Shared: "pg_try_advisory_xact_lock_shared",
	}
	for kind, fn := range want {
		if kind.Fn() != fn {
			t.Errorf("Kind(%d).Fn() = %q, want %q", kind, kind.Fn(), fn)
		}
		if kind&Xact == 0 {
			continue
		}
		for _, k := range []Key{Key{V: 9}, Key{Pair: true, Class: 1, ID: 2}} {
			// A try kind's first statement calls its function; a waiting
			// kind's wait statement does (the first statement tries).
			cached, built := first(Bind.XactTrySQL(kind, k)), first(Bind.BuildXactTrySQL(kind, k))
			if !kind.IsTry() {
				cached, built = first(Bind.XactLockSQL(kind, k)), first(Bind.BuildXactLockSQL(kind, k))
			}
			if cached != built || !strings.Contains(cached, fn+"(") {
				t.Errorf("kind %d, key %v: cached %q, built %q", kind, k, cached, built)
			}
		}
	}
	bind := NewStatements(Bind, "T", "U")
	for _, shared := range []bool{false, true} {
		for _, k := range []Key{Key{V: 9}, Key{Pair: true, Class: 1, ID: 2}} {
			pairs := [][2]string{
				{first(bind.UnlockSQL(shared, k, 1)), first(bind.BuildUnlockSQL(shared, k, 1))},
				{first(bind.TrySQL(Try|SharedKind(shared), k, "m")), first(bind.BuildTrySQL(Try|SharedKind(shared), k, "m"))},
				{first(bind.WaitSQL(SharedKind(shared), k, "1ms", "m")), first(bind.BuildWaitSQL(SharedKind(shared), k, "1ms", "m"))},
			}
			for _, p := range pairs {
				if p[0] != p[1] {
					t.Errorf("shared=%v key %v: cached %q, built %q", shared, k, p[0], p[1])
				}
			}
		}
	}
}

// TestSettings: Tune sets what a lock session needs, for the server's
// major version, and Untune resets exactly that.
func TestSettings(t *testing.T) {
	st := Settings{Idle: 10, Interval: 5, Count: 4, UserTimeoutMs: 30000, AppName: "app", Major: 16}
	tune, untune := st.Tune(), st.Untune()
	for _, want := range []string{"'tcp_keepalives_idle', '10'", "'tcp_keepalives_interval', '5'", "'tcp_keepalives_count', '4'", "'tcp_user_timeout', '30000'",
		"'client_connection_check_interval', '5s'", "'idle_session_timeout', '0'", "'application_name', 'app'"} {
		if !strings.Contains(tune, want) {
			t.Errorf("Tune lacks %s: %s", want, tune)
		}
	}
	for _, name := range []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout",
		"client_connection_check_interval", "idle_session_timeout", "application_name"} {
		if !strings.Contains(untune, "set_config('"+name+"', NULL, false)") {
			t.Errorf("Untune lacks %s: %s", name, untune)
		}
	}
	old := Settings{Idle: 10, Interval: 5, Count: 4, UserTimeoutMs: 30000, Major: 13}
	if s := old.Tune() + old.Untune(); strings.Contains(s, "idle_session_timeout") || strings.Contains(s, "client_connection_check_interval") {
		t.Errorf("PostgreSQL 13 has no idle_session_timeout nor client_connection_check_interval: %s", s)
	}
	if s := (Settings{Major: 16}).Untune(); strings.Contains(s, "tcp_") || strings.Contains(s, "application_name") {
		t.Errorf("Untune resets what Tune never set: %s", s)
	}
}

// TestTagArgs: in Inline mode, every statement that takes a lock tag has
// all of its parameters rendered (lib/pq would otherwise prepare it), and
// in Bind mode it keeps three.
func TestTagArgs(t *testing.T) {
	for name, q := range map[string]string{"TokenSQL": TokenSQL, "HeldSQL": HeldSQL, "LeaderSQL": LeaderSQL} {
		if got, args := Inline.TagArgs(q, 0, -7, 1); strings.Contains(got, "$") || args != nil {
			t.Errorf("Inline.TagArgs(%s) = %q, %v: parameters left", name, got, args)
		} else if !strings.Contains(got, "(-7)::int8") {
			t.Errorf("Inline.TagArgs(%s) = %q: want the objid rendered", name, got)
		}
		if got, args := Bind.TagArgs(q, 0, 7, 1); got != q || len(args) != 3 {
			t.Errorf("Bind.TagArgs(%s) = %q, %v; want the statement and 3 arguments", name, got, args)
		}
	}
	if got, args := Inline.ObserveArgs(0, -7, 1, -9, true); strings.Contains(got, "$") || args != nil || !strings.Contains(got, "(-9)::int8") || !strings.Contains(got, "true::bool") {
		t.Errorf("Inline.ObserveArgs = %q, %v: want every parameter rendered", got, args)
	}
	if got, args := Bind.ObserveArgs(0, 7, 1, 9, false); got != ObserveSQL || len(args) != 5 {
		t.Errorf("Bind.ObserveArgs = %q, %v; want the statement and 5 arguments", got, args)
	}
}

// TestLineStatementsParams: the line's statements, in Inline mode, have
// every parameter rendered (lib/pq would prepare them otherwise), and in
// Bind mode as many arguments as parameters.
func TestLineStatementsParams(t *testing.T) {
	k, pair := Key{V: -5}, Key{Pair: true, Class: -3, ID: 9}
	for _, mode := range []Mode{Inline, Bind} {
		s := ForSettings(mode, Settings{Major: 16, AppName: "x", IdleTimeoutMs: 30000})
		type stmt struct {
			q    string
			args []any
		}
		var stmts = map[string]func() stmt{
			"RegisterSQL":           func() stmt { q, a := s.RegisterSQL(-7, true, "500ms", "m'1", true); return stmt{q, a} },
			"SliceSQL":              func() stmt { q, a := s.SliceSQL(Shared, k, -7, 3, "500ms", "m"); return stmt{q, a} },
			"SliceSQL pair":         func() stmt { q, a := s.SliceSQL(0, pair, -7, 3, "500ms", "m"); return stmt{q, a} },
			"LeaveLineSQL":          func() stmt { q, a := s.LeaveLineSQL(0, k, -7, "m"); return stmt{q, a} },
			"SemaphoreSliceSQL":     func() stmt { q, a := s.SemaphoreSliceSQL(-7, 3, -3, 4, 2, "500ms", "m"); return stmt{q, a} },
			"SemaphoreLeaveLineSQL": func() stmt { q, a := s.SemaphoreLeaveLineSQL(-7, -3, "m"); return stmt{q, a} },
			"PoliteTrySQL":          func() stmt { q, a := s.PoliteTrySQL(Try, k, -7, "m"); return stmt{q, a} },
			"PoliteTrySQL plain":    func() stmt { q, a := Plain(mode).PoliteTrySQL(Try, pair, -7, "m"); return stmt{q, a} },
			"DoorbellSQL":           func() stmt { q, a := mode.DoorbellSQL(42, []int32{-7, -8}, []int32{0, 9}); return stmt{q, a} },
			"PlaceSQL":              func() stmt { q, a := mode.PlaceSQL(-7, true, 42, 9); return stmt{q, a} },
			"PlaceBackSQL":          func() stmt { q, a := mode.PlaceBackSQL(-7, 9, true, 42); return stmt{q, a} },
			"TerminateHolderSQL":    func() stmt { return stmt{TerminateHolderSQL, DiscardHolderArgs(42, k)} },
			"SemaphorePoliteTry":    func() stmt { return stmt{s.SemaphorePoliteTrySQL(-3, 4, -7), []any{"m"}} },
		}
		for name, f := range stmts {
			st := f()
			n := 0
			for i := 1; i <= 20; i++ {
				if strings.Contains(st.q, "$"+strconv.Itoa(i)+"::") {
					n = i
				}
			}
			switch {
			case mode == Inline && name != "TerminateHolderSQL" && name != "SemaphorePoliteTry" && (n != 0 || st.args != nil):
				t.Errorf("Inline %s: $%d left, args %v", name, n, st.args)
			case (mode == Bind || name == "TerminateHolderSQL" || name == "SemaphorePoliteTry") && n != len(st.args):
				t.Errorf("%v %s: %d parameters, %d arguments", mode, name, n, len(st.args))
			}
		}
	}
}

// TestBatchArgs: a batch's arguments bind in the order its text numbers
// them, pair keys packed in the bigint array (class high, id low, both
// signed), the pair flags only when there are pairs; in Inline mode they
// are rendered into the text.
func TestBatchArgs(t *testing.T) {
	keys := []Key{{V: 5}, {Pair: true, Class: -1, ID: 5}, {Pair: true, Class: 5, ID: -1}}
	tests := []struct {
		name    string
		b       Batch
		keys    []Key
		want    []any
		params  []string // in the text
		notWant string
	}{
		{"tries", BatchTry, keys[:1], []any{"{5}"}, []string{"$1::text::int8[]", "pg_try_advisory_lock(u.v)"}, "$2"},
		{"unlocks", BatchUnlock, keys[:1], []any{"{5}"}, []string{"$1::text::int8[]", "pg_advisory_unlock(u.v)"}, "$2"},
		{"mixed", BatchMixed, keys[:1], []any{"{5}", "1"}, []string{"$1::text::int8[]", "u.i <= $2::text::int8"}, "$3"},
		{"pairs", BatchTry, keys, []any{"{5,-4294967291,25769803775}", "{f,t,t}"}, []string{"$1::text::int8[], $2::text::bool[]", "(u.v >> 32)::int4"}, "$3"},
		{"mixed pairs", BatchMixed, keys, []any{"{5,-4294967291,25769803775}", "1", "{f,t,t}"}, []string{"$1::text::int8[], $3::text::bool[]", "u.i <= $2::text::int8"}, "$4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, args := Bind.BatchSQL(tt.b, "42", tt.keys, 1)
			if len(args) != len(tt.want) {
				t.Fatalf("BatchSQL args = %v, want %v", args, tt.want)
			}
			for i := range args {
				if args[i] != tt.want[i] {
					t.Fatalf("BatchSQL args = %v, want %v", args, tt.want)
				}
			}
			for _, p := range tt.params {
				if !strings.Contains(q, p) {
					t.Errorf("BatchSQL text lacks %q: %s", p, q)
				}
			}
			if strings.Contains(q, tt.notWant) || !strings.HasSuffix(q, "WHERE pg_backend_pid() = 42") {
				t.Errorf("BatchSQL text = %s", q)
			}
			iq, iargs := Inline.BatchSQL(tt.b, "42", tt.keys, 1)
			if len(iargs) != 0 || strings.Contains(iq, "$") || !strings.Contains(iq, "'"+tt.want[0].(string)+"'::text::int8[]") {
				t.Errorf("Inline BatchSQL = %s, %v", iq, iargs)
			}
		})
	}
}

// TestOwn: every statement the library sends on a lock session is told
// as its own, as pg_stat_activity shows it (cut to its default 1 kB), in
// both modes, for sessions set up or not, with keys of both forms; the
// statements of a session left by hand (psql, another library) are not.
func TestOwn(t *testing.T) {
	keys := []Key{{V: 5}, {V: -1 << 62}, {Pair: true, Class: -3, ID: 4}}
	many := make([]Key, 300) // a batch whose key array fills the kilobyte
	for i := range many {
		many[i] = Key{V: int64(i) << 40}
	}
	st := Settings{Idle: 10, Interval: 5, Count: 4, UserTimeoutMs: 30000, AppName: "app", Major: 16, IdleTimeoutMs: 30000}
	var qs []string
	add := func(q string, _ []any) { qs = append(qs, q) }
	for _, mode := range []Mode{Bind, Inline} {
		for _, s := range []*Statements{ForSettings(mode, st), ForSettings(mode, Settings{Major: 13}), Plain(mode)} {
			for _, k := range keys {
				for _, kind := range []Kind{Try, Try | Shared} {
					add(s.BuildTrySQL(kind, k, "m.1"))
				}
				for _, kind := range []Kind{0, Shared} {
					add(s.BuildWaitSQL(kind, k, "250ms", "m.1"))
					add(s.GrantedSQL(kind, 1, 2, 1, "m.1"))
				}
				add(s.BuildUnlockSQL(false, k, 42))
				add(s.BuildUnlockSQL(true, k, 42))
			}
			add(s.SessionSQL("m.1"))
			add(s.SetBackSQL(42))
			qs = append(qs, s.SemaphoreTrySQL(7, 64))
		}
		for _, b := range []Batch{BatchTry, BatchUnlock, BatchMixed} {
			add(mode.BatchSQL(b, "42", keys, 1))
			add(mode.BatchSQL(b, "42", many, 100))
		}
		add(mode.AliveSQL(42))
		add(mode.TagArgs(TokenSQL, 1, 2, 1))
		add(mode.TagArgs(HeldSQL, 1, 2, 1))
		add(mode.TagArgs(ProclaimSQL("sqllock-election:host-a", false), 1, 2, 1))
	}
	qs = append(qs, TouchSQL, NoIdleTimeoutSQL, OwnSQL, "PREPARE sqllock_m_1_1 AS SELECT 1", "EXECUTE sqllock_m_1_1('5')", "DEALLOCATE sqllock_m_1_1;")
	for _, q := range qs {
		shown := q
		if len(shown) > 1023 {
			shown = shown[:1023] // track_activity_query_size 1024, with its terminator
		}
		if !Own(shown) {
			t.Errorf("Own(%q) = false, want true", shown)
		}
	}
	for _, q := range []string{"", "<insufficient privilege>", "SELECT pg_advisory_lock(4242)", "select pg_try_advisory_lock(1, 2);",
		"SELECT 1", "BEGIN", "COMMIT", "SELECT pg_backend_pid()", "SELECT pg_advisory_xact_lock(7)", "SHOW application_name",
		"SELECT pg_advisory_unlock(4242)", "SELECT set_config('application_name', 'psql', false), pg_advisory_lock(9)"} {
		if Own(q) {
			t.Errorf("Own(%q) = true, want false", q)
		}
	}
}
