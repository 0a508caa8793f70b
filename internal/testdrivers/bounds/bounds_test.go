package bounds

import (
	"go/build"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDriverReportsWhatItsOptionsSay(t *testing.T) {
	d := &Driver{opts: Options{PluginKey: "k", Methods: 3, DupMethods: 2, Entries: 2, UnknownCaps: 4, BadCaps: 1, StringLen: 10}}
	desc, err := d.Describe(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "kxxxxxxxxx", desc.Key)
	require.Len(t, desc.EnvironmentDrivers, 3)
	assert.Len(t, desc.EnvironmentDrivers[0].SandboxCapabilities, 1+4+1)
	assert.Equal(t, "boundsxxxx", desc.EnvironmentDrivers[0].DriverKey)
	methods, err := d.SupportedMethods(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"duplexChannelOpen", "method0xxx", "method1xxx", "method2xxx", "duplexChannelOpen", "duplexChannelOpen"}, methods)
}

// TestNotInTheShippedBinary: the authz command never links this hostile driver.
func TestNotInTheShippedBinary(t *testing.T) {
	goTool := filepath.Join(build.Default.GOROOT, "bin", "go")
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", "github.com/authz-dev/authz/cmd/authz").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "github.com/authz-dev/authz/driverplugin", "the list is the command's dependencies")
	assert.NotContains(t, string(out), "internal/testdrivers")
}
