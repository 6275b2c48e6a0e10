// Command leaver starts a throwaway server, prints its socket directory (or
// its container) and exits without closing it: the reaper must remove what
// it leaves.
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
	if id := srv.Container(); id != "" {
		fmt.Println("container", id)
	} else {
		fmt.Println("dir", srv.SocketDir())
	}
	os.Exit(0) // no Close
}
