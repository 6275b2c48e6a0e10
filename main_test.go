package sqllock_test

import (
	"os"
	"testing"

	"github.com/sqllock/sqllock/pgtest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		// Re-executed by a multi-process test: act as a separate client.
		os.Exit(helperMain(role))
	}
	os.Exit(pgtest.Run(m))
}
