package sqllock_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsCodeBlocksCompile: every Go code block in the README and in
// docs/ stands, line for line, in a Go file of this repository (an Example
// function or an example program), which the build compiles and vets. A
// block edited in the docs only, or code changed without its docs, fails.
// A block may not discard an error (`x, _ :=`), and a block that opens a
// database or calls a driver's package shows the imports it needs.
func TestDocsCodeBlocksCompile(t *testing.T) {
	var sources [][]string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && path != "docs_test.go" {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			sources = append(sources, normalize(string(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```go\n(.*?)```")
	docs, _ := filepath.Glob("docs/*.md")
	for _, doc := range append([]string{"README.md"}, docs...) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		blocks := block.FindAllStringSubmatch(string(b), -1)
		if len(blocks) == 0 && (doc == "README.md" || doc == "docs/guide.md") {
			t.Errorf("%s has no Go blocks", doc)
		}
		for _, m := range blocks {
			lines := normalize(m[1])
			if !foundIn(lines, sources) {
				t.Errorf("%s: this block is not in any Go file of the repository:\n%s", doc, m[1])
			}
			for _, problem := range snippetProblems(m[1]) {
				t.Errorf("%s: %s in this block:\n%s", doc, problem, m[1])
			}
		}
	}
}

func normalize(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func foundIn(lines []string, sources [][]string) bool {
	for _, src := range sources {
		for i := 0; i+len(lines) <= len(src); i++ {
			match := true
			for j, l := range lines {
				if src[i+j] != l {
					match = false
					break
				}
			}
			if match {
				return true
			}
		}
	}
	return false
}

// discarded matches an assignment that throws an error (or any value) away.
var discarded = regexp.MustCompile(`(,\s*_\s*:?=)|(^\s*_\s*=[^=])`)

// driverPackages are packages whose use a snippet must import visibly.
var driverPackages = map[string]string{
	"stdlib.": `"github.com/jackc/pgx/v5/stdlib"`,
	"pgx.":    `"github.com/jackc/pgx/v5"`,
	"pq.":     `"github.com/lib/pq"`,
	"sqlx.":   `"github.com/jmoiron/sqlx"`,
}

// snippetProblems lists what a reader copying the block would trip over:
// a discarded value, a sql.Open without its driver's import, a driver
// package used without its import.
func snippetProblems(block string) []string {
	var out []string
	for _, l := range strings.Split(block, "\n") {
		if discarded.MatchString(l) {
			out = append(out, fmt.Sprintf("a discarded value (%q)", strings.TrimSpace(l)))
		}
	}
	if strings.Contains(block, "sql.Open(") && !strings.Contains(block, `_ "github.com/jackc/pgx/v5/stdlib"`) && !strings.Contains(block, `_ "github.com/lib/pq"`) {
		out = append(out, "sql.Open without the import of a driver")
	}
	for use, imp := range driverPackages {
		if regexp.MustCompile(`\b`+regexp.QuoteMeta(use)).MatchString(block) && !strings.Contains(block, imp) {
			out = append(out, fmt.Sprintf("%s used without import %s", use, imp))
		}
	}
	return out
}

// TestSnippetProblems: the rules catch what they are meant to.
func TestSnippetProblems(t *testing.T) {
	bad := map[string]string{
		`db, _ := sql.Open("pgx", dsn)`:             "discarded",
		"_ = lk.Unlock(ctx)":                        "discarded",
		`db, err := sql.Open("pgx", dsn)`:           "driver",
		"c := stdlib.GetConnector(*cfg)":            "import",
		"import \"github.com/lib/pq\"\nc := pq.X()": "",
	}
	for block, want := range bad {
		got := strings.Join(snippetProblems(block), "; ")
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("snippetProblems(%q) = %q, want it to say %q", block, got, want)
		}
	}
}

// TestExamplesNeedNoSetup: README.md says every example runs with `go run`
// and no setup, starting a throwaway PostgreSQL unless DATABASE_URL is set:
// each program under examples/ starts one (pgtest.DatabaseURL or
// pgtest.Embedded). Each example's own test runs it.
func TestExamplesNeedNoSetup(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "no setup") {
		t.Fatal("README.md no longer promises examples that need no setup: update this test")
	}
	dirs, err := filepath.Glob("examples/*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	starts := regexp.MustCompile(`\bpgtest\.(DatabaseURL|Embedded)\(`)
	for _, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		found := false
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			found = found || starts.Match(src)
		}
		if !found {
			t.Errorf("%s starts no server of its own: `go run` fails without DATABASE_URL", dir)
		}
	}
}

// TestDocClaims: claims of the docs that once contradicted the library, or
// each other, each with the test that proves it. A claim edited away, a
// contradiction written back, or a proof that is gone fails here. Text is
// compared with its whitespace (and a Go file's comment markers) folded.
func TestDocClaims(t *testing.T) {
	tests := []struct {
		file    string
		says    []string // what it must say
		notSays []string // what the library does not do
		proof   string   // the test that proves it
	}{
		{
			file:    "docs/traps.md",
			says:    []string{"on a few sessions it shares among them (at most 16 per Locker, a quarter of `SetMaxOpenConns` when the pool has a limit"},
			notSays: []string{"pins its own `*sql.Conn`"},
			proof:   "TestManyLocksFewSessions",
		},
		{
			file: "docs/traps.md",
			says: []string{"An unlock that PostgreSQL answers \"not held\" there loses that one lock",
				"Any doubt (an error, no answer, another backend pid) discards the connection with every lock on it, each reported lost"},
			proof: "TestSharedUnlockOutcomes",
		},
		{
			file:  "docs/guide.md",
			says:  []string{"at most 16 per Locker (a quarter of `SetMaxOpenConns` when the pool has a limit)"},
			proof: "TestManyLocksFewSessions",
		},
		{
			file:    "inspect.go",
			says:    []string{"Granted false, WaitStart its arrival in the line, and BlockedBy the key's holders in a conflicting mode"},
			notSays: []string{"BlockedBy empty"},
			proof:   "TestInspectLine",
		},
	}
	testFiles, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var testSrc strings.Builder
	for _, f := range testFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		testSrc.Write(b)
	}
	for _, tt := range tests {
		b, err := os.ReadFile(tt.file)
		if err != nil {
			t.Fatal(err)
		}
		text := fold(string(b), strings.HasSuffix(tt.file, ".go"))
		for _, s := range tt.says {
			if !strings.Contains(text, fold(s, false)) {
				t.Errorf("%s no longer says %q (proved by %s)", tt.file, s, tt.proof)
			}
		}
		for _, s := range tt.notSays {
			if strings.Contains(text, fold(s, false)) {
				t.Errorf("%s says %q, which the library does not do", tt.file, s)
			}
		}
		if !strings.Contains(testSrc.String(), "func "+tt.proof+"(") {
			t.Errorf("%s: the test that proves its claim, %s, is gone", tt.file, tt.proof)
		}
	}
}

// fold returns s with every run of white space made one space; for Go
// source (goSrc), comment markers are white space too.
func fold(s string, goSrc bool) string {
	if goSrc {
		s = strings.ReplaceAll(s, "//", " ")
	}
	return strings.Join(strings.Fields(s), " ")
}
