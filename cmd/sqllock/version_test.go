package main

import (
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// TestVersion: "sqllock version" and "sqllock --version" print the
// module's version as the build recorded it, "(devel)" when it recorded
// none; an argument after it is a usage error.
func TestVersion(t *testing.T) {
	line := regexp.MustCompile(`^sqllock (\(devel\)|v\S+)\n$`)
	for _, arg := range []string{"version", "--version"} {
		r := runCLI(t, "", arg)
		if r.code != 0 || !line.MatchString(r.stdout) || r.stderr != "" {
			t.Errorf("sqllock %s: exit %d, stdout %q, stderr %q; want \"sqllock VERSION\"", arg, r.code, r.stdout, r.stderr)
		}
	}
	if r := runCLI(t, "", "version", "now"); r.code != exitUsage || !strings.Contains(r.stderr, `unexpected argument "now"`) {
		t.Errorf("sqllock version now: exit %d, stderr %q; want %d", r.code, r.stderr, exitUsage)
	}
	tests := []struct {
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{&debug.BuildInfo{Main: debug.Module{Path: "github.com/sqllock/sqllock", Version: "v1.2.3"}}, true, "v1.2.3"},
		{&debug.BuildInfo{Main: debug.Module{Path: "github.com/sqllock/sqllock", Version: "(devel)"}}, true, "(devel)"},
		{&debug.BuildInfo{}, true, "(devel)"},
		{nil, false, "(devel)"},
	}
	for _, tt := range tests {
		if got := version(tt.info, tt.ok); got != tt.want {
			t.Errorf("version(%+v, %v) = %q, want %q", tt.info, tt.ok, got, tt.want)
		}
	}
}
