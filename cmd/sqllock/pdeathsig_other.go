//go:build !linux

package main

import "syscall"

// dieWithParent does nothing outside Linux: there, a COMMAND whose sqllock
// run was killed with SIGKILL keeps running without the lock (docs/cli.md).
func dieWithParent(*syscall.SysProcAttr) {}
