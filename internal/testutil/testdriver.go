package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// testDriverPackage is the program of every test-only driver (internal/testdrivers/testdriver).
const testDriverPackage = "github.com/authz-dev/authz/internal/testdrivers/testdriver"

// BuildTestDriver builds the test-only driver program into a new directory under dir and
// returns its absolute path. Call it once per test binary (from TestMain): the driver is built
// without the race detector and without the test's packages, so each driver start costs
// milliseconds rather than a re-executed test binary's second. The directory and the file are
// writable by their owner only, as the host requires of a plugin binary.
func BuildTestDriver(dir string) (string, error) {
	out, err := os.MkdirTemp(dir, "authz-testdriver-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(out, "testdriver")
	// go test puts its own toolchain first on the test's PATH.
	cmd := exec.Command("go", "build", "-o", path, testDriverPackage)
	if b, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(out)
		return "", fmt.Errorf("build the test driver (%s): %w: %s", testDriverPackage, err, strings.TrimSpace(string(b)))
	}
	return path, nil
}
