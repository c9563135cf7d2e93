//go:build !linux

package redistest

import "os/exec"

// setProcAttr is a no-op outside Linux, where Pdeathsig is not available.
func setProcAttr(*exec.Cmd) {}
