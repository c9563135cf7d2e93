//go:build linux

package redistest

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel send SIGKILL to the redis-server child when the
// test binary dies, so a crashed or killed test run leaves no servers behind.
//
// Pdeathsig is tied to the OS thread that forked the child, not to the whole
// process; the Go runtime only retires threads whose goroutine exits while
// locked with runtime.LockOSThread, which is rare enough in tests.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
