//go:build !linux

// Package identity holds hostile driver plugins for tests; they need Linux, like the host.
package identity

import (
	"fmt"
	"os"
)

// Marker is the first argument that makes a test binary run Main.
const Marker = "--as-identity-driver"

// Main reports that the identity drivers need Linux.
func Main([]string) int {
	fmt.Fprintln(os.Stderr, "identity: the hostile test drivers need Linux")
	return 2
}
