//go:build !linux

package pluginhost

import "os/exec"

// setParentDeathSignal is Linux-only; elsewhere Close is what ends the drivers.
func setParentDeathSignal(*exec.Cmd) {}
