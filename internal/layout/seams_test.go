package layout

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSeamsInOnePlace holds the core's test seams to their one place:
// the hooks a test may set are package seams' (a package-level function
// value that tests set, as an atomic pointer, is found nowhere else in
// the library's non-test code), and what a test may read of the core or
// make it do is core.Probe's (no other non-test comment in the core says
// it is for tests).
func TestSeamsInOnePlace(t *testing.T) {
	hook := regexp.MustCompile(`atomic\.Pointer\[func`)
	forTests := regexp.MustCompile(`(?i)//.*\b(for|by) tests\b`)
	seams := filepath.Join(root, "internal", "core", "seams")
	probe := filepath.Join(root, "internal", "core", "probe.go")
	var hooks, readers []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || fileExists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.HasPrefix(p, seams+string(filepath.Separator)) {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if hook.Match(b) {
			hooks = append(hooks, rel)
		}
		if p != probe && strings.HasPrefix(p, filepath.Join(root, "internal", "core")+string(filepath.Separator)) && forTests.Match(b) {
			readers = append(readers, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(hooks) > 0 {
		t.Errorf("test hooks outside internal/core/seams: %v", hooks)
	}
	if len(readers) > 0 {
		t.Errorf("the core's test read-outs outside core.Probe (probe.go): %v", readers)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
