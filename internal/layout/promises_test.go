package layout

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// corePackage parses and type-checks internal/core (its non-test files).
func corePackage(t *testing.T) (*token.FileSet, []*ast.File, *types.Info) {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(root, "internal", "core", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check("github.com/sqllock/sqllock/internal/core", fset, files, info); err != nil {
		t.Fatal(err)
	}
	return fset, files, info
}

// eachFunc calls f with every function declaration of files and the name
// it is known by (Type.method or func).
func eachFunc(files []*ast.File, f func(name string, fd *ast.FuncDecl)) {
	for _, file := range files {
		for _, d := range file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				name = recvName(fd.Recv.List[0].Type) + "." + name
			}
			f(name, fd)
		}
	}
}

// TestOnePlacePromises holds the core's comments that say a thing happens
// in one place (doc.go, judge.go, queue.go) to the code:
//
//   - a session's lifecycle (life.state) is changed only by
//     session.setStateLocked;
//   - only judge (and judgeShared, its fast path for a shared session's
//     try) decides a verdict: the verdicts (granted, refused, unwanted,
//     uncertain, stray) are returned or assigned nowhere else;
//   - unlock statements are rendered only by batcher.sendUnlocks (alone,
//     or with tries), which stmt.Many and stmt.Batch send.
func TestOnePlacePromises(t *testing.T) {
	_, files, info := corePackage(t)
	var stateWriters, verdictMakers, unlockRenderers []string
	add := func(list *[]string, name string) {
		if !slices.Contains(*list, name) {
			*list = append(*list, name)
		}
	}
	verdicts := map[string]bool{"granted": true, "refused": true, "unwanted": true, "uncertain": true, "stray": true}
	isVerdict := func(e ast.Expr) bool {
		id, ok := e.(*ast.Ident)
		if !ok || !verdicts[id.Name] {
			return false
		}
		c, ok := info.Uses[id].(*types.Const)
		return ok && c.Type().String() == "github.com/sqllock/sqllock/internal/core.verdict"
	}
	eachFunc(files, func(name string, fd *ast.FuncDecl) {
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, lhs := range n.Lhs {
					sel, ok := lhs.(*ast.SelectorExpr)
					if !ok {
						continue
					}
					if s := info.Selections[sel]; s != nil && sel.Sel.Name == "state" {
						if f, ok := s.Obj().(*types.Var); ok && f.Type().String() == "github.com/sqllock/sqllock/internal/core.sessState" {
							add(&stateWriters, name)
						}
					}
				}
				if slices.ContainsFunc(n.Rhs, isVerdict) {
					add(&verdictMakers, name)
				}
			case *ast.ReturnStmt:
				if slices.ContainsFunc(n.Results, isVerdict) {
					add(&verdictMakers, name)
				}
			case *ast.SelectorExpr:
				switch n.Sel.Name {
				case "UnlockSQL", "UnlockSQLTo", "BatchUnlock", "BatchMixed":
					add(&unlockRenderers, name)
				}
			}
			return true
		})
	})
	check := func(what string, got, want []string) {
		sort.Strings(got)
		t.Logf("%s: %s", what, strings.Join(got, ", "))
		for _, g := range got {
			if !slices.Contains(want, g) {
				t.Errorf("%s in %s, not only in %s", what, g, strings.Join(want, ", "))
			}
		}
		if len(got) == 0 {
			t.Errorf("%s: found nowhere (the test no longer sees it)", what)
		}
	}
	check("a session's state changes", stateWriters, []string{"session.setStateLocked"})
	check("a verdict is decided", verdictMakers, []string{"judge", "judgeShared"})
	check("an unlock statement is rendered", unlockRenderers, []string{"batcher.sendUnlocks"})
}
