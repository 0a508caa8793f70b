package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// specFacts is the facts of docs/contract.md, "The facts (host state)".
var specFacts = func() string { _, facts := specexamples.NewFixture().JSON(); return string(facts) }()

// specRequest is the request of docs/contract.md, "The request", with a secret in the lease metadata.
const specRequest = `{
  "operation": "openDuplexChannel",
  "environment": {"id": "env-1", "driver": "sandbox", "config": {"provider": "daytona"}},
  "lease": {
    "id": "lease-1", "companyId": "company-1", "leasePolicy": "ephemeral",
    "providerLeaseId": "provider-lease-1",
    "metadata": {"driver": "sandbox", "sandboxProviderPlugin": true, "pluginId": "test.plugin", "provider": "daytona", "token": "s3cret"}
  },
  "command": ["sh", "-c", "echo hi"]
}`

func TestServeRejectsBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	badPin := testutil.WriteFile(t, dir, "bad-pin.yaml", "plugins:\n  - id: acme.daytona\n    path: /opt/daytona\n    sha256: abc\n")
	unknown := testutil.WriteFile(t, dir, "unknown.yaml", "adress: 127.0.0.1:1\n")
	badFacts := testutil.WriteFile(t, dir, "bad-facts.json", `{"plugins": null}`)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "unknown flag", args: []string{"--nope"}, want: ""},
		{name: "positional argument", args: []string{"now"}, want: `unexpected argument "now"`},
		{name: "address without port", args: []string{"--addr", "localhost"}, want: "addr: "},
		{name: "relative unix socket", args: []string{"--addr", "unix://authz.sock"}, want: "addr: "},
		{name: "bad pin in the config file", args: []string{"--config", badPin}, want: "plugins[0].sha256: must be 64 hex characters"},
		{name: "unknown field in the config file", args: []string{"--config", unknown}, want: "field adress not found"},
		{name: "missing config file", args: []string{"--config", filepath.Join(dir, "none.yaml")}, want: "none.yaml"},
		{name: "required decision log without a destination", args: []string{"--decision-log-required", "--facts", facts}, want: "decisionLog.required: needs decisionLog.path"},
		{name: "mask outside the input", args: []string{"--decision-log-mask", "/result/allow", "--facts", facts}, want: "decisionLog.mask[0]: "},
		{name: "certificate without key", args: []string{"--tls-cert", "/c.pem", "--facts", facts}, want: "tls.key: must be set together with tls.cert"},
		{name: "unreadable certificate", args: []string{"--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem", "--facts", facts}, want: "tls.cert: "},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: "log.level: "},
		{name: "zero body limit", args: []string{"--max-body-bytes", "0"}, want: "maxBodyBytes: must be positive"},
		{name: "missing facts file", args: []string{"--facts", filepath.Join(dir, "none.json")}, want: "none.json"},
		{name: "malformed facts file", args: []string{"--facts", badFacts}, want: "facts.plugins"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := run(ctx, append([]string{"serve"}, tt.args...), strings.NewReader(""), &stdout, &stderr)
			var ee *exitError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, 2, ee.code, "message %q", ee.msg)
			assert.Contains(t, ee.msg, tt.want)
			assert.Empty(t, stdout.String())
		})
	}
}

// startServe runs `authz serve args...` in process until the test ends; stop cancels it and
// returns run's error.
func startServe(t testing.TB, args ...string) (stderr *testutil.SyncBuffer, stop func() error) {
	t.Helper()
	stderr = &testutil.SyncBuffer{}
	stop = testutil.RunUntilStopped(t, "serve", 30*time.Second, func(ctx context.Context) error {
		return run(ctx, append([]string{"serve"}, args...), strings.NewReader(""), io.Discard, stderr)
	})
	return stderr, stop
}

// listeningAddr matches the `listening addr=...` log line, as text or as a JSON line.
var listeningAddr = regexp.MustCompile(`(?:listening: addr=|"@message":"listening",.*"addr":")([^"\s]+)`)

// waitListening waits for the `listening addr=...` log line and returns the address.
func waitListening(t testing.TB, stderr *testutil.SyncBuffer) string {
	t.Helper()
	return testutil.WaitLogged(t, stderr, listeningAddr, 30*time.Second)
}

func TestServeStaticFactsOverTCP(t *testing.T) {
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	logPath := filepath.Join(dir, "decisions.log")
	// The file says one address and no mask; the flags override both.
	cfgPath := testutil.WriteFile(t, dir, "config.yaml", "addr: 127.0.0.1:1\ndecisionLog:\n  path: "+logPath+"\n  mask: []\n")

	stderr, stop := startServe(t, "--config", cfgPath, "--facts", facts, "--addr", "127.0.0.1:0",
		"--decision-log-mask", "/input/lease/metadata/token")
	addr := waitListening(t, stderr)
	require.NotEqual(t, "127.0.0.1:1", addr)
	base := "http://" + addr
	c := &http.Client{Timeout: 10 * time.Second}

	resp, err := c.Get(base + "/health/ready")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "a facts file is ready at once")

	status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", specRequest)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, true, doc["allow"])
	status, doc = testutil.PostJSON(t, c, base+"/v1/data/authz/decision", `{"input":`+specRequest+`}`)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, true, doc["result"].(map[string]any)["allow"])

	c.CloseIdleConnections()
	require.NoError(t, stop())
	assert.Contains(t, stderr.String(), "stopped")

	b, err := os.ReadFile(logPath)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	require.Len(t, lines, 2)
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &line))
	md := line["input"].(map[string]any)["lease"].(map[string]any)["metadata"].(map[string]any)
	assert.Equal(t, "[MASKED]", md["token"], "--decision-log-mask replaced the file's empty list")
	env := line["input"].(map[string]any)["environment"].(map[string]any)
	assert.Equal(t, map[string]any{"provider": "daytona"}, env["config"], "the flag's list replaced the default mask too")
}

func TestServeUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "authz") // short: unix socket paths are limited to ~100 bytes
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	sock := filepath.Join(dir, "authz.sock")

	stderr, stop := startServe(t, "--facts", facts, "--addr", "unix://"+sock)
	assert.Equal(t, "unix://"+sock, waitListening(t, stderr))

	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	status, doc := testutil.PostJSON(t, c, "http://authz/v1/authorize", specRequest)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, true, doc["allow"])
	c.CloseIdleConnections()

	require.NoError(t, stop())
	_, err = os.Stat(sock)
	assert.True(t, os.IsNotExist(err), "the socket is removed at shutdown")
}

// TestServeEndToEndWithExampleDriver builds the authz binary and runs `authz serve` on its
// defaults (but an ephemeral port): the example driver is started as a real plugin subprocess,
// examples/grant.json is granted and examples/deny.json denied, and SIGTERM stops the service
// and its plugin.
func TestServeEndToEndWithExampleDriver(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	require.Contains(t, commands, "example-driver", "the default service needs the example driver")
	proc := startServeProcess(t, "", "--addr", "127.0.0.1:0", "--decision-log", "-")
	base := "http://" + proc.addr
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 60*time.Second, proc.Stderr)

	assertExampleAnswers(t, c, base, nil)

	p := onlyPlugin(t, c, base)
	assert.Equal(t, "example.sandbox", p.ID)
	assert.Equal(t, "ready", p.Status)
	require.NotNil(t, p.Worker)
	assert.Contains(t, p.Worker.SupportedMethods, "duplexChannelOpen")
	pluginPID := p.Worker.PID
	require.Positive(t, pluginPID)
	c.CloseIdleConnections()

	proc.Terminate(t)
	stderr := proc.Stderr.String()
	assert.Contains(t, stderr, `"decision_id"`, "decision log on stderr")
	assert.Error(t, syscall.Kill(pluginPID, 0), "the plugin process is gone after shutdown")
	testutil.AssertLogOrder(t, stderr, "shutting down", "HTTP server stopped", "stopping plugins", "plugins stopped", "stopped: exiting")
}

// assertExampleAnswers posts examples/grant.json and examples/deny.json to base/v1/authorize:
// the first is granted, the second denied; check, when not nil, looks at each answer too.
func assertExampleAnswers(t *testing.T, c *http.Client, base string, check func(t testing.TB, doc map[string]any)) {
	t.Helper()
	for _, tt := range []struct {
		name      string
		file      string
		wantAllow bool
	}{
		{name: "grant", file: "grant.json", wantAllow: true},
		{name: "deny", file: "deny.json", wantAllow: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "..", "examples", tt.file))
			require.NoError(t, err)
			status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", string(b))
			require.Equal(t, http.StatusOK, status)
			assert.Equal(t, tt.wantAllow, doc["allow"], "%v", doc)
			if check != nil {
				check(t, doc)
			}
		})
	}
}

// pluginStates is GET base/v1/plugins by plugin id.
func pluginStates(t testing.TB, c *http.Client, base string) map[string]api.PluginState {
	t.Helper()
	resp, err := c.Get(base + "/v1/plugins")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var a struct {
		Plugins []api.PluginState `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal(body, &a), "%s", body)
	out := map[string]api.PluginState{}
	for _, p := range a.Plugins {
		out[p.ID] = p
	}
	require.Len(t, out, len(a.Plugins), "plugin ids are unique: %s", body)
	return out
}

// onlyPlugin is the one plugin GET base/v1/plugins shows.
func onlyPlugin(t testing.TB, c *http.Client, base string) api.PluginState {
	t.Helper()
	states := pluginStates(t, c, base)
	require.Len(t, states, 1)
	for _, p := range states {
		return p
	}
	panic("unreachable")
}

// TestServeBindFailureIsALogLine: an address another process holds ends `authz serve` with
// exit status 1 and one line of the service log in its format, a JSON line with --log-json,
// that names the address; nothing in plain text among the JSON lines.
func TestServeBindFailureIsALogLine(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { held.Close() })
	facts := testutil.WriteFile(t, t.TempDir(), "facts.json", specFacts)
	var stderr bytes.Buffer
	err = run(t.Context(), []string{"serve", "--log-json", "--facts", facts, "--addr", held.Addr().String()}, strings.NewReader(""), io.Discard, &stderr)
	var ee *exitError
	require.ErrorAs(t, err, &ee, "%v", err)
	assert.Equal(t, 1, ee.code)
	assert.Empty(t, ee.msg, "main would print it as a plain line")
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "a log line that is not JSON: %q", line)
		if m["@level"] == "error" && m["addr"] == held.Addr().String() {
			found = true
			assert.Contains(t, m["error"], "address already in use")
		}
	}
	assert.True(t, found, "no JSON ERROR line names the address:\n%s", stderr.String())
}
