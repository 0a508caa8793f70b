//go:build !linux

package sandbox

// initLauncher registers the driver launcher; there is none on this system.
func initLauncher() {}
