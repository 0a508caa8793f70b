package server_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/testutil"
)

// testDriver is the test-driver program (internal/testdrivers/testdriver), built once per test
// binary on first use and removed by TestMain.
var testDriver struct {
	once      sync.Once
	path, sum string
	err       error
}

// driverProgram returns the test-driver program's path and pin.
func driverProgram(t testing.TB) (path, sum string) {
	t.Helper()
	testDriver.once.Do(func() {
		testDriver.path, testDriver.err = testutil.BuildTestDriver(os.TempDir())
		if testDriver.err == nil {
			testDriver.sum, testDriver.err = pluginhost.FileSHA256(testDriver.path)
		}
	})
	require.NoError(t, testDriver.err)
	return testDriver.path, testDriver.sum
}

// removeTestDriver removes the test-driver program, when one was built.
func removeTestDriver() {
	if testDriver.path != "" {
		_ = os.RemoveAll(filepath.Dir(testDriver.path))
	}
}
