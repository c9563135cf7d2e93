//go:build !linux

package main

import (
	"os/exec"
	"runtime"
)

func pin() {}

func serverCommand(args ...string) *exec.Cmd { return exec.Command("redis-server", args...) }

func pinning() string { return "not pinned" }

func machineCPUs() int { return runtime.NumCPU() }
