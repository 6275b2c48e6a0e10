package sqllock_test

import (
	"os"
	"testing"

	"github.com/sqllock/sqllock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
