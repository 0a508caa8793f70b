package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// TestServeDoesNotLinkOPACommandLine: authz, and so `go run ./cmd/authz serve` on a fresh
// machine, compiles neither OPA's command line nor its runtime; authz-opa has them.
func TestServeDoesNotLinkOPACommandLine(t *testing.T) {
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		require.NoError(t, err)
		return strings.Fields(string(out))
	}
	heavy := []string{"github.com/open-policy-agent/opa/cmd", "github.com/open-policy-agent/opa/v1/runtime"}
	for _, d := range deps(".") {
		for _, h := range heavy {
			assert.False(t, d == h || strings.HasPrefix(d, h+"/"), "authz imports %s", d)
		}
	}
	assert.Subset(t, deps("../authz-opa"), heavy, "authz-opa is OPA's command line")
}

// TestRunExampleConfig: `authz run -c examples/opa.yaml` (the gate's address moved to a free
// loopback port) grants examples/grant.json and denies examples/deny.json, deciding with the
// built-in example driver.
func TestRunExampleConfig(t *testing.T) {
	opaAddr := freeLoopbackAddr(t)
	ar := startRun(t, "--server", "--addr", opaAddr, "-c", filepath.Join("..", "..", "examples", "opa.yaml"),
		"--set", "plugins.authz.addr=127.0.0.1:0")
	gate := "http://" + waitListening(t, ar.Stderr)
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitOK(t, c, "http://"+opaAddr+"/health?plugins", 60*time.Second, ar.Stderr)
	assertExampleAnswers(t, c, gate, nil)
	c.CloseIdleConnections()
	ar.Terminate(t)
	assert.NotContains(t, ar.Stderr.String(), "plugins.authz is not in OPA's configuration")
}

// TestRunWarnsWithoutGate: without a plugins.authz section OPA runs without the gate, and a
// log line says so and how to add it.
func TestRunWarnsWithoutGate(t *testing.T) {
	opaAddr := freeLoopbackAddr(t)
	ar := startRun(t, "--server", "--addr", opaAddr)
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitOK(t, c, "http://"+opaAddr+"/health", 60*time.Second, ar.Stderr)
	c.CloseIdleConnections()
	ar.Terminate(t)
	log := ar.Stderr.String()
	assert.Contains(t, log, "plugins.authz is not in OPA's configuration: the gate does not serve")
	assert.Contains(t, log, "examples/opa.yaml")
	assert.Contains(t, log, "--set plugins.authz.addr=127.0.0.1:8182")
}

// TestRunLogFormatFollowsOPA: OPA's --log-format sets the gate's log format too (json, OPA's
// default, or text), unless plugins.authz sets log.json: OPA's lines and the gate's read alike.
func TestRunLogFormatFollowsOPA(t *testing.T) {
	facts := testutil.WriteFile(t, t.TempDir(), "facts.json", specFacts)
	for _, tt := range []struct {
		name     string
		format   []string
		section  string
		wantJSON bool
	}{
		{name: "default json", wantJSON: true},
		{name: "json", format: []string{"--log-format", "json"}, wantJSON: true},
		{name: "text", format: []string{"--log-format", "text"}},
		{name: "text, the section asks for json", format: []string{"--log-format", "text"}, section: "    log: {json: true}\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testutil.WriteFile(t, t.TempDir(), "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+facts+"\n"+tt.section)
			opaAddr := freeLoopbackAddr(t)
			ar := startRun(t, append([]string{"--server", "--addr", opaAddr, "-c", cfg}, tt.format...)...)
			waitListening(t, ar.Stderr)
			c := &http.Client{Timeout: 10 * time.Second}
			testutil.WaitOK(t, c, "http://"+opaAddr+"/health?plugins", 60*time.Second, ar.Stderr)
			c.CloseIdleConnections()
			ar.Terminate(t)
			var gateLines, opaLines int
			sc := bufio.NewScanner(strings.NewReader(ar.Stderr.String()))
			for sc.Scan() {
				line := sc.Text()
				isJSON := strings.HasPrefix(line, "{") && json.Valid([]byte(line))
				gateLine := strings.Contains(line, "authz: ") || strings.Contains(line, `"@module":"authz`)
				if gateLine {
					gateLines++
				} else {
					opaLines++
				}
				if gateLine && tt.section != "" {
					assert.True(t, isJSON, "the section's log.json wins: %s", line)
					continue
				}
				assert.Equal(t, tt.wantJSON, isJSON, "%s", line)
			}
			assert.Positive(t, gateLines, "the gate logged")
			assert.Positive(t, opaLines, "OPA logged")
		})
	}
}

// TestRunMasksEnvironmentConfigInOPADecisionLog: OPA's decision log masks
// /input/environment/config by default, in the gate's decisions and in OPA's own queries of
// data.authz.decision, so a driver's configuration (an API URL, a token) is not logged; a
// mask policy of the user's (data.system.log.mask) replaces the default.
func TestRunMasksEnvironmentConfigInOPADecisionLog(t *testing.T) {
	const secret = "https://api.internal.example/token-7f3a"
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "grant.json"))
	require.NoError(t, err)
	var req map[string]any
	require.NoError(t, json.Unmarshal(b, &req))
	req["environment"].(map[string]any)["config"].(map[string]any)["apiUrl"] = secret
	reqJSON, err := json.Marshal(req)
	require.NoError(t, err)

	dir := t.TempDir()
	userMask := filepath.Join(dir, "mask")
	require.NoError(t, os.MkdirAll(userMask, 0o700))
	testutil.WriteFile(t, userMask, "mask.rego", "package system.log\nmask contains \"/input/lease/companyId\"\n")
	testutil.WriteFile(t, userMask, ".manifest", `{"roots": ["system/log"]}`)
	// A bundle without a manifest owns every root: its activation erases all data, the
	// default mask included, which is written again.
	rootless := filepath.Join(dir, "rootless")
	for _, f := range []string{"decision.rego", filepath.Join("tables", "tables.rego")} {
		src, err := os.ReadFile(filepath.Join("..", "..", "policies", "authz", f))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(rootless, f)), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(rootless, f), src, 0o600))
	}
	for _, tt := range []struct {
		name       string
		args       []string
		wantSecret bool
	}{
		{name: "default"},
		{name: "a bundle that owns every root", args: []string{"--bundle", rootless}},
		{name: "the user's mask policy", args: []string{"--bundle", userMask, "--bundle", filepath.Join("..", "..", "policies")}, wantSecret: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testutil.WriteFile(t, t.TempDir(), "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\ndecision_logs:\n  console: true\n")
			opaAddr := freeLoopbackAddr(t)
			ar := startRun(t, append([]string{"--server", "--addr", opaAddr, "-c", cfg}, tt.args...)...)
			gate := "http://" + waitListening(t, ar.Stderr)
			c := &http.Client{Timeout: 10 * time.Second}
			testutil.WaitOK(t, c, "http://"+opaAddr+"/health?plugins", 60*time.Second, ar.Stderr)

			status, doc := testutil.PostJSON(t, c, gate+"/v1/authorize", string(reqJSON))
			require.Equal(t, http.StatusOK, status, "%v", doc)
			gateEvent := loggedEvent(t, ar.Stderr, doc["decision_id"].(string))
			status, answer := testutil.PostJSON(t, c, "http://"+opaAddr+"/v1/data/authz/decision", `{"input": `+string(reqJSON)+`}`)
			require.Equal(t, http.StatusOK, status, "%v", answer)
			opaEvent := loggedEvent(t, ar.Stderr, answer["decision_id"].(string))
			c.CloseIdleConnections()
			ar.Terminate(t)

			// The gate masks its own decisions (plugins.authz decisionLog.mask); OPA's mask
			// policy applies to its own queries.
			line, err := json.Marshal(gateEvent)
			require.NoError(t, err)
			assert.NotContains(t, string(line), secret, "the gate's decision: %s", line)
			assert.NotContains(t, string(line), "apiUrl", "the gate's decision: %s", line)
			line, err = json.Marshal(opaEvent)
			require.NoError(t, err)
			if tt.wantSecret {
				assert.Contains(t, string(line), secret, "the user's masks replace the default")
				assert.NotContains(t, string(line), "company-1", "the user's masks apply")
				return
			}
			assert.NotContains(t, string(line), secret, "OPA's query: %s", line)
			assert.NotContains(t, string(line), "apiUrl", "OPA's query: %s", line)
			assert.Contains(t, opaEvent["erased"], "/input/environment/config")
		})
	}
}
