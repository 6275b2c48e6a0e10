package sqltext

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryStatementMarked: every statement this package makes starts
// with a marker that Label reads, in both modes, set up or not: each
// exported name ending in SQL (or SQLTo) is listed here with the texts it
// makes, so a new statement without its marker, or without a place in
// this list, fails.
func TestEveryStatementMarked(t *testing.T) {
	k, pk := Key{V: -7}, Key{Pair: true, Class: 3, ID: -4}
	texts := map[string][]string{}
	add := func(name, q string) { texts[name] = append(texts[name], q) }
	for _, m := range []Mode{Bind, Inline} {
		for _, s := range []*Statements{NewStatements(m, "T", "U"), ForSettings(m, Settings{AppName: "a"}), Plain(m)} {
			for _, key := range []Key{k, pk} {
				for _, kind := range []Kind{0, Shared} {
					add("TrySQL", first(s.TrySQL(kind|Try, key, "m.1")))
					add("TrySQLTo", first(s.TrySQLTo(nil, kind|Try, key, "m.1")))
					add("BuildTrySQL", first(s.BuildTrySQL(kind|Try, key, "m.1")))
					add("WaitSQL", first(s.WaitSQL(kind, key, "1ms", "m.1")))
					add("BuildWaitSQL", first(s.BuildWaitSQL(kind, key, "1ms", "m.1")))
					add("UnlockSQL", first(s.UnlockSQL(kind.IsShared(), key, 42)))
					add("UnlockSQLTo", first(s.UnlockSQLTo(nil, kind.IsShared(), key, int64(42))))
					add("BuildUnlockSQL", first(s.BuildUnlockSQL(kind.IsShared(), key, 42)))
					add("GrantedSQL", first(s.GrantedSQL(kind, 1, 2, 1, "m.1")))
					add("PoliteTrySQL", first(s.PoliteTrySQL(kind, key, -9, "m.1")))
					add("SliceSQL", first(s.SliceSQL(kind, key, -9, 5, "1ms", "m.1")))
					add("LeaveLineSQL", first(s.LeaveLineSQL(kind, key, -9, "m.1")))
					add("RegisterSQL", first(s.RegisterSQL(-9, kind.IsShared(), "1ms", "m.1", true)))
					add("XactTrySQL", first(m.XactTrySQL(kind, key)))
					add("BuildXactTrySQL", first(m.BuildXactTrySQL(kind, key)))
					add("XactLockSQL", first(m.XactLockSQL(kind, key)))
					add("BuildXactLockSQL", first(m.BuildXactLockSQL(kind, key)))
					add("XactDeadlineLockSQL", first(m.XactDeadlineLockSQL(kind, key, "1ms")))
				}
			}
			add("SemaphoreTrySQL", s.SemaphoreTrySQL(-5, 3))
			add("SemaphorePoliteTrySQL", s.SemaphorePoliteTrySQL(-5, 3, -9))
			add("SemaphoreSliceSQL", first(s.SemaphoreSliceSQL(-9, 5, -5, 3, 1, "1ms", "m.1")))
			add("SemaphoreLeaveLineSQL", first(s.SemaphoreLeaveLineSQL(-9, -5, "m.1")))
			add("SessionSQL", first(s.SessionSQL("m.1")))
			add("SetBackSQL", first(s.SetBackSQL(42)))
		}
		add("AliveSQL", first(m.AliveSQL(42)))
		add("DoorbellSQL", first(m.DoorbellSQL(42, []int32{-9, -8}, []int32{0, 7})))
		add("PlaceSQL", first(m.PlaceSQL(-9, false, 42, 0)))
		add("PlaceSQL", first(m.PlaceSQL(-9, true, 42, 7)))
		add("PlaceBackSQL", first(m.PlaceBackSQL(-9, 7, false, 42)))
		add("PlaceBackSQL", first(m.PlaceBackSQL(-9, 7, true, 42)))
		for b := range Batch(BatchKinds) {
			add("BatchSQL", first(m.BatchSQL(b, "42", []Key{k, pk}, 1)))
		}
	}
	for _, q := range []string{CancelWaitSQL, CandidatesSQL, HeldSQL, InspectSQL, LeaderSQL, NoIdleTimeoutSQL, ObserveSQL, OwnSQL,
		PlainVersionSQL, RecoverySQL, TerminateHolderSQL, TokenSQL, TouchSQL, WaitSliceSQL, KeepAliveSQL, VersionSQL,
		DeadlockTimeoutSQL, SavepointSQL, ReleaseSavepointSQL, RollbackToSavepointSQL, ClockSQL, BreakSQL, BackendSQL, BeginPinnedSQL, CommitPinnedSQL, TokenOfSQL, ClearSnapshotSQL, WaitedOnSQL, WaitedOnMeSQL,
		DoctorVersionSQL, DoctorServerSQL, DoctorSettingsSQL, DoctorLocksSQL} {
		add("const", q)
	}
	add("DoctorRoundSQL", DoctorRoundSQL("n0nce"))
	add("DoctorPinSQL", DoctorPinSQL("n0nce"))
	add("ProclaimSQL", ProclaimSQL("a", false))
	add("ProclaimSQL", ProclaimSQL("a", true))
	add("StrandedSQL", StrandedSQL(false))
	add("StrandedSQL", StrandedSQL(true))
	add("PrepareSQL", PrepareSQL("sqllock_x_1", first(Plain(Inline).TrySQL(Try, k, "m.1"))))
	add("DeallocateSQL", DeallocateSQL([]string{"sqllock_x_1", "sqllock_x_2"}))
	for name, qs := range texts {
		for _, q := range qs {
			if l, ok := Label(q); !ok || !strings.HasPrefix(q, Marker(q)) || Unmarked(q) == q {
				t.Errorf("%s made %.80q...: no marker (Label = %q, %v)", name, q, l, ok)
			}
		}
	}
	// Every exported name ending in SQL is above.
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			var names []string
			switch d := d.(type) {
			case *ast.FuncDecl:
				names = append(names, d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if v, ok := s.(*ast.ValueSpec); ok {
						for _, n := range v.Names {
							names = append(names, n.Name)
						}
					}
				}
			}
			for _, n := range names {
				if !ast.IsExported(n) || !strings.HasSuffix(n, "SQL") && !strings.HasSuffix(n, "SQLTo") {
					continue
				}
				if _, ok := texts[n]; !ok && !constListed(n) {
					t.Errorf("%s is not checked here: add what it makes", n)
				}
			}
		}
	}
}

// constListed reports whether the exported constant or variable n is in
// TestEveryStatementMarked's list.
func constListed(n string) bool {
	switch n {
	case "CancelWaitSQL", "CandidatesSQL", "HeldSQL", "InspectSQL", "LeaderSQL", "NoIdleTimeoutSQL", "ObserveSQL", "OwnSQL",
		"PlainVersionSQL", "RecoverySQL", "TerminateHolderSQL", "TokenSQL", "TouchSQL", "WaitSliceSQL", "KeepAliveSQL", "VersionSQL",
		"DeadlockTimeoutSQL", "SavepointSQL", "ReleaseSavepointSQL", "RollbackToSavepointSQL", "ClockSQL", "BreakSQL", "BackendSQL", "BeginPinnedSQL", "CommitPinnedSQL", "TokenOfSQL", "ClearSnapshotSQL", "WaitedOnSQL", "WaitedOnMeSQL",
		"DoctorVersionSQL", "DoctorServerSQL", "DoctorSettingsSQL", "DoctorLocksSQL":
		return true
	}
	return false
}

// TestLabel: Label names a statement by its marker, and nothing else.
func TestLabel(t *testing.T) {
	tests := []struct {
		q, want string
		ok      bool
	}{
		{"/* sqllock: wait */ SELECT 1", "sqllock: wait", true},
		{"/* sqllock: keep-alive */ WITH s AS (SELECT 1) SELECT 1", "sqllock: keep-alive", true},
		{"/* sqllock: try */ EXECUTE sqllock_m_1('5')", "sqllock: try", true},
		{"SELECT pg_advisory_lock(1)", "", false},
		{"/* sqllock: */ SELECT 1", "", false},
		{"/* sqllock: wait SELECT 1", "", false},
		{"/* sqllock: DROP TABLE x; */ SELECT 1", "", false},
		{"/* sqllock: a label far too long to be one of ours */ SELECT 1", "", false},
		{" /* sqllock: wait */ SELECT 1", "", false},
	}
	for _, tt := range tests {
		if got, ok := Label(tt.q); got != tt.want || ok != tt.ok {
			t.Errorf("Label(%q) = %q, %v; want %q, %v", tt.q, got, ok, tt.want, tt.ok)
		}
	}
}
