package pluginhost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResolve: "@self" becomes this executable, pinned by its own digest unless a pin is
// configured; relative paths are taken from the working directory; pins are lower case.
func TestResolve(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	exe, err = filepath.EvalSymlinks(exe)
	require.NoError(t, err)
	sum, err := FileSHA256(exe)
	require.NoError(t, err)
	upper := strings.ToUpper("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	disabled := false

	cfg := Config{Plugins: []PluginConfig{
		{ID: "example.sandbox", Path: SelfExecutable, Args: []string{"example-driver"}},
		{ID: "rel", Path: "drivers/x", SHA256: upper, Enabled: &disabled},
		{ID: "pinned-self", Path: SelfExecutable, SHA256: upper},
		{ID: "no-path"},
	}}
	got, err := cfg.Resolve()
	require.NoError(t, err)
	require.Len(t, got.Plugins, 4)
	assert.Equal(t, exe, got.Plugins[0].Path)
	assert.Equal(t, sum, got.Plugins[0].SHA256, "@self is pinned by its own digest")
	assert.Equal(t, []string{"example-driver"}, got.Plugins[0].Args)
	wd, err := os.Getwd()
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(wd, "drivers", "x"), got.Plugins[1].Path)
	assert.Equal(t, strings.ToLower(upper), got.Plugins[1].SHA256)
	assert.False(t, got.Plugins[1].IsEnabled())
	assert.Equal(t, exe, got.Plugins[2].Path)
	assert.Equal(t, strings.ToLower(upper), got.Plugins[2].SHA256, "a configured pin is kept")
	assert.Empty(t, got.Plugins[3].Path, "an empty path is left for Validate to report")
	assert.Equal(t, SelfExecutable, cfg.Plugins[0].Path, "the configuration resolved is not changed")
	require.ErrorContains(t, got.Validate(), "plugins[3].path: must not be empty")
}

// TestHostReady: the host is ready once every enabled plugin has been ready once; disabled
// plugins do not count, and a host without enabled plugins is ready at once.
func TestHostReady(t *testing.T) {
	runParallel(t)
	t.Run("no enabled plugin", func(t *testing.T) {
		off := false
		p := driverPlugin(t, "off")
		p.Enabled = &off
		h, _ := startHost(t, testConfig(t, p))
		assert.True(t, h.Ready())
	})
	t.Run("ready after the first start", func(t *testing.T) {
		off := false
		disabled := driverPlugin(t, "off")
		disabled.Enabled = &off
		h, err := New(testConfig(t, driverPlugin(t, "a"), disabled))
		require.NoError(t, err)
		assert.False(t, h.Ready(), "not started")
		require.NoError(t, h.Start(t.Context()))
		require.NoError(t, h.WaitStarted(t.Context()))
		assert.True(t, h.Ready())
		require.NoError(t, h.Close())
		assert.True(t, h.Ready(), "has been ready once")
	})
}
