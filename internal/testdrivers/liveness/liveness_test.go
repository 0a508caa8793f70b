//go:build linux

package liveness

import (
	"bytes"
	"go/build"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNotInTheShippedBinary: the authz command never links this driver.
func TestNotInTheShippedBinary(t *testing.T) {
	goTool := filepath.Join(build.Default.GOROOT, "bin", "go")
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", "github.com/authz-dev/authz/cmd/authz").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	assert.Contains(t, deps, "github.com/authz-dev/authz/examples/exampledriver", "the list is the command's dependencies")
	assert.NotContains(t, deps, "github.com/authz-dev/authz/internal/testdrivers/liveness", "cmd/authz links the liveness driver")
}

// TestRefusesToRunByHand: without the host's handshake cookie the driver does nothing.
func TestRefusesToRunByHand(t *testing.T) {
	var stderr bytes.Buffer
	assert.Equal(t, 1, run(nil, &stderr))
	assert.Contains(t, stderr.String(), "not meant to be run by hand")
	stderr.Reset()
	assert.Equal(t, 2, run([]string{"-mode", "nap"}, &stderr))
	assert.Contains(t, stderr.String(), `unknown -mode "nap"`)
}
