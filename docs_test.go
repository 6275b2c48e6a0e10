package sqllock_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
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
			file:  "docs/deployment.md",
			says:  []string{"So impatient callers (deadlines of a few milliseconds, cancellations) never fill the pool"},
			proof: "TestPoolStarvation",
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

// The sentence rule of the docs a reader reads through: in each file, the
// median sentence is at most maxMedianWords words and the 90th percentile
// at most maxP90Words; the guide is at most maxGuideLines lines.
const (
	maxMedianWords = 18
	maxP90Words    = 35
	maxGuideLines  = 500
)

// proseDocs are the files the sentence rule applies to.
var proseDocs = []string{"docs/guide.md", "docs/traps.md", "README.md", "docs/deployment.md"}

// TestDocSentences keeps the docs readable in one pass: it splits each of
// proseDocs into sentences (see sentences) and fails when the median or
// the 90th percentile of words per sentence is over the rule, or when the
// guide is longer than maxGuideLines. Run it alone, with its figures:
//
//	go test -run 'TestDocSentences$' -v .
func TestDocSentences(t *testing.T) {
	for _, doc := range proseDocs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		lengths := sentenceLengths(sentences(string(b)))
		median, p90, longest := percentile(lengths, 50), percentile(lengths, 90), percentile(lengths, 100)
		lines := strings.Count(string(b), "\n")
		t.Logf("%-20s %4d lines, %4d sentences: median %2d words, 90th percentile %2d, longest %3d", doc, lines, len(lengths), median, p90, longest)
		if len(lengths) == 0 {
			t.Errorf("%s: no sentences found", doc)
			continue
		}
		if median > maxMedianWords {
			t.Errorf("%s: median sentence %d words, want at most %d", doc, median, maxMedianWords)
		}
		if p90 > maxP90Words {
			t.Errorf("%s: 90th percentile %d words, want at most %d; the longest:\n%s", doc, p90, maxP90Words, longestSentences(sentences(string(b)), 5))
		}
		for _, c := range tableCells(string(b)) {
			if n := words(c); n > maxP90Words {
				t.Errorf("%s: a table cell of %d words, want at most %d (prose belongs outside tables): %s", doc, n, maxP90Words, c)
			}
		}
		if doc == "docs/guide.md" && lines > maxGuideLines {
			t.Errorf("%s: %d lines, want at most %d", doc, lines, maxGuideLines)
		}
	}
}

var (
	fenced      = regexp.MustCompile("(?ms)^[ \t]*```.*?^[ \t]*```[^\n]*$")
	htmlComment = regexp.MustCompile(`(?s)<!--.*?-->`)
	inlineCode  = regexp.MustCompile("`[^`]+`")
	image       = regexp.MustCompile(`!\[[^\]]*\]\([^)]*\)`)
	link        = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	listMarker  = regexp.MustCompile(`^\s*([-*+]|\d+\.)\s+`)
	sentenceEnd = regexp.MustCompile(`[.?!]["')\]]*(\s|$)`)
	wordChar    = regexp.MustCompile(`[\p{L}\p{N}]`)
)

// sentences splits Markdown text into the sentences a reader reads,
// outside code. The rules:
//   - fenced code blocks and HTML comments are dropped;
//   - an inline code span is one word (a placeholder without a period, so
//     that `sqllock.Hash` neither splits a sentence nor counts as two);
//   - a link counts as its text, an image as nothing;
//   - headings are titles, not sentences: dropped;
//   - table rows are dropped (a cell is a phrase, not a sentence; tables
//     hold figures and reference, and tableCells checks their length);
//   - a paragraph's lines are joined; a list item starts a new unit, its
//     marker dropped, and so does the text after it;
//   - a sentence ends at '.', '?' or '!' (after any closing quote or
//     bracket) followed by white space, and at the end of its unit: a
//     list item or a paragraph without a period is a sentence too;
//   - "e.g." and "i.e." end nothing.
func sentences(md string) []string {
	md = fenced.ReplaceAllString(md, "")
	md = htmlComment.ReplaceAllString(md, "")
	var units []string
	var cur []string
	flush := func() {
		if len(cur) > 0 {
			units = append(units, strings.Join(cur, " "))
			cur = nil
		}
	}
	for _, l := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(l)
		switch {
		case trimmed == "":
			flush()
		case strings.HasPrefix(trimmed, "#"), strings.HasPrefix(trimmed, "|"):
			flush()
		case listMarker.MatchString(l):
			flush()
			cur = append(cur, listMarker.ReplaceAllString(l, ""))
		default:
			cur = append(cur, strings.TrimPrefix(trimmed, "> "))
		}
	}
	flush()
	var out []string
	for _, u := range units {
		u = inlineCode.ReplaceAllString(u, "CODE")
		u = image.ReplaceAllString(u, "")
		u = link.ReplaceAllString(u, "$1")
		u = strings.NewReplacer("e.g.", "eg", "i.e.", "ie").Replace(u)
		for {
			loc := sentenceEnd.FindStringIndex(u)
			if loc == nil {
				break
			}
			out = append(out, strings.TrimSpace(u[:loc[1]]))
			u = u[loc[1]:]
		}
		if strings.TrimSpace(u) != "" {
			out = append(out, strings.TrimSpace(u))
		}
	}
	return out
}

// tableCells returns the cells of the tables of md, outside code, each
// inline code span one word (so a '|' inside code splits nothing).
func tableCells(md string) []string {
	md = fenced.ReplaceAllString(md, "")
	var out []string
	for _, l := range strings.Split(md, "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "|") {
			l = inlineCode.ReplaceAllString(l, "CODE")
			out = append(out, strings.Split(strings.Trim(l, "|"), "|")...)
		}
	}
	return out
}

// words counts the words of a sentence: white-space separated tokens with
// a letter or a digit (a dash or an arrow alone is no word).
func words(s string) int {
	n := 0
	for _, f := range strings.Fields(s) {
		if wordChar.MatchString(f) {
			n++
		}
	}
	return n
}

// sentenceLengths returns the word counts of the sentences that have words.
func sentenceLengths(ss []string) []int {
	var out []int
	for _, s := range ss {
		if n := words(s); n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// percentile returns the p-th percentile of xs by the nearest-rank method:
// the smallest value with at least p% of the values at or below it (p 50 is
// the lower median, p 100 the largest); 0 for no values.
func percentile(xs []int, p int) int {
	if len(xs) == 0 {
		return 0
	}
	s := append([]int(nil), xs...)
	sort.Ints(s)
	rank := (p*len(s) + 99) / 100
	if rank < 1 {
		rank = 1
	}
	return s[rank-1]
}

// longestSentences lists the n longest sentences, for a failure message.
func longestSentences(ss []string, n int) string {
	s := append([]string(nil), ss...)
	sort.SliceStable(s, func(i, j int) bool { return words(s[i]) > words(s[j]) })
	if len(s) > n {
		s = s[:n]
	}
	var b strings.Builder
	for _, x := range s {
		fmt.Fprintf(&b, "  (%d) %s\n", words(x), x)
	}
	return b.String()
}

// TestSentences: the splitter counts what a reader reads, and only that.
func TestSentences(t *testing.T) {
	tests := []struct {
		name string
		md   string
		want []int // words per sentence
	}{
		{"two sentences", "One two three. Four five.\n", []int{3, 2}},
		{"lines joined", "One two\nthree four.\n\nFive.\n", []int{4, 1}},
		{"inline code one word", "Call `sqllock.New(db, sqllock.WithKeepAlive(0))` now.\n", []int{3}},
		{"fenced code dropped", "Before.\n\n```go\nx := 1. y\n```\n\nAfter it.\n", []int{1, 2}},
		{"heading dropped", "# A title here\n\nText.\n", []int{1}},
		{"table dropped", "| a | b c d |\n|---|---|\n| e. f | g |\n\nText.\n", []int{1}},
		{"list items split", "Intro:\n\n- first item\n  goes on\n- second. Third\n", []int{1, 4, 1, 1}},
		{"link text counts", "See [the guide](docs/guide.md#keys) now.\n", []int{4}},
		{"numbers and e.g.", "Wait 1.5 s, e.g. twice (then stop.) Next one!\n", []int{7, 2}},
		{"comment dropped", "<!-- test-command -->\nText — here.\n", []int{2}},
	}
	for _, tt := range tests {
		got := sentenceLengths(sentences(tt.md))
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: sentenceLengths(sentences(%q)) = %v, want %v", tt.name, tt.md, got, tt.want)
		}
	}
	cells := tableCells("| a `x|y` | b c |\n|---|---|\n\n```\n| not a cell |\n```\n")
	if got := fmt.Sprint(cells); got != "[ a CODE   b c  --- ---]" {
		t.Errorf("tableCells = %q, want the cells of the table only, code one word", got)
	}
	if got := percentile([]int{5, 1, 3, 2, 4}, 50); got != 3 {
		t.Errorf("percentile(1..5, 50) = %d, want 3", got)
	}
	if got := percentile([]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90); got != 9 {
		t.Errorf("percentile(1..10, 90) = %d, want 9", got)
	}
}

// TestDocLinks: every relative link of the README and docs/ to a Markdown
// file exists, and so does the heading its #anchor names (GitHub's slug:
// lower case, punctuation dropped, spaces made hyphens), so that a heading
// renamed without its links fails here.
func TestDocLinks(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // file → slugs of its headings
	slugsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil
		}
		a := map[string]bool{}
		for _, l := range strings.Split(fenced.ReplaceAllString(string(b), ""), "\n") {
			if strings.HasPrefix(l, "#") {
				a[slug(strings.TrimLeft(l, "# "))] = true
			}
		}
		anchors[file] = a
		return a
	}
	mdLink := regexp.MustCompile(`\]\(([^)\s]*?\.md)?(#[^)\s]*)?\)`)
	for _, doc := range append([]string{"README.md"}, docs...) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(fenced.ReplaceAllString(string(b), ""), -1) {
			target, anchor := doc, strings.TrimPrefix(m[2], "#")
			if m[1] != "" {
				if strings.Contains(m[1], "://") {
					continue
				}
				target = filepath.Join(filepath.Dir(doc), m[1])
			} else if anchor == "" {
				continue
			}
			a := slugsOf(target)
			switch {
			case a == nil:
				t.Errorf("%s links to %s, which does not exist", doc, m[1])
			case anchor != "" && !a[anchor]:
				t.Errorf("%s links to %s#%s: no such heading", doc, target, anchor)
			}
		}
	}
}

// slug returns GitHub's anchor for a heading's text.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
