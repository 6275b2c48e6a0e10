package sqllock_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsCodeBlocksCompile: every Go code block in the README and the
// guide stands, line for line, in a Go file of this repository (an Example
// function or an example program), which the build compiles and vets. A
// block edited in the docs only, or code changed without its docs, fails.
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
	for _, doc := range []string{"README.md", "docs/guide.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		blocks := block.FindAllStringSubmatch(string(b), -1)
		if len(blocks) == 0 {
			t.Errorf("%s has no Go blocks", doc)
		}
		for _, m := range blocks {
			lines := normalize(m[1])
			if !foundIn(lines, sources) {
				t.Errorf("%s: this block is not in any Go file of the repository:\n%s", doc, m[1])
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
