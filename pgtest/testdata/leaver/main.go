// Command leaver starts a throwaway server from the local binaries, prints
// its socket directory and exits without closing it: the reaper must
// remove what it leaves.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sqllock/sqllock/pgtest"
)

func main() {
	srv, err := pgtest.Embedded(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("dir", srv.SocketDir())
	os.Exit(0) // no Close
}
