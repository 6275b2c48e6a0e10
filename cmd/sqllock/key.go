package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/sqllock/sqllock"
	"github.com/sqllock/sqllock/interop"
)

func keyCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sqllock key", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: sqllock key NAME\n"+
			"  print NAME's keys (sqllock.Hash, the CLI's default, and zlib.crc32, run --crc32)\n"+
			"  and the SQL to take and release them; no flags, no connection\n")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fail(exitUsage, "")
	}
	if fs.NArg() != 1 {
		return fail(exitUsage, "key: want exactly one NAME (usage: sqllock key NAME)")
	}
	name := fs.Arg(0)
	if strings.TrimSpace(name) == "" {
		return fail(exitUsage, "key: empty NAME (as run refuses an empty KEY)")
	}
	h, c := sqllock.Hash(name), interop.CRC32(name)
	fmt.Fprintf(stdout, "name      %s\n", strconv.Quote(name))
	rows := []struct {
		label, what string
		k           sqllock.Key
	}{
		{"hash", "bigint, FNV-1a 64 (sqllock.Hash, the CLI's default)", h},
		{"crc32", "bigint, zlib.crc32 (interop.CRC32, run --crc32)", c},
	}
	for _, r := range rows {
		args := r.k.String()
		if _, _, pair := r.k.Pair(); !pair {
			args = "(" + args + ")"
		}
		fmt.Fprintf(stdout, "%-9s %-22s %s\n          SELECT pg_try_advisory_lock%s;  SELECT pg_advisory_unlock%s;\n",
			r.label, r.k.String(), r.what, args, args)
	}
	return nil
}
