package main

import (
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/opaplugin"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// writePolicyBundle writes the shipped policy as a bundle file (.tar.gz, as `opa build` makes
// it) with root authz and the given manifest revision, and returns its path.
func writePolicyBundle(t testing.TB, dir, revision string) string {
	t.Helper()
	b := policytest.MakeBundle(t, policytest.BundleSpec{Revision: revision, Roots: []string{"authz"}})
	return testutil.WriteFile(t, dir, "authz.tar.gz", string(b))
}

// freeLoopbackAddr returns a loopback address with a port nobody listened on a moment ago.
func freeLoopbackAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// withoutID is a decision answer without its decision id.
func withoutID(doc map[string]any) map[string]any {
	out := maps.Clone(doc)
	delete(out, "decision_id")
	return out
}

// TestRunInsideOPADecidesLikeServe runs `authz run` (OPA's run command with the gate as
// plugins.authz) as a process, with the policy as a bundle file and the facts of the contract,
// beside `authz serve` with the same facts: on the contract examples that keep those facts,
// the gate answers what authz serve answers (the bundle carries the embedded policy's
// revision, so all but the decision id is equal); OPA's own Data API answers
// data.authz.decision on OPA's port for the same input; OPA's health check counts the gate's
// plugin; OPA's decision log records the gate's decisions; SIGTERM stops it all.
func TestRunInsideOPADecidesLikeServe(t *testing.T) {
	embedded := decisiontest.EmbeddedEngine(t, decision.Options{})
	dir := t.TempDir()
	factsPath := testutil.WriteFile(t, dir, "facts.json", specFacts)
	bundlePath := writePolicyBundle(t, dir, embedded.Revision())
	cfgPath := testutil.WriteFile(t, dir, "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+factsPath+
		"\ndecision_logs:\n  console: true\n")
	opaAddr := freeLoopbackAddr(t)

	ar := startRun(t, "--server", "--addr", opaAddr, "--config-file", cfgPath, "--bundle", bundlePath)
	gate := "http://" + waitListening(t, ar.Stderr)
	opa := "http://" + opaAddr
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitOK(t, c, opa+"/health?plugins", 60*time.Second, ar.Stderr)

	serveErr, _ := startServe(t, "--facts", factsPath, "--addr", "127.0.0.1:0")
	serve := "http://" + waitListening(t, serveErr)

	var ids []string
	compared := 0
	for _, ex := range specexamples.Rows() {
		reqJSON, factsJSON := ex.Fixture().JSON()
		if string(factsJSON) != specFacts {
			continue // the process has one facts file; internal/opaplugin compares every row
		}
		compared++
		t.Run(ex.Name, func(t *testing.T) {
			for _, path := range []string{"/v1/authorize", "/v1/capabilities"} {
				wantStatus, want := testutil.PostJSON(t, c, serve+path, string(reqJSON))
				gotStatus, got := testutil.PostJSON(t, c, gate+path, string(reqJSON))
				assert.Equal(t, wantStatus, gotStatus, path)
				require.NotEmpty(t, got["decision_id"])
				assert.Equal(t, withoutID(want), withoutID(got), path)
			}
			status, doc := testutil.PostJSON(t, c, gate+"/v1/authorize", string(reqJSON))
			require.Equal(t, http.StatusOK, status)
			assert.Equal(t, ex.Allow, doc["allow"])
			assert.Equal(t, ex.Code, doc["code"])
			assert.Equal(t, embedded.Revision(), doc["revision"])
			ids = append(ids, doc["decision_id"].(string))

			// OPA's own Data API, on OPA's port, decides the input the gate assembles.
			code, input, errOut := runCLI(t, string(reqJSON), "decide", "--facts", factsPath, "--print-input")
			require.Equal(t, 0, code, errOut)
			status, opaAnswer := testutil.PostJSON(t, c, opa+"/v1/data/authz/decision", `{"input": `+input+`}`)
			require.Equal(t, http.StatusOK, status, "%v", opaAnswer)
			result, ok := opaAnswer["result"].(map[string]any)
			require.True(t, ok, "OPA's answer: %v", opaAnswer)
			for _, k := range []string{"allow", "code", "message", "reasons", "capabilities"} {
				assert.Equal(t, doc[k], result[k], k)
			}
		})
	}
	require.GreaterOrEqual(t, compared, 3, "rows on the fixture's facts")
	c.CloseIdleConnections()

	ar.Terminate(t)
	log := ar.Stderr.String()
	for _, id := range ids {
		assert.Contains(t, log, `"decision_id":"`+id+`"`, "OPA's decision log records the gate's decision")
	}
	assert.Contains(t, log, `"path":"authz/decision"`)
	testutil.AssertLogOrder(t, log, "shutting down", "HTTP server stopped", "stopped")
}

// startRun starts `authz run args...`; it is killed when the test ends, if still running.
func startRun(t testing.TB, args ...string) *testutil.Process {
	t.Helper()
	return testutil.StartProcess(t, "", runBinary(t), append([]string{"run"}, args...)...)
}

// TestRunInsideOPAWithExampleDriver: with an empty plugins.authz section, `authz run` starts
// the built-in example driver as a real plugin process, as `authz serve` does on its defaults,
// with the policy as a bundle directory: examples/grant.json is granted and examples/deny.json
// denied; OPA's health counts the gate only once the driver has started; SIGTERM stops the
// gate, then the driver.
func TestRunInsideOPAWithExampleDriver(t *testing.T) {
	cfgPath := testutil.WriteFile(t, t.TempDir(), "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n")
	opaAddr := freeLoopbackAddr(t)
	ar := startRun(t, "--server", "--addr", opaAddr, "--config-file", cfgPath, "--bundle", filepath.Join("..", "..", "policies"))
	gate := "http://" + waitListening(t, ar.Stderr)
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitOK(t, c, "http://"+opaAddr+"/health?plugins", 60*time.Second, ar.Stderr)

	assertExampleAnswers(t, c, gate, func(t testing.TB, doc map[string]any) {
		assert.Regexp(t, `^sha256:[0-9a-f]{16}$`, doc["revision"], "a bundle without a revision: a digest of its modules")
	})

	p := onlyPlugin(t, c, gate)
	assert.Equal(t, "example.sandbox", p.ID)
	assert.Equal(t, "ready", p.Status)
	require.NotNil(t, p.Worker)
	pluginPID := p.Worker.PID
	require.Positive(t, pluginPID)
	c.CloseIdleConnections()

	ar.Terminate(t)
	assert.Error(t, syscall.Kill(pluginPID, 0), "the driver process is gone after shutdown")
	testutil.AssertLogOrder(t, ar.Stderr.String(), "shutting down", "HTTP server stopped", "stopping plugins", "plugins stopped")
}

// TestRunRefusesBadPluginConfig: a plugins.authz section OPA's runtime cannot start fails
// `authz run` (exit status 1) before it serves, naming the field.
func TestRunRefusesBadPluginConfig(t *testing.T) {
	bin := runBinary(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	tests := []struct {
		name string
		cfg  string
		want string
	}{
		{name: "address in use", cfg: "plugins:\n  authz:\n    addr: " + busy.Addr().String() + "\n    facts: " + facts + "\n",
			want: "authz: run: plugins.authz.addr: listen on " + busy.Addr().String()},
		{name: "bad addr", cfg: "plugins:\n  authz:\n    addr: nowhere\n    facts: " + facts + "\n", want: "plugins.authz.addr"},
		{name: "unknown field", cfg: "plugins:\n  authz:\n    fatcs: " + facts + "\n", want: "plugins.authz.fatcs: unknown field"},
		{name: "both plugins and facts", cfg: "plugins:\n  authz:\n    plugins: []\n    facts: " + facts + "\n",
			want: "plugins.authz.plugins: must not be set together with plugins.authz.facts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "run", "--server", "--addr", "127.0.0.1:0",
				"--config-file", testutil.WriteFile(t, t.TempDir(), "opa.yaml", tt.cfg))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "output:\n%s", out)
			assert.Equal(t, 1, ee.ExitCode())
			assert.Contains(t, string(out), tt.want)
			assert.NotContains(t, string(out), "Initializing server", "nothing served")
		})
	}
}

// TestRunHelpIsOPAs: `authz run -h` (authz-opa's run) starts with the gate: what it is, the
// plugins.authz section and where the docs are; then comes OPA's help of its run command.
func TestRunHelpIsOPAs(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, runBinary(t), "run", "-h")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	require.NoError(t, err, "stderr: %s", stderr.String())
	out := string(b)
	assert.True(t, strings.HasPrefix(out, opaplugin.Usage), "the gate's help first:\n%s", out)
	for _, s := range []string{"plugins.authz", "plugins:\n    authz:\n      addr: 127.0.0.1:8182", "docs/service.md", "examples/opa.yaml"} {
		assert.Contains(t, opaplugin.Usage, s)
	}
	gate, opa := strings.Index(out, "plugins.authz"), strings.Index(out, "Start an instance of OPA")
	require.Positive(t, opa, out)
	assert.Less(t, gate, opa, "the gate before OPA")
	for _, flag := range []string{"--bundle", "--config-file", "--server", "--verification-key", "--watch", "--log-format"} {
		assert.True(t, strings.Contains(out[opa:], flag), "flag %s in:\n%s", flag, out)
	}
	assert.Empty(t, stderr.String())
}

// TestRunWithoutAuthzOPA: without authz-opa beside authz or on PATH, `authz run` says how to
// run or build it (exit 1), and `authz run -h` prints the gate's help with the same advice
// (exit 0).
func TestRunWithoutAuthzOPA(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	code, out, errOut := runCLI(t, "", "run", "--server")
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Contains(t, errOut, "go run ./cmd/authz-opa run --server -c examples/opa.yaml")
	assert.Contains(t, errOut, "go build -o bin/ ./cmd/authz ./cmd/authz-opa")
	assert.Contains(t, errOut, "authz: run: authz-opa not found")

	code, out, errOut = runCLI(t, "", "run", "-h")
	assert.Equal(t, 0, code, errOut)
	assert.True(t, strings.HasPrefix(out, opaplugin.Usage), out)
	assert.Contains(t, out, "go run ./cmd/authz-opa run")
	assert.Empty(t, errOut)
}

// TestRunFindsAuthzOPA: `authz run ARGS` asks main to become `authz-opa run ARGS`, found beside
// authz or else on PATH.
func TestRunFindsAuthzOPA(t *testing.T) {
	dir := t.TempDir()
	bin := testutil.WriteFile(t, dir, opaBinary, "#!/bin/sh\n")
	require.NoError(t, os.Chmod(bin, 0o755))
	t.Setenv("PATH", dir)
	err := run(t.Context(), []string{"run", "--server", "-c", "x.yaml"}, nil, io.Discard, io.Discard)
	var ex *execRequest
	require.ErrorAs(t, err, &ex)
	assert.Equal(t, bin, ex.path)
	assert.Equal(t, []string{"authz", "run", "--server", "-c", "x.yaml"}, ex.argv)
}
