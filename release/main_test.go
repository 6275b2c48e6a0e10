package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageNames: the release check refuses a published module whose
// package is not named as its directory (the otel module's package was
// once "otel", which every user had to alias beside OpenTelemetry's), and
// accepts this tree.
func TestPackageNames(t *testing.T) {
	if err := packageNames(".."); err != nil {
		t.Fatalf("packageNames(the tree) = %v", err)
	}
	root := t.TempDir()
	write := func(dir, pkg string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, "a.go"), []byte("package "+pkg+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("pgtest/pgdocker", "pgdocker")
	write("otelsqllock", "otel")
	if err := packageNames(root); err == nil || !strings.Contains(err.Error(), "is package otel") {
		t.Fatalf("packageNames(a module named otel) = %v, want an error naming it", err)
	}
	write("otelsqllock", "otelsqllock")
	if err := packageNames(root); err != nil {
		t.Fatalf("packageNames(each named as its directory) = %v", err)
	}
}
