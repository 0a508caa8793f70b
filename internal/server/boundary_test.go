package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testutil"
)

// An endpoint is reached only by its path as written: a percent-encoded separator or letter
// names no endpoint, whatever it decodes to.
func TestEncodedPathsAreNotRouted(t *testing.T) {
	url := startHTTP(t, newServer(t))
	for _, path := range []string{
		"/v1%2Fplugins", "/v1%2ffacts", "/%6detrics", "/health%2Fready", "/v1/%66acts",
		"/%2Fv1/plugins", "/v1/plugins%2F", "/v1/authorize%00",
	} {
		t.Run(path, func(t *testing.T) {
			a := get(t, url+path)
			requireAPIError(t, a, http.StatusNotFound, coded.NotFound)
			assert.NotContains(t, string(a.body), "plugins\":[")
		})
	}
	// The plain paths still answer.
	for _, path := range []string{"/v1/plugins", "/v1/facts", "/metrics", "/health/ready"} {
		assert.Equal(t, http.StatusOK, get(t, url+path).status, path)
	}
	assert.Contains(t, string(get(t, url+"/metrics").body), `authz_http_requests_total{route="other",status="404"} 8`)
}

// A decision answered 503 because its log line could not be written is counted as the deny the
// client got, never as the grant it replaced.
func TestDecisionsTotalCountsWhatWasAnswered(t *testing.T) {
	s := newServer(t, withDecisionLog(brokenWriter{}), withConfig(func(c *server.Config) {
		c.DecisionLog.Path = "-"
		c.DecisionLog.Required = true
	}))
	url := startHTTP(t, s)
	require.Equal(t, http.StatusServiceUnavailable, post(t, url+"/v1/authorize", fixture(t, nil)).status)
	text := string(get(t, url+"/metrics").body)
	assert.NotContains(t, text, `authz_decisions_total{allow="true"`)
	assert.Contains(t, text, `authz_decisions_total{allow="false",code="DECISION_LOG_UNAVAILABLE",operation="openDuplexChannel"} 1`)
	assert.Contains(t, text, `authz_http_requests_total{route="/v1/authorize",status="503"} 1`)
}

// The facts file is parsed once: what GET /v1/facts and /v1/plugins show is what the decisions
// read, and a replay of GET /v1/facts (as `authz decide --facts` does it) reproduces every
// decision, even for a file whose keys differ in case only or repeat.
func TestServedFactsReplayEveryDecision(t *testing.T) {
	const facts = `{
  "plugins": [
    {"id": "test.plugin", "key": "acme.daytona", "status": "disabled", "Status": "ready",
     "manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider",
        "sandboxCapabilities": {"duplexCommandStream": true}}]}},
    {"id": "runner.plugin", "key": "acme.runner", "status": "ready",
     "manifest": {"environmentDrivers": [{"driverKey": "runner", "kind": "sandbox_provider",
        "sandboxCapabilities": {"runnerWebSocketIngress": true}}]}}
  ],
  "Plugins": [
    {"id": "test.plugin", "key": "acme.daytona", "status": "ready",
     "manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider",
        "sandboxCapabilities": {"duplexCommandStream": true}}]}}
  ],
  "workers": {"test.plugin": {"supportedMethods": ["duplexChannelOpen"]},
              "runner.plugin": {"supportedMethods": ["environmentRunnerIngressEndpoint"], "configValid": false}},
  "WORKERS": {"runner.plugin": {"supportedMethods": ["environmentRunnerIngressEndpoint"]}},
  "builtinProviders": {"fake": {"execute": true}},
  "BuiltinProviders": {"fake": {"execute": true, "supportsReusableLeases": true}}
}`
	path := filepath.Join(t.TempDir(), "facts.json")
	require.NoError(t, os.WriteFile(path, []byte(facts), 0o600))
	sf, err := server.LoadStaticFacts(path)
	require.NoError(t, err)
	url := startHTTP(t, newServer(t, withFacts(sf)))

	plugins := get(t, url+"/v1/plugins").json(t)["plugins"].([]any)
	require.Len(t, plugins, 2)
	assert.Equal(t, "disabled", plugins[0].(map[string]any)["status"], "the status the decisions read")

	served := get(t, url+"/v1/facts")
	require.Equal(t, http.StatusOK, served.status)
	assert.NotContains(t, string(served.body), `"Plugins"`)
	replayPath := filepath.Join(t.TempDir(), "served.json")
	require.NoError(t, os.WriteFile(replayPath, served.body, 0o600))
	replayFacts, err := snapshot.LoadFacts(replayPath)
	require.NoError(t, err)

	requests := map[string]string{
		"duplex on the disabled plugin": fixture(t, nil),
		"ingress on the runner plugin": fixture(t, func(r map[string]any) {
			r["operation"] = "getRunnerIngressEndpoint"
			metadata(r)["pluginId"] = "runner.plugin"
			metadata(r)["provider"] = "runner"
			r["environment"].(map[string]any)["config"] = map[string]any{"provider": "runner"}
		}),
		"built-in provider": fixture(t, func(r map[string]any) {
			md := metadata(r)
			delete(md, "sandboxProviderPlugin")
			delete(md, "pluginId")
			md["provider"] = "fake"
			r["lease"].(map[string]any)["leasePolicy"] = "reuse_by_environment"
		}),
	}
	for name, body := range requests {
		t.Run(name, func(t *testing.T) {
			live := post(t, url+"/v1/authorize", body)
			require.Equal(t, http.StatusOK, live.status)
			req, err := snapshot.ParseRequest(strings.NewReader(body))
			require.NoError(t, err)
			replayed, _, err := testEngine(t).Decide(t.Context(), req, replayFacts)
			require.NoError(t, err)
			got := live.json(t)
			want := testutil.JSONObject(t, replayed)
			for _, k := range []string{"allow", "code", "message", "reasons", "capabilities"} {
				assert.Equal(t, want[k], got[k], k)
			}
		})
	}
	assert.Equal(t, false, post(t, url+"/v1/authorize", requests["duplex on the disabled plugin"]).json(t)["allow"],
		"the plugin the decisions read is disabled")
}

// A masked value is masked everywhere it appears in the decision log line: in the input's
// copies (input.resolved.*) and in the result's message, not only at its pointer.
func TestDecisionLogMasksEveryCopy(t *testing.T) {
	var buf lockedBuffer
	s := newServer(t, withDecisionLog(&buf), withConfig(func(c *server.Config) {
		c.DecisionLog.Mask = append(c.DecisionLog.Mask, "/input/lease/metadata/driver")
	}))
	url := startHTTP(t, s)
	const driverSecret, configSecret = "drv-s3cret", "key-0f9e"
	answer := post(t, url+"/v1/authorize", fixture(t, func(r map[string]any) {
		metadata(r)["driver"] = driverSecret
		r["environment"].(map[string]any)["config"] = map[string]any{"provider": "daytona", "apiKey": configSecret}
	}))
	require.Equal(t, http.StatusOK, answer.status)
	doc := answer.json(t)
	require.Equal(t, "ENVIRONMENT_DRIVER_NOT_REGISTERED", doc["code"])
	require.Contains(t, doc["message"], driverSecret, "the answer itself is not masked")

	raw := buf.String()
	assert.NotContains(t, raw, driverSecret)
	assert.NotContains(t, raw, configSecret)
	lines := buf.lines(t)
	require.Len(t, lines, 1)
	in := lines[0]["input"].(map[string]any)
	resolved := in["resolved"].(map[string]any)
	assert.Equal(t, masked, resolved["driver"], "copy of lease.metadata.driver")
	assert.Equal(t, masked, resolved["providerKey"], "copy of environment.config.provider")
	assert.Equal(t, masked, in["environment"].(map[string]any)["config"])
	assert.Equal(t, `Environment driver "[MASKED]" is not registered in the environment runtime yet.`,
		lines[0]["result"].(map[string]any)["message"])
	assert.Equal(t, "test.plugin", resolved["pluginId"], "values that were not masked stay")

	// The live request and facts are untouched: the same request is still decided on its values.
	again := post(t, url+"/v1/authorize", fixture(t, func(r map[string]any) { metadata(r)["driver"] = driverSecret }))
	assert.Contains(t, again.json(t)["message"], driverSecret)
}

// A number too large for the policy engine, in a field the policy ignores, does not turn the
// decision into a 500: the request is decided as it would be without it. Input nested too
// deep or with too long a string is a 400 naming the limit, on every decision endpoint.
func TestInputBounds(t *testing.T) {
	var buf lockedBuffer
	url := startHTTP(t, newServer(t, withDecisionLog(&buf)))
	plain := post(t, url+"/v1/authorize", fixture(t, nil)).json(t)
	require.Equal(t, true, plain["allow"])

	huge := fixture(t, func(r map[string]any) {
		metadata(r)["weight"] = json.Number("1e40000")
		r["environment"].(map[string]any)["limits"] = []any{json.Number("-1e40000"), json.Number("1e-40000")}
	})
	require.Contains(t, huge, "1e40000")
	a := post(t, url+"/v1/authorize", huge)
	require.Equal(t, http.StatusOK, a.status, "body: %s", a.body)
	assert.Empty(t, a.header.Get("X-Authz-Error"))
	got := a.json(t)
	for _, k := range []string{"allow", "code", "reasons", "capabilities"} {
		assert.Equal(t, plain[k], got[k], k)
	}
	d := post(t, url+"/v1/data/authz/decision", `{"input":`+huge+`}`)
	require.Equal(t, http.StatusOK, d.status, "body: %s", d.body)

	deep := fixture(t, func(r map[string]any) {
		var v any = "x"
		for range snapshot.MaxRequestDepth {
			v = map[string]any{"a": v}
		}
		metadata(r)["deep"] = v
	})
	long := fixture(t, func(r map[string]any) {
		r["command"] = []any{"sh", "-c", strings.Repeat("y", snapshot.MaxRequestStringBytes+1)}
	})
	for _, tt := range []struct{ name, body, want string }{
		{name: "too deep", body: deep, want: "nested deeper than the limit of 64 levels"},
		{name: "string too long", body: long, want: "over the limit of 65536 bytes"},
	} {
		for _, path := range []string{"/v1/authorize", "/v1/capabilities", "/v1/data/authz/decision"} {
			t.Run(tt.name+" "+path, func(t *testing.T) {
				body := tt.body
				if path == "/v1/data/authz/decision" {
					body = `{"input":` + body + `}`
				}
				a := post(t, url+path, body)
				requireAPIError(t, a, http.StatusBadRequest, coded.BadRequest)
				assert.Contains(t, a.json(t)["message"], tt.want)
			})
		}
	}
	lines := buf.lines(t)
	require.Len(t, lines, 3, "two plain decisions and the Data API one; bad requests have no line")
	md := lines[1]["input"].(map[string]any)["lease"].(map[string]any)["metadata"].(map[string]any)
	assert.Equal(t, "1e40000", md["weight"], "logged as the literal the policy engine saw")
}
