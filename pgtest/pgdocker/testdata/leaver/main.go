// Command leaver starts a throwaway server in a container, prints its id
// and exits without closing it: the reaper must remove the container.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sqllock/sqllock/pgtest/pgdocker"
)

func main() {
	srv, err := pgdocker.Embedded(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("container", srv.ID())
	os.Exit(0) // no Close
}
