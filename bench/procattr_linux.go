package main

import "syscall"

// childProcAttr makes the kernel kill redis-server if the bench program dies
// without stopping it.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
