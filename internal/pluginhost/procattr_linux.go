//go:build linux

package pluginhost

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel SIGKILL the driver when the host dies, even when the host
// could not run Close (SIGKILL, OOM). Linux ties the signal to the thread that started the child;
// the Go runtime does not end the threads of ordinary goroutines, so in practice this is the host.
func setParentDeathSignal(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
