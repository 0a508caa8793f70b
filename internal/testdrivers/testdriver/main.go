// Command testdriver is every test-only driver of internal/testdrivers in one small program,
// chosen by its first argument (each package's Marker). Tests build it once per test binary
// (testutil.BuildTestDriver) and configure it as the plugin binary: a driver that starts as
// this program links no policy engine and no race detector, so it starts in milliseconds where
// a re-executed test binary takes a second on a busy machine.
package main

import (
	"fmt"
	"os"
)

// FailingMarker makes the program a driver that says on stderr why it cannot start and exits 3
// (drivers run from a sealed copy of their bytes, so a #! script cannot serve here).
const FailingMarker = "--as-failing-driver"

// BoundsMarker makes the program the hostile driver of internal/testdrivers/bounds.
const BoundsMarker = "--as-bounds-driver"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "testdriver: want a driver marker as the first argument")
		os.Exit(2)
	}
	run, ok := drivers()[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "testdriver: unknown driver marker %q\n", os.Args[1])
		os.Exit(2)
	}
	os.Exit(run(os.Args[2:]))
}

// failing is the driver of FailingMarker.
func failing([]string) int {
	fmt.Fprintln(os.Stderr, "acme driver: DAYTONA_API_URL is not set")
	fmt.Fprintln(os.Stderr, "[DEBUG] chatter")
	return 3
}
