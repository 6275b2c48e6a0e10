package main

import "syscall"

// dieWithParent asks the kernel to SIGKILL the child when the thread that
// started it exits: Go never ends that thread while the process lives, so
// in practice when sqllock run dies, however it dies.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
