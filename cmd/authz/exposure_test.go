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

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/testutil"
)

// GET /v1/plugins shows a failed plugin's id and reason code; the path and digests of its
// executable stay in the service log.
func TestPluginLastErrorShowsOnlyAReasonCode(t *testing.T) {
	dir := t.TempDir()
	driver := testutil.WriteFile(t, dir, "secret-driver-path", "#!/bin/sh\nexit 0\n")
	require.NoError(t, os.Chmod(driver, 0o700))
	pin := strings.Repeat("ab", 32)
	cfg := testutil.WriteFile(t, dir, "config.yaml", "plugins:\n  - id: acme.pinned\n    path: "+driver+"\n    sha256: "+pin+"\n")
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
	assert.Equal(t, string(coded.PinMismatch), answer.Plugins[0]["lastError"])
	assert.NotContains(t, body, driver)
	assert.NotContains(t, body, pin)
	c.CloseIdleConnections()
	require.NoError(t, stop())
	assert.Contains(t, stderr.String(), "sha256 mismatch for "+filepath.Clean(driver), "the details are in the service log")
}

// `authz decide` bounds its request as the service does: a request nested too deep or with too
// long a string is exit 2 with one line naming the limit; a number too large for the policy
// engine in an ignored field is decided (exit 0), not an evaluation failure.
func TestDecideInputBounds(t *testing.T) {
	facts := testutil.WriteFile(t, t.TempDir(), "facts.json", string([]byte(`{}`)))
	tests := []struct {
		name     string
		request  string
		wantCode int
		want     string
	}{
		{name: "too deep", request: `{"lease":{"metadata":` + strings.Repeat(`[`, 80) + strings.Repeat(`]`, 80) + `}}`,
			wantCode: 2, want: "is nested deeper than the limit of 64 levels"},
		{name: "string too long", request: `{"command":"` + strings.Repeat("z", 70000) + `"}`,
			wantCode: 2, want: "request field command is a string of 70000 bytes, over the limit of 65536 bytes"},
		{name: "huge number in an ignored field", request: `{"lease":{"metadata":{"n":1e40000}}}`, wantCode: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tt.request, "decide", "--facts", facts)
			require.Equal(t, tt.wantCode, code, "stderr: %s", errOut)
			if tt.wantCode == 0 {
				assert.Empty(t, errOut)
				assert.Contains(t, out, `"allow": false`)
				return
			}
			assert.Empty(t, out)
			assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			assert.Contains(t, errOut, "authz: decide: bad request: ")
			assert.Contains(t, errOut, tt.want)
		})
	}
}

// The access-control flags reach the service: --authentication token with a tokens file.
func TestServeTokenAuthenticationFlags(t *testing.T) {
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", `{}`)
	const token = "0123456789abcdef0123456789abcdef"
	tokens := testutil.WriteFile(t, dir, "tokens", token+" inspect\n")
	stderr, stop := startServe(t, "--facts", facts, "--addr", "127.0.0.1:0",
		"--authentication", "token", "--authentication-tokens-file", tokens, "--allowed-host", "authz.internal")
	base := "http://" + waitListening(t, stderr)
	c := &http.Client{Timeout: 10 * time.Second}
	get := func(auth, host string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/facts", nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusUnauthorized, get("", ""))
	assert.Equal(t, http.StatusOK, get("Bearer "+token, ""))
	assert.Equal(t, http.StatusOK, get("Bearer "+token, "authz.internal"))
	assert.Equal(t, http.StatusForbidden, get("Bearer "+token, "rebound.example"))
	c.CloseIdleConnections()
	require.NoError(t, stop())
	assert.Contains(t, stderr.String(), "authentication=token")
	assert.NotContains(t, stderr.String(), token)

	code, _, errOut := runCLI(t, "", "serve", "--facts", facts, "--authentication", "basic")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, `authentication.mode: must be off, token or tls; got "basic"`)
}

// A replay of GET /v1/facts with `authz decide` gives the decision the service gave, even for
// a facts file whose section names repeat in another case.
func TestDecideReplaysServedFacts(t *testing.T) {
	dir := t.TempDir()
	plugin := func(status string) string {
		return `{"id": "test.plugin", "key": "acme.daytona", "status": "` + status + `",
		  "manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider",
		    "sandboxCapabilities": {"duplexCommandStream": true}}]}}`
	}
	facts := testutil.WriteFile(t, dir, "facts.json", `{"plugins": [`+plugin("disabled")+`], "Plugins": [`+plugin("ready")+`],
		"workers": {"test.plugin": {"supportedMethods": ["duplexChannelOpen"]}}}`)
	const request = `{"operation": "openDuplexChannel",
		"environment": {"id": "env-1", "driver": "sandbox", "config": {"provider": "daytona"}},
		"lease": {"id": "lease-1", "leasePolicy": "ephemeral",
		  "metadata": {"driver": "sandbox", "sandboxProviderPlugin": true, "pluginId": "test.plugin", "provider": "daytona"}}}`
	stderr, stop := startServe(t, "--facts", facts, "--addr", "127.0.0.1:0")
	base := "http://" + waitListening(t, stderr)
	c := &http.Client{Timeout: 10 * time.Second}
	status, live := testutil.PostJSON(t, c, base+"/v1/authorize", request)
	require.Equal(t, http.StatusOK, status)
	resp, err := c.Get(base + "/v1/facts")
	require.NoError(t, err)
	served, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	c.CloseIdleConnections()
	require.NoError(t, stop())

	code, out, errOut := runCLI(t, request, "decide", "--facts", testutil.WriteFile(t, dir, "served.json", string(served)))
	require.Equal(t, 0, code, errOut)
	var replay map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &replay))
	for _, k := range []string{"allow", "code", "reasons", "capabilities"} {
		assert.Equal(t, live[k], replay[k], k)
	}
	assert.Equal(t, false, live["allow"], "the decisions read the disabled plugin")
}
