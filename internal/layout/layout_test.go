// Package layout holds the tests that keep the module's shape: the size of
// its types and files, where SQLSTATE codes are compared, and the verbs its
// functions end things with. They read the source with go/ast.
package layout

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// root is the module's root, from this package's directory.
const root = "../.."

// sourceFile is one parsed non-test Go file of the root package or of
// internal/.
type sourceFile struct {
	path  string // relative to the module's root
	lines int
	file  *ast.File
}

// sources parses the non-test Go files of the root package and of every
// package under internal/ (this one aside).
func sources(t *testing.T) []sourceFile {
	t.Helper()
	var dirs []string
	dirs = append(dirs, root)
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && filepath.Base(p) != "layout" {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var out []sourceFile
	for _, dir := range dirs {
		names, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			src, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, name)
			out = append(out, sourceFile{path: rel, lines: strings.Count(string(src), "\n"), file: f})
		}
	}
	return out
}

// The ceilings below are the module's shape today; each test fails when
// the code grows past one, and names the target the design aims for.
const (
	maxFields      = 16
	maxMethods     = 66 // target 30
	maxFileLines   = 600
	maxStateFiles  = 2 // the error definitions (errors.go) and the judge
	maxEndingVerbs = 7 // close, discard, release, unlock, lose, leave, stop
)

// TestTypeSizes counts each struct type's fields and each named type's
// methods in the root package and internal/, per package.
func TestTypeSizes(t *testing.T) {
	fields := map[string]int{}
	methods := map[string]int{}
	for _, sf := range sources(t) {
		pkg := strings.Replace(filepath.Dir(sf.path), ".", "sqllock", 1)
		for _, d := range sf.file.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok {
						continue
					}
					if st, ok := ts.Type.(*ast.StructType); ok {
						n := 0
						for _, f := range st.Fields.List {
							n += max(1, len(f.Names))
						}
						fields[pkg+"."+ts.Name.Name] = n
					}
				}
			case *ast.FuncDecl:
				if d.Recv == nil || len(d.Recv.List) == 0 {
					continue
				}
				methods[pkg+"."+recvName(d.Recv.List[0].Type)]++
			}
		}
	}
	report := func(what string, m map[string]int, ceiling int) {
		var names []string
		for n := range m {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool { return m[names[i]] > m[names[j]] })
		var top []string
		for _, n := range names[:min(5, len(names))] {
			top = append(top, n+" "+strconv.Itoa(m[n]))
		}
		t.Logf("most %s: %s", what, strings.Join(top, ", "))
		for _, n := range names {
			if m[n] > ceiling {
				t.Errorf("%s has %d %s, more than %d", n, m[n], what, ceiling)
			}
		}
	}
	report("fields", fields, maxFields)
	report("methods", methods, maxMethods)
}

// recvName is the type name of a method's receiver.
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return "?"
}

// TestFileSizes: no non-test file of the root package or internal/ is
// longer than the ceiling.
func TestFileSizes(t *testing.T) {
	var long []string
	for _, sf := range sources(t) {
		ceiling := maxFileLines
		if sf.lines > 600 {
			long = append(long, sf.path+" "+strconv.Itoa(sf.lines))
		}
		if sf.lines > ceiling {
			t.Errorf("%s has %d lines, more than %d", sf.path, sf.lines, ceiling)
		}
	}
	t.Logf("files over 600 lines: %s", strings.Join(long, ", "))
}

// TestSQLStateFiles: the files of internal/ that compare a SQLSTATE code
// (a five-character string literal of digits and capitals, compared
// with == or != or in a switch case), SQL texts aside.
func TestSQLStateFiles(t *testing.T) {
	var files []string
	for _, sf := range sources(t) {
		if !strings.HasPrefix(sf.path, "internal") {
			continue
		}
		found := false
		ast.Inspect(sf.file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BinaryExpr:
				if (n.Op == token.EQL || n.Op == token.NEQ) && (isState(n.X) || isState(n.Y)) {
					found = true
				}
			case *ast.CaseClause:
				if slices.ContainsFunc(n.List, isState) {
					found = true
				}
			}
			return !found
		})
		if found {
			files = append(files, sf.path)
		}
	}
	t.Logf("%d files compare SQLSTATE codes: %s", len(files), strings.Join(files, ", "))
	if len(files) > maxStateFiles {
		t.Errorf("%d files compare SQLSTATE codes, more than %d", len(files), maxStateFiles)
	}
}

// isState reports whether e is a string literal that reads as a SQLSTATE.
func isState(e ast.Expr) bool {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return false
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil || len(s) != 5 {
		return false
	}
	for _, r := range s {
		if !unicode.IsDigit(r) && !unicode.IsUpper(r) {
			return false
		}
	}
	return unicode.IsDigit(rune(s[0]))
}

// endingVerbs are the verbs that end something (a session, a call, a wait,
// a timer): a function or method whose name begins with one of them counts.
var endingVerbs = []string{"abandon", "cancel", "close", "destroy", "discard", "drop", "end", "expire", "finish", "fire", "forget", "free", "giveUp", "kill", "leave", "lose", "release", "reset", "retire", "shut", "stop", "terminate", "unlock"}

// TestEndingVerbs counts the distinct ending verbs that begin function and
// method names in the root package and internal/.
func TestEndingVerbs(t *testing.T) {
	used := map[string]int{}
	names := map[string][]string{}
	for _, sf := range sources(t) {
		for _, d := range sf.file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fd.Name.Name
			if name == "ResetSession" {
				continue // database/sql/driver.SessionResetter's, not ours to name
			}
			for _, v := range endingVerbs {
				if hasVerb(name, v) {
					used[v]++
					names[v] = append(names[v], filepath.Base(sf.path)+":"+name)
				}
			}
		}
	}
	var verbs []string
	for v, n := range used {
		verbs = append(verbs, v+" "+strconv.Itoa(n)+" ("+strings.Join(names[v], " ")+")")
	}
	sort.Strings(verbs)
	t.Logf("%d ending verbs: %s", len(used), strings.Join(verbs, ", "))
	if len(used) > maxEndingVerbs {
		t.Errorf("%d ending verbs begin names, more than %d", len(used), maxEndingVerbs)
	}
}

// hasVerb reports whether name (exported or not) begins with the word v.
func hasVerb(name, v string) bool {
	if len(name) < len(v) || !strings.EqualFold(name[:len(v)], v) {
		return false
	}
	rest := name[len(v):]
	return rest == "" || unicode.IsUpper(rune(rest[0])) || unicode.IsDigit(rune(rest[0]))
}

// TestCorePackages counts the packages under internal/core.
func TestCorePackages(t *testing.T) {
	var pkgs []string
	err := filepath.WalkDir(filepath.Join(root, "internal", "core"), func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if names, _ := filepath.Glob(filepath.Join(p, "*.go")); len(names) > 0 {
			rel, _ := filepath.Rel(root, p)
			pkgs = append(pkgs, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d packages under internal/core (target: at least 3): %s", len(pkgs), strings.Join(pkgs, ", "))
	if len(pkgs) == 0 {
		t.Error("no package under internal/core")
	}
}
