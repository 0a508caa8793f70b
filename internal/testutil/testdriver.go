package testutil

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	if _, err := Go(context.Background(), "", "build", "-o", path, testDriverPackage); err != nil {
		_ = os.RemoveAll(out)
		return "", fmt.Errorf("build the test driver: %w", err)
	}
	return path, nil
}
