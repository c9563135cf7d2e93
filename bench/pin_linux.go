//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
)

// pinnedEnv marks a bench process that pin has already moved.
const pinnedEnv = "REDLIMIT_BENCH_PINNED"

// pin runs this program again on every CPU but the last, through taskset,
// so that the redis-server it starts (serverCommand) has the last CPU to
// itself: a client that shares the server's CPU preempts it mid-script,
// and the server's µs per call then moves by ±20% from run to run. It
// returns only when it does not pin: one CPU, no taskset, or already done.
func pin() {
	n := runtime.NumCPU()
	taskset, err := exec.LookPath("taskset")
	if n < 2 || err != nil || os.Getenv(pinnedEnv) != "" {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	args := append([]string{"taskset", "-c", fmt.Sprintf("0-%d", n-2), exe}, os.Args[1:]...)
	env := append(os.Environ(), fmt.Sprintf("%s=%d", pinnedEnv, n-1))
	err = syscall.Exec(taskset, args, env)
	fmt.Fprintln(os.Stderr, "bench: not pinned:", err)
}

// serverCommand returns the command that starts redis-server with args: on
// the CPU pin left free, when pin moved this program.
func serverCommand(args ...string) *exec.Cmd {
	if cpu := os.Getenv(pinnedEnv); cpu != "" {
		return exec.Command("taskset", append([]string{"-c", cpu, "redis-server"}, args...)...)
	}
	return exec.Command("redis-server", args...)
}

// machineCPUs is the machine's CPU count, which runtime.NumCPU no longer
// tells once pin has moved this program.
func machineCPUs() int {
	if cpu, err := strconv.Atoi(os.Getenv(pinnedEnv)); err == nil {
		return cpu + 1
	}
	return runtime.NumCPU()
}

// pinning describes where pin put the bench and its server.
func pinning() string {
	if cpu := os.Getenv(pinnedEnv); cpu != "" {
		return "redis-server on CPU " + cpu + ", the bench on the others"
	}
	return "not pinned"
}
