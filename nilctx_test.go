package sqllock_test

import (
	"context"
	"database/sql"
	"go/ast"
	"go/parser"
	"go/token"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
)

// quietObserver listens to every lock call and event, and does nothing:
// a Locker with an observer builds its events, which a nil context broke.
type quietObserver struct{}

func (quietObserver) AcquireStart(context.Context, sqllock.Acquisition) func(*sqllock.Lock, error) {
	return func(*sqllock.Lock, error) {}
}

func (quietObserver) Event(context.Context, sqllock.Event) {}

// TestNilContext: every exported call that takes a context panics, when
// given nil, with "sqllock: <Call> called with a nil context", at the call
// and before anything else: the locks held stay held and usable (an
// Unlock(nil) released the lock, then panicked, leaving Err nil), a
// Session stays as it was, a transaction can still be rolled back, and the
// *sql.DB still answers (InTx(nil) and Inspect(nil) handed nil to
// database/sql, which panicked holding its own mutex: every later use of
// the pool hung).
func TestNilContext(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, _ *sql.DB, dsn string) {
		// A pool of the test's own, closed only once it is seen to answer:
		// a pool that database/sql left stuck would hang its Close.
		db, err := sql.Open(path.Base(t.Name()), dsn)
		if err != nil {
			t.Fatal(err)
		}
		l := sqllock.New(db, sqllock.WithObserver(quietObserver{}))
		held, free := sqllock.Int64(71), sqllock.Int64(72)
		lk, err := l.Lock(bg(), held)
		if err != nil {
			t.Fatal(err)
		}
		s, err := l.Session(bg())
		if err != nil {
			t.Fatal(err)
		}
		sessKey := sqllock.Int64(73)
		if err := s.Lock(bg(), sessKey); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(bg(), nil)
		if err != nil {
			t.Fatal(err)
		}
		sem := l.Semaphore("nilctx", 2)
		el := l.Election(sqllock.Int64(74))
		fn := func(context.Context) error { return nil }
		var nilCtx context.Context
		tests := []struct {
			call string
			f    func()
		}{
			{"Lock.Token", func() { lk.Token(nilCtx) }},
			{"Lock.Unlock", func() { lk.Unlock(nilCtx) }},
			{"Locker.Lock", func() { l.Lock(nilCtx, free) }},
			{"Locker.TryLock", func() { l.TryLock(nilCtx, free) }},
			{"Locker.RLock", func() { l.RLock(nilCtx, free) }},
			{"Locker.TryRLock", func() { l.TryRLock(nilCtx, free) }},
			{"Locker.Do", func() { l.Do(nilCtx, free, fn) }},
			{"Locker.TryDo", func() { l.TryDo(nilCtx, free, fn) }},
			{"Locker.Session", func() { l.Session(nilCtx) }},
			{"Locker.InTx", func() { l.InTx(nilCtx, free, nil, func(*sql.Tx) error { return nil }) }},
			{"InTxWith", func() {
				sqllock.InTxWith(nilCtx, l, free, func(ctx context.Context) (*sql.Tx, error) { return db.BeginTx(ctx, nil) },
					func(*sql.Tx) error { return nil })
			}},
			{"LockTx", func() { sqllock.LockTx(nilCtx, tx, free) }},
			{"TryLockTx", func() { sqllock.TryLockTx(nilCtx, tx, free) }},
			{"RLockTx", func() { sqllock.RLockTx(nilCtx, tx, free) }},
			{"TryRLockTx", func() { sqllock.TryRLockTx(nilCtx, tx, free) }},
			{"Inspect", func() { sqllock.Inspect(nilCtx, db, nil) }},
			{"Session.Lock", func() { s.Lock(nilCtx, free) }},
			{"Session.TryLock", func() { s.TryLock(nilCtx, free) }},
			{"Session.Unlock", func() { s.Unlock(nilCtx, sessKey) }},
			{"Session.Close", func() { s.Close(nilCtx) }},
			{"Semaphore.Acquire", func() { sem.Acquire(nilCtx) }},
			{"Semaphore.TryAcquire", func() { sem.TryAcquire(nilCtx) }},
			{"Election.Campaign", func() { el.Campaign(nilCtx, "a") }},
			{"Election.Lead", func() { el.Lead(nilCtx, "a", func(context.Context, *sqllock.Lock) error { return nil }) }},
			{"Election.Leader", func() { el.Leader(nilCtx) }},
			{"Election.Observe", func() { el.Observe(nilCtx) }},
			{"Election.Proclaim", func() { el.Proclaim(nilCtx, "b") }},
			{"Locker.Close", func() { l.Close(nilCtx) }},
		}
		heldStat := l.Stats().Held
		var calls []string
		for _, tt := range tests {
			calls = append(calls, tt.call)
			want := "sqllock: " + tt.call + " called with a nil context"
			if got := panicOf(t, tt.call, tt.f); got != want {
				t.Errorf("%s(nil) panicked with %v, want %q", tt.call, got, want)
			}
			// Nothing changed: the pool answers, the Lock and the Session
			// hold what they held, and nothing else is held.
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			answered := make(chan error, 1)
			go func() { answered <- db.QueryRowContext(ctx, "SELECT 1").Scan(new(int)) }()
			select {
			case err := <-answered:
				if err != nil {
					t.Fatalf("after %s(nil): the pool's query = %v", tt.call, err)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("after %s(nil): the pool does not answer", tt.call)
			}
			cancel()
			if err := lk.Err(); err != nil {
				t.Fatalf("after %s(nil): Lock.Err() = %v, want nil", tt.call, err)
			}
			if err := s.Err(); err != nil || !slices.Equal(s.Held(), []sqllock.Key{sessKey}) {
				t.Fatalf("after %s(nil): Session.Err() = %v, Held() = %v; want nil, [%v]", tt.call, err, s.Held(), sessKey)
			}
			if n := advisoryCount(t, db); n != 2 || l.Stats().Held != heldStat {
				t.Fatalf("after %s(nil): %d advisory locks, Stats().Held = %d; want the Lock's and the Session's, and %d", tt.call, n, l.Stats().Held, heldStat)
			}
		}
		if err := tx.Rollback(); err != nil {
			t.Errorf("the transaction's Rollback = %v", err)
		}
		if tok, err := lk.Token(bg()); err != nil || tok == 0 {
			t.Errorf("Token() = %d, %v", tok, err)
		}
		if err := lk.Unlock(bg()); err != nil {
			t.Errorf("Unlock() after Unlock(nil) = %v", err)
		}
		if err := s.Close(bg()); err != nil {
			t.Errorf("Session.Close() after Close(nil) = %v", err)
		}
		waitNoLocks(t, db, 5*time.Second)
		db.Close()
		// The table covers every exported call that takes a context.
		if want := ctxCalls(t); !slices.Equal(slices.Sorted(slices.Values(calls)), want) {
			t.Errorf("the table covers %v;\nthe package's calls that take a context are %v", slices.Sorted(slices.Values(calls)), want)
		}
	})
}

// panicOf returns what f, the call named call, panicked with, or nil;
// it fails t when f has not returned after 15 s.
func panicOf(t *testing.T, call string, f func()) any {
	t.Helper()
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		f()
	}()
	select {
	case p := <-done:
		return p
	case <-time.After(15 * time.Second):
		t.Fatalf("%s(nil) has not returned after 15s", call)
		return nil
	}
}

// ctxCalls lists the root package's exported functions and methods (of
// exported types) that take a context.Context, as "Type.Method" or
// "Func", sorted.
func ctxCalls(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() || !takesContext(fd.Type) {
				continue
			}
			call := fd.Name.Name
			if fd.Recv != nil {
				typ := fd.Recv.List[0].Type
				if st, ok := typ.(*ast.StarExpr); ok {
					typ = st.X
				}
				id, ok := typ.(*ast.Ident)
				if !ok || !id.IsExported() {
					continue
				}
				call = id.Name + "." + call
			}
			out = append(out, call)
		}
	}
	slices.Sort(out)
	return out
}

// takesContext reports whether ft has a parameter of type context.Context.
func takesContext(ft *ast.FuncType) bool {
	for _, p := range ft.Params.List {
		if sel, ok := p.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Context" {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "context" {
				return true
			}
		}
	}
	return false
}
