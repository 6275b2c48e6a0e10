package main

import (
	"io"
	"testing"
	"time"

	"github.com/sqllock/sqllock"
)

// TestKeepAliveFlagsAlone: either of --keep-alive and --orphan-bound given
// alone leaves the other to sqllock, which fits it to the one given; given
// both, they must agree.
func TestKeepAliveFlagsAlone(t *testing.T) {
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--keep-alive", "1h", "k", "--", "true"}, true},
		{[]string{"--orphan-bound", "5s", "k", "--", "true"}, true},
		{[]string{"--keep-alive", "1h", "--orphan-bound", "30s", "k", "--", "true"}, false},
		{[]string{"k", "--", "true"}, true},
	} {
		sp, err := parseRun(tc.args, io.Discard)
		if (err == nil) != tc.ok {
			t.Errorf("parseRun(%q) = %v, want ok %v", tc.args, err, tc.ok)
			continue
		}
		if err == nil {
			if cerr := sqllock.CheckOptions(sp.f.lockerOptions()...); cerr != nil {
				t.Errorf("parseRun(%q): options %v", tc.args, cerr)
			}
			if sp.f.keepAliveSet != (sp.f.keepAlive == time.Hour) {
				t.Errorf("parseRun(%q): keep-alive given %v, value %v", tc.args, sp.f.keepAliveSet, sp.f.keepAlive)
			}
		}
	}
}
