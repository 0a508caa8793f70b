//go:build !linux

package liveness

import (
	"fmt"
	"os"
)

// Marker is the first argument that makes a test binary run as this driver (see Main).
const Marker = "--as-liveness-driver"

// Modes of the driver.
const (
	ModeSelfStop = "selfstop"
	ModeMainExit = "mainexit"
)

// Main refuses to run: the driver needs Linux.
func Main([]string) int {
	_, _ = fmt.Fprintln(os.Stderr, "liveness-driver: Linux only")
	return 2
}
