package sqllock_test

import (
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sqllock/sqllock/pgtest"
)

// processStart is about when the test process began (the library's own
// clock starts with the package).
var processStart = time.Now()

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		// Re-executed by a multi-process test: act as a separate client.
		os.Exit(helperMain(role))
	}
	flag.Parse()
	if !flagGiven("test.parallel") {
		// The tests wait on the server far more than they compute (each
		// has a database of its own): run more of them at once than there
		// are cores. The quick run's, eight per core; the full run's, whose
		// parallel tests include timing-heavy trials, two per core.
		per := 2
		if testing.Short() {
			per = 8
		}
		flag.Set("test.parallel", strconv.Itoa(per*runtime.GOMAXPROCS(0)))
	}
	os.Exit(pgtest.Run(m))
}

// flagGiven reports whether the command line set the flag name.
func flagGiven(name string) bool {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}
