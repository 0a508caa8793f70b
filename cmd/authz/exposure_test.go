package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
)

// GET /v1/plugins shows a failed plugin's id and reason code; the path and digests of its
// executable stay in the service log.
func TestPluginLastErrorShowsOnlyAReasonCode(t *testing.T) {
	dir := t.TempDir()
	driver := writeFile(t, dir, "secret-driver-path", "#!/bin/sh\nexit 0\n")
	require.NoError(t, os.Chmod(driver, 0o700))
	pin := strings.Repeat("ab", 32)
	cfg := writeFile(t, dir, "config.yaml", "plugins:\n  - id: acme.pinned\n    path: "+driver+"\n    sha256: "+pin+"\n")
	stderr, stop := startServe(t, "--config", cfg, "--addr", "127.0.0.1:0")
	base := "http://" + waitListening(t, stderr)
	c := &http.Client{Timeout: 10 * time.Second}

	var body string
	require.Eventually(t, func() bool {
		resp, err := c.Get(base + "/v1/plugins")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return strings.Contains(body, `"status":"error"`)
	}, 30*time.Second, 50*time.Millisecond, "the plugin never failed; stderr:\n%s", stderr)

	var answer struct {
		Plugins []map[string]any `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &answer))
	require.Len(t, answer.Plugins, 1)
	assert.Equal(t, "acme.pinned", answer.Plugins[0]["id"])
	assert.Equal(t, pluginhost.ReasonPinMismatch, answer.Plugins[0]["lastError"])
	assert.NotContains(t, body, driver)
	assert.NotContains(t, body, pin)
	c.CloseIdleConnections()
	require.NoError(t, stop())
	assert.Contains(t, stderr.String(), "sha256 mismatch for "+filepath.Clean(driver), "the details are in the service log")
}
