package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/testutil"
)

// pluginConfig is one entry of the plugins list of a configuration file: the example driver
// at path under pin, reporting plugin key key.
func pluginConfig(id, path, pin, key string) string {
	return fmt.Sprintf("  - id: %s\n    path: %s\n    sha256: %s\n    args: [example-driver, --plugin-key, %s]\n", id, path, pin, key)
}

// TestServeRepinsPluginsOnSIGHUP edits the configuration file of a running `authz serve` and
// sends SIGHUP: a plugin re-pinned to another binary restarts on it, a plugin added starts, a
// plugin removed stops, and a plugin left as it was keeps its worker. A file that does not
// validate, and a pin that does not match, change nothing for the others.
func TestServeRepinsPluginsOnSIGHUP(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	bin := authzBinary(t)
	dir := t.TempDir()
	first, firstSum := testutil.CopyWithTrailer(t, bin, dir, "driver-1", "\nanother build: driver-1\n")
	second, secondSum := testutil.CopyWithTrailer(t, bin, dir, "driver-2", "\nanother build: driver-2\n")
	binSum, err := pluginhost.FileSHA256(bin)
	require.NoError(t, err)
	conf := filepath.Join(dir, "authz.yaml")
	write := func(plugins ...string) {
		require.NoError(t, os.WriteFile(conf, []byte("addr: 127.0.0.1:0\nplugins:\n"+strings.Join(plugins, "")), 0o600))
	}
	steady := pluginConfig("steady", bin, binSum, "acme.steady")
	write(steady, pluginConfig("moving", first, firstSum, "acme.moving"), pluginConfig("leaving", bin, binSum, "acme.leaving"))

	p := startServeProcess(t, "", "--config", conf)
	base := "http://" + p.addr
	c := &http.Client{Timeout: 15 * time.Second}
	defer c.CloseIdleConnections()
	// readyIn reports whether every plugin of ids is ready with a worker in st.
	readyIn := func(st map[string]api.PluginState, ids ...string) bool {
		for _, id := range ids {
			if st[id].Status != pluginhost.StatusReady || st[id].Worker == nil {
				return false
			}
		}
		return true
	}
	ready := func(ids ...string) func() bool {
		return func() bool { return readyIn(pluginStates(t, c, base), ids...) }
	}
	require.Eventually(t, ready("steady", "moving", "leaving"), 60*time.Second, 50*time.Millisecond, "stderr:\n%s", p.Stderr)
	before := pluginStates(t, c, base)

	// Re-pin "moving" to another binary, add "joining", remove "leaving".
	write(steady, pluginConfig("moving", second, secondSum, "acme.moving"), pluginConfig("joining", bin, binSum, "acme.joining"))
	p.Signal(t, syscall.SIGHUP)
	require.Eventually(t, func() bool {
		// One reading of the states: a worker seen in one reading may be gone in the next.
		st := pluginStates(t, c, base)
		_, left := st["leaving"]
		return !left && readyIn(st, "steady", "moving", "joining") && st["moving"].Worker.Generation > before["moving"].Worker.Generation
	}, 60*time.Second, 50*time.Millisecond, "stderr:\n%s", p.Stderr)
	after := pluginStates(t, c, base)
	assert.Equal(t, before["steady"].Worker.PID, after["steady"].Worker.PID, "an unchanged plugin keeps its worker")
	assert.Equal(t, before["steady"].Worker.Generation, after["steady"].Worker.Generation)
	assert.NotEqual(t, before["moving"].Worker.PID, after["moving"].Worker.PID, "a re-pinned plugin runs a new worker")
	assert.False(t, processAlive(before["leaving"].Worker.PID), "a removed plugin's worker has ended")
	// The new workers may be ready before Reconfigure returns (it also hashes every binary again).
	assert.Eventually(t, func() bool { return strings.Contains(p.Stderr.String(), "SIGHUP: plugins reconfigured") },
		20*time.Second, 20*time.Millisecond, "stderr:\n%s", p.Stderr)

	// A file that does not validate changes nothing.
	require.NoError(t, os.WriteFile(conf, []byte("plugins:\n  - id: moving\n    path: relative/driver\n"), 0o600))
	p.Signal(t, syscall.SIGHUP)
	require.Eventually(t, func() bool { return strings.Contains(p.Stderr.String(), "the configuration was not applied") },
		20*time.Second, 20*time.Millisecond, "stderr:\n%s", p.Stderr)
	assert.Equal(t, after["moving"].Worker.PID, pluginStates(t, c, base)["moving"].Worker.PID)

	// A pin that does not match the binary: that plugin stops with PIN_MISMATCH, the others run on.
	write(steady, pluginConfig("moving", first, secondSum, "acme.moving"), pluginConfig("joining", bin, binSum, "acme.joining"))
	p.Signal(t, syscall.SIGHUP)
	require.Eventually(t, func() bool { return pluginStates(t, c, base)["moving"].LastErrorCode == "PIN_MISMATCH" },
		60*time.Second, 50*time.Millisecond, "stderr:\n%s", p.Stderr)
	final := pluginStates(t, c, base)
	assert.Nil(t, final["moving"].Worker)
	assert.Equal(t, before["steady"].Worker.PID, final["steady"].Worker.PID)
	assert.Equal(t, after["joining"].Worker.PID, final["joining"].Worker.PID)

	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 30*time.Second))
}

// processAlive reports whether pid names a live process (not a zombie).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(rest, "Z")
}
