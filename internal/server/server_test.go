package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/sandbox"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

func TestMain(m *testing.M) {
	sandbox.Init() // the tests start drivers through this binary
	goleak.VerifyTestMain(removeDriverAfter{m})
}

// removeDriverAfter removes the test-driver program (driverProgram) once the tests ran.
type removeDriverAfter struct{ m *testing.M }

func (r removeDriverAfter) Run() int {
	code := r.m.Run()
	removeTestDriver()
	return code
}

// masked is what the decision log writes in place of a masked value.
const masked = "[MASKED]"

var engine = sync.OnceValues(func() (*decision.Engine, error) {
	p, err := decision.EmbeddedPolicy()
	if err != nil {
		return nil, err
	}
	e := decision.New(decision.Options{EvalTimeout: 5 * time.Second})
	return e, e.Activate(context.Background(), p)
})

func testEngine(t testing.TB) *decision.Engine {
	t.Helper()
	e, err := engine()
	require.NoError(t, err)
	return e
}

func staticFacts(t testing.TB, name string) *server.StaticFacts {
	t.Helper()
	f, err := server.LoadStaticFacts(filepath.Join("testdata", name))
	require.NoError(t, err)
	return f
}

// testConfig is the default configuration for a server over the test facts.
func testConfig() server.Config {
	cfg := server.DefaultConfig()
	cfg.Addr = "127.0.0.1:0"
	// Tests run under -race on shared machines, where a decision may take a while: no test
	// but those of admission itself should meet a 503 SERVICE_OVERLOADED.
	cfg.Limits.QueueWait = time.Minute
	return cfg
}

type serverOpts struct {
	cfg     server.Config
	decider server.Decider
	facts   server.FactsSource
	log     io.Writer
}

type option func(*serverOpts)

func withConfig(f func(*server.Config)) option { return func(o *serverOpts) { f(&o.cfg) } }
func withDecider(d server.Decider) option      { return func(o *serverOpts) { o.decider = d } }
func withFacts(f server.FactsSource) option    { return func(o *serverOpts) { o.facts = f } }
func withDecisionLog(w io.Writer) option       { return func(o *serverOpts) { o.log = w } }

// newServer builds a server over testdata/facts.json and the embedded policy.
func newServer(t testing.TB, opts ...option) *server.Server {
	t.Helper()
	o := serverOpts{cfg: testConfig()}
	for _, f := range opts {
		f(&o)
	}
	if o.decider == nil {
		o.decider = testEngine(t)
	}
	if o.facts == nil {
		o.facts = staticFacts(t, "facts.json")
	}
	s, err := server.New(o.cfg, o.decider, o.facts, server.Options{DecisionLog: o.log})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// startHTTP serves s over real HTTP on 127.0.0.1 and stops it at the end of the test.
func startHTTP(t testing.TB, s *server.Server) string {
	t.Helper()
	ts := httptest.NewUnstartedServer(s.Handler())
	ts.Config.ReadHeaderTimeout = 5 * time.Second
	ts.Start()
	t.Cleanup(ts.Close)
	return ts.URL
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a answer) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(a.body, &m), "body: %s", a.body)
	return m
}

// testClient bounds every request of the tests in time.
var testClient = &http.Client{Timeout: 15 * time.Second}

func do(t testing.TB, method, url, contentType string, body io.Reader) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	require.NoError(t, err)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func post(t testing.TB, url string, body string) answer {
	t.Helper()
	return do(t, http.MethodPost, url, "application/json", strings.NewReader(body))
}

func get(t testing.TB, url string) answer {
	t.Helper()
	return do(t, http.MethodGet, url, "", nil)
}

// fixture returns the docs/contract.md, "The request" request with changes applied to its decoded form.
func fixture(t testing.TB, change func(req map[string]any)) string {
	t.Helper()
	req := specexamples.NewFixture().Request
	if change != nil {
		change(req)
	}
	out, err := json.Marshal(req)
	require.NoError(t, err)
	return string(out)
}

func metadata(req map[string]any) map[string]any {
	return req["lease"].(map[string]any)["metadata"].(map[string]any)
}

var allKeys = []string{"allow", "code", "message", "reasons", "capabilities", "decision_id", "revision"}

func requireDocument(t testing.TB, doc map[string]any) {
	t.Helper()
	for _, k := range allKeys {
		require.Contains(t, doc, k)
	}
	caps, ok := doc["capabilities"].(map[string]any)
	require.True(t, ok)
	require.Len(t, caps, 9)
	for _, k := range api.CapabilityKeys {
		require.IsType(t, true, caps[k], k)
	}
	require.NotEmpty(t, doc["decision_id"])
}

func TestAuthorize(t *testing.T) {
	url := startHTTP(t, newServer(t))
	tests := []struct {
		name        string
		change      func(req map[string]any)
		wantAllow   bool
		wantCode    string
		wantMessage string
		wantReasons []any
		wantCaps    map[string]bool
	}{
		{
			name:        "grant (contract example 1)",
			wantAllow:   true,
			wantReasons: []any{},
			wantCaps:    map[string]bool{"duplexCommandStream": true, "persistentProcessSessions": false},
		},
		{
			name:        "DUPLEX_CHANNEL_CAPABILITY_DENIED: pinned plugin does not exist",
			change:      func(r map[string]any) { metadata(r)["pluginId"] = "nope" },
			wantCode:    "DUPLEX_CHANNEL_CAPABILITY_DENIED",
			wantMessage: "Sandbox lease does not grant the duplex command stream capability.",
			wantReasons: []any{"plugin_not_found"},
			wantCaps:    map[string]bool{"duplexCommandStream": false},
		},
		{
			name:        "DUPLEX_CHANNEL_UNSUPPORTED: local driver (contract example 4)",
			change:      func(r map[string]any) { metadata(r)["driver"] = "local" },
			wantCode:    "DUPLEX_CHANNEL_UNSUPPORTED",
			wantMessage: `Environment driver "local" does not support duplex channels.`,
			wantReasons: []any{"operation_unsupported_by_driver"},
		},
		{
			name:        "ENVIRONMENT_DRIVER_NOT_REGISTERED (contract example 5)",
			change:      func(r map[string]any) { metadata(r)["driver"] = "foo" },
			wantCode:    "ENVIRONMENT_DRIVER_NOT_REGISTERED",
			wantMessage: `Environment driver "foo" is not registered in the environment runtime yet.`,
			wantReasons: []any{"driver_not_registered"},
		},
		{
			name:        "RUNNER_INGRESS_CAPABILITY_DENIED: the worker has no ingress method",
			change:      func(r map[string]any) { r["operation"] = "getRunnerIngressEndpoint" },
			wantCode:    "RUNNER_INGRESS_CAPABILITY_DENIED",
			wantMessage: "Sandbox lease does not grant runner WebSocket ingress.",
			wantReasons: []any{"method_not_verified", "capability_not_declared"},
			wantCaps:    map[string]bool{"runnerWebSocketIngress": false, "duplexCommandStream": true},
		},
		{
			name: "RUNNER_INGRESS_UNSUPPORTED: plugin driver (contract example 14)",
			change: func(r map[string]any) {
				r["operation"] = "getRunnerIngressEndpoint"
				md := metadata(r)
				md["driver"] = "plugin"
				md["pluginId"] = "runner.plugin"
				md["driverKey"] = "runner"
			},
			wantCode:    "RUNNER_INGRESS_UNSUPPORTED",
			wantMessage: `Environment driver "plugin" does not support runner ingress.`,
			wantReasons: []any{"operation_unsupported_by_driver"},
			wantCaps:    map[string]bool{"runnerWebSocketIngress": true},
		},
		{
			name: "runner ingress granted on the sandbox driver",
			change: func(r map[string]any) {
				r["operation"] = "getRunnerIngressEndpoint"
				md := metadata(r)
				md["pluginId"] = "runner.plugin"
				md["provider"] = "runner"
			},
			wantAllow:   true,
			wantReasons: []any{},
			wantCaps:    map[string]bool{"runnerWebSocketIngress": true, "duplexCommandStream": false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := post(t, url+"/v1/authorize", fixture(t, tt.change))
			require.Equal(t, http.StatusOK, a.status, "a decision is data: a deny is 200 too; body %s", a.body)
			assert.Equal(t, "application/json", a.header.Get("Content-Type"))
			assert.Empty(t, a.header.Get("X-Authz-Error"))
			doc := a.json(t)
			requireDocument(t, doc)
			assert.Equal(t, tt.wantAllow, doc["allow"])
			assert.Equal(t, tt.wantCode, doc["code"])
			assert.Equal(t, tt.wantMessage, doc["message"])
			assert.Equal(t, tt.wantReasons, doc["reasons"])
			assert.Equal(t, testEngine(t).Revision(), doc["revision"])
			caps := doc["capabilities"].(map[string]any)
			for k, v := range tt.wantCaps {
				assert.Equal(t, v, caps[k], k)
			}
		})
	}
}

func TestDataAPIAgreesWithAuthorize(t *testing.T) {
	url := startHTTP(t, newServer(t))
	tests := []struct {
		name   string
		change func(map[string]any)
	}{
		{name: "grant"},
		{name: "capability deny", change: func(r map[string]any) { metadata(r)["pluginId"] = "nope" }},
		{name: "unsupported driver", change: func(r map[string]any) { metadata(r)["driver"] = "ssh" }},
		{name: "runner ingress", change: func(r map[string]any) { r["operation"] = "getRunnerIngressEndpoint" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := fixture(t, tt.change)
			direct := post(t, url+"/v1/authorize", req)
			viaOPA := post(t, url+"/v1/data/authz/decision", `{"input": `+req+`}`)
			require.Equal(t, http.StatusOK, direct.status)
			require.Equal(t, http.StatusOK, viaOPA.status, "body %s", viaOPA.body)

			d := direct.json(t)
			o := viaOPA.json(t)
			require.Contains(t, o, "result")
			result := o["result"].(map[string]any)
			requireDocument(t, result)
			assert.Equal(t, result["decision_id"], o["decision_id"])
			assert.NotEqual(t, d["decision_id"], result["decision_id"], "every decision has its own id")
			delete(d, "decision_id")
			delete(result, "decision_id")
			assert.Equal(t, d, result)
		})
	}
}

func TestCapabilities(t *testing.T) {
	url := startHTTP(t, newServer(t))
	a := post(t, url+"/v1/capabilities", fixture(t, func(r map[string]any) { metadata(r)["backend"] = "job" }))
	require.Equal(t, http.StatusOK, a.status)
	m := a.json(t)
	assert.ElementsMatch(t, []string{"capabilities", "decision_id", "revision"}, slices.Collect(maps.Keys(m)))
	assert.Equal(t, testEngine(t).Revision(), m["revision"])
	assert.NotEmpty(t, m["decision_id"])
	caps := m["capabilities"].(map[string]any)
	want := map[string]any{}
	for _, k := range api.CapabilityKeys {
		want[k] = k == "duplexCommandStream"
	}
	assert.Equal(t, want, caps)
}

func requireAPIError(t testing.TB, a answer, status int, code coded.Code) {
	t.Helper()
	require.Equal(t, status, a.status, "body %s", a.body)
	assert.Equal(t, "application/json", a.header.Get("Content-Type"))
	m := a.json(t)
	assert.Equal(t, string(code), m["code"])
	assert.NotEmpty(t, m["message"])
	assert.NotEqual(t, true, m["allow"], "an error never grants")
}

func TestBadRequests(t *testing.T) {
	url := startHTTP(t, newServer(t))
	tests := []struct {
		name        string
		path        string
		contentType string
		body        string
		wantStatus  int
		wantCode    coded.Code
		wantInMsg   string
	}{
		{name: "not JSON", path: "/v1/authorize", body: `{"operation":`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "not valid JSON"},
		{name: "empty body", path: "/v1/authorize", body: ``, wantStatus: 400, wantCode: "BAD_REQUEST"},
		{name: "trailing data", path: "/v1/authorize", body: `{} {}`, wantStatus: 400, wantCode: "BAD_REQUEST"},
		{name: "not an object", path: "/v1/authorize", body: `[1,2]`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "must be a JSON object"},
		{name: "null", path: "/v1/capabilities", body: `null`, wantStatus: 400, wantCode: "BAD_REQUEST"},
		{name: "unknown operation", path: "/v1/authorize", body: `{"operation":"rm -rf"}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "operation"},
		{name: "null operation", path: "/v1/authorize", body: `{"operation":null}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "operation"},
		{name: "null lease", path: "/v1/authorize", body: `{"lease":null}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "lease"},
		{name: "environment a string", path: "/v1/capabilities", body: `{"environment":"env-1"}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "environment"},
		{name: "metadata an array", path: "/v1/authorize", body: `{"lease":{"metadata":[]}}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "lease.metadata"},
		{name: "data API without input", path: "/v1/data/authz/decision", body: `{"operation":"openDuplexChannel"}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "input"},
		{name: "data API input null", path: "/v1/data/authz/decision", body: `{"input":null}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "input"},
		{name: "data API null lease", path: "/v1/data/authz/decision", body: `{"input":{"lease":null}}`, wantStatus: 400, wantCode: "BAD_REQUEST", wantInMsg: "lease"},
		{name: "data API body an array", path: "/v1/data/authz/decision", body: `[]`, wantStatus: 400, wantCode: "BAD_REQUEST"},
		{name: "form content type", path: "/v1/authorize", contentType: "application/x-www-form-urlencoded", body: `{}`, wantStatus: 415, wantCode: "UNSUPPORTED_MEDIA_TYPE"},
		{name: "text content type", path: "/v1/capabilities", contentType: "text/plain", body: `{}`, wantStatus: 415, wantCode: "UNSUPPORTED_MEDIA_TYPE"},
		{name: "a +json type outside application/", path: "/v1/authorize", contentType: "text/x+json", body: `{}`, wantStatus: 415, wantCode: "UNSUPPORTED_MEDIA_TYPE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ct := tt.contentType
			if ct == "" {
				ct = "application/json"
			}
			a := do(t, http.MethodPost, url+tt.path, ct, strings.NewReader(tt.body))
			requireAPIError(t, a, tt.wantStatus, tt.wantCode)
			assert.Contains(t, a.json(t)["message"], tt.wantInMsg)
		})
	}
}

func TestContentTypeLenient(t *testing.T) {
	url := startHTTP(t, newServer(t))
	for _, ct := range []string{"", "application/json; charset=utf-8", "application/vnd.authz+json"} {
		t.Run("content type "+ct, func(t *testing.T) {
			a := do(t, http.MethodPost, url+"/v1/authorize", ct, strings.NewReader(fixture(t, nil)))
			require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
			assert.Equal(t, true, a.json(t)["allow"])
		})
	}
}

func TestRequestTooLarge(t *testing.T) {
	s := newServer(t, withConfig(func(c *server.Config) { c.MaxBodyBytes = 1024 }))
	url := startHTTP(t, s)
	big := `{"command": "` + strings.Repeat("x", 2048) + `"}`
	tests := []struct {
		name string
		body io.Reader
	}{
		{name: "with Content-Length", body: strings.NewReader(big)},
		{name: "chunked, no Content-Length", body: io.MultiReader(strings.NewReader(big))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := do(t, http.MethodPost, url+"/v1/authorize", "application/json", tt.body)
			requireAPIError(t, a, http.StatusRequestEntityTooLarge, "REQUEST_TOO_LARGE")
		})
	}
	t.Run("just under the limit", func(t *testing.T) {
		body := `{"command": "` + strings.Repeat("x", 1000) + `"}`
		a := post(t, url+"/v1/authorize", body)
		require.Equal(t, http.StatusOK, a.status, "body %s", a.body)
	})
}

func TestMethodNotAllowedAndNotFound(t *testing.T) {
	url := startHTTP(t, newServer(t))
	tests := []struct {
		name       string
		method     string
		path       string
		wantStatus int
		wantCode   coded.Code
		wantAllow  string
	}{
		{name: "GET authorize", method: http.MethodGet, path: "/v1/authorize", wantStatus: 405, wantCode: "METHOD_NOT_ALLOWED", wantAllow: "POST"},
		{name: "PUT data API", method: http.MethodPut, path: "/v1/data/authz/decision", wantStatus: 405, wantCode: "METHOD_NOT_ALLOWED", wantAllow: "POST"},
		{name: "POST health", method: http.MethodPost, path: "/health", wantStatus: 405, wantCode: "METHOD_NOT_ALLOWED", wantAllow: "GET, HEAD"},
		{name: "DELETE plugins", method: http.MethodDelete, path: "/v1/plugins", wantStatus: 405, wantCode: "METHOD_NOT_ALLOWED", wantAllow: "GET, HEAD"},
		{name: "unknown path", method: http.MethodPost, path: "/v1/authorise", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "trailing slash", method: http.MethodPost, path: "/v1/authorize/", wantStatus: 404, wantCode: "NOT_FOUND"},
		{name: "OPA API not served", method: http.MethodGet, path: "/v1/policies", wantStatus: 404, wantCode: "NOT_FOUND"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := do(t, tt.method, url+tt.path, "application/json", strings.NewReader(`{}`))
			requireAPIError(t, a, tt.wantStatus, tt.wantCode)
			assert.Equal(t, tt.wantAllow, a.header.Get("Allow"))
		})
	}
}

// failingDecider fails every decision, and misbehaves by also returning a granting document:
// the server must answer with the failure document all the same.
type failingDecider struct {
	err error
}

func (d failingDecider) Decide(context.Context, *snapshot.Request, snapshot.Facts) (decision.Document, snapshot.Input, error) {
	return decision.Document{Allow: true, Capabilities: api.Capabilities{DuplexCommandStream: true}, DecisionID: "d-1", Revision: "r-1"},
		snapshot.Input{"operation": "openDuplexChannel"}, d.err
}

func (failingDecider) Revision() string { return "r-1" }

func TestEvaluationFailure(t *testing.T) {
	tests := []struct {
		name     string
		decider  server.Decider
		op       string
		wantCode string
		wantErr  string
	}{
		{
			name:     "time-out",
			decider:  failingDecider{err: &coded.Error{Code: coded.EvalTimeout, Err: context.DeadlineExceeded}},
			wantCode: "DUPLEX_CHANNEL_CAPABILITY_DENIED",
			wantErr:  "EVAL_TIMEOUT",
		},
		{
			name:     "error without a code",
			decider:  failingDecider{err: errors.New("boom")},
			op:       "getRunnerIngressEndpoint",
			wantCode: "RUNNER_INGRESS_CAPABILITY_DENIED",
			wantErr:  "EVAL_ERROR",
		},
		{
			name:     "no policy loaded",
			decider:  decision.New(decision.Options{}),
			wantCode: "DUPLEX_CHANNEL_CAPABILITY_DENIED",
			wantErr:  "EVAL_NO_POLICY",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logBuf lockedBuffer
			url := startHTTP(t, newServer(t, withDecider(tt.decider), withDecisionLog(&logBuf)))
			req := fixture(t, func(r map[string]any) {
				if tt.op != "" {
					r["operation"] = tt.op
				}
			})
			for _, path := range []string{"/v1/authorize", "/v1/data/authz/decision", "/v1/capabilities"} {
				body := req
				if path == "/v1/data/authz/decision" {
					body = `{"input":` + req + `}`
				}
				a := post(t, url+path, body)
				require.Equal(t, http.StatusInternalServerError, a.status, "%s: %s", path, a.body)
				assert.Equal(t, tt.wantErr, a.header.Get("X-Authz-Error"), path)
				m := a.json(t)
				switch path {
				case "/v1/capabilities":
					for _, k := range api.CapabilityKeys {
						assert.Equal(t, false, m["capabilities"].(map[string]any)[k], k)
					}
					continue
				case "/v1/data/authz/decision":
					m = m["result"].(map[string]any)
				}
				requireDocument(t, m)
				assert.Equal(t, false, m["allow"])
				assert.Equal(t, tt.wantCode, m["code"])
				assert.Equal(t, []any{"evaluation_failed"}, m["reasons"])
				for _, k := range api.CapabilityKeys {
					assert.Equal(t, false, m["capabilities"].(map[string]any)[k], k)
				}
			}
			lines := logBuf.lines(t)
			require.Len(t, lines, 3)
			for _, l := range lines {
				assert.Equal(t, tt.wantErr, l["error"])
				assert.Equal(t, false, l["result"].(map[string]any)["allow"])
			}
		})
	}
}

// notReady is a facts source whose plugins have not started yet.
type notReady struct{ *server.StaticFacts }

func (notReady) Ready() bool { return false }

func TestHealthAndReadiness(t *testing.T) {
	tests := []struct {
		name       string
		decider    server.Decider
		facts      server.FactsSource
		wantStatus int
		wantBody   map[string]any
	}{
		{
			name:       "ready",
			wantStatus: http.StatusOK,
			wantBody:   map[string]any{"ready": true, "policyLoaded": true, "pluginsStarted": true},
		},
		{
			name:       "plugins not started",
			facts:      notReady{staticFacts(t, "facts.json")},
			wantStatus: http.StatusServiceUnavailable,
			wantBody:   map[string]any{"ready": false, "policyLoaded": true, "pluginsStarted": false},
		},
		{
			name:       "no policy",
			decider:    decision.New(decision.Options{}),
			wantStatus: http.StatusServiceUnavailable,
			wantBody:   map[string]any{"ready": false, "policyLoaded": false, "pluginsStarted": true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var opts []option
			if tt.decider != nil {
				opts = append(opts, withDecider(tt.decider))
			}
			if tt.facts != nil {
				opts = append(opts, withFacts(tt.facts))
			}
			url := startHTTP(t, newServer(t, opts...))

			h := get(t, url+"/health")
			require.Equal(t, http.StatusOK, h.status, "alive whatever the readiness")
			assert.Equal(t, map[string]any{"status": "ok"}, h.json(t))

			r := get(t, url+"/health/ready")
			require.Equal(t, tt.wantStatus, r.status)
			m := r.json(t)
			for k, v := range tt.wantBody {
				assert.Equal(t, v, m[k], k)
			}
		})
	}
}

func TestPluginsAndFacts(t *testing.T) {
	url := startHTTP(t, newServer(t))

	a := get(t, url+"/v1/plugins")
	require.Equal(t, http.StatusOK, a.status)
	var plugins struct {
		Plugins []map[string]any `json:"plugins"`
	}
	require.NoError(t, json.Unmarshal(a.body, &plugins))
	require.Len(t, plugins.Plugins, 2)
	p := plugins.Plugins[0]
	assert.Equal(t, "test.plugin", p["id"])
	assert.Equal(t, "acme.daytona", p["key"])
	assert.Equal(t, "ready", p["status"])
	assert.Contains(t, p, "lastError")
	w := p["worker"].(map[string]any)
	assert.Equal(t, []any{"duplexChannelOpen"}, w["supportedMethods"])
	for _, k := range []string{"pid", "generation", "startedAt"} {
		assert.Contains(t, w, k)
	}

	f := get(t, url+"/v1/facts")
	require.Equal(t, http.StatusOK, f.status)
	_, err := snapshot.ParseFacts(bytes.NewReader(f.body))
	require.NoError(t, err, "GET /v1/facts is a valid facts file")
	want, err := os.ReadFile(filepath.Join("testdata", "facts.json"))
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(f.body))
}

func TestNoPluginsRendersEmptyLists(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "facts.json")
	require.NoError(t, os.WriteFile(path, []byte(`{}`), 0o600))
	facts, err := server.LoadStaticFacts(path)
	require.NoError(t, err)
	url := startHTTP(t, newServer(t, withFacts(facts)))
	assert.JSONEq(t, `{"plugins":[]}`, string(get(t, url+"/v1/plugins").body))
	assert.JSONEq(t, `{"plugins":[],"workers":{},"builtinProviders":{}}`, string(get(t, url+"/v1/facts").body))
}

func TestMetrics(t *testing.T) {
	url := startHTTP(t, newServer(t))
	require.Equal(t, http.StatusOK, post(t, url+"/v1/authorize", fixture(t, nil)).status)
	require.Equal(t, http.StatusOK, post(t, url+"/v1/authorize", fixture(t, func(r map[string]any) { metadata(r)["driver"] = "local" })).status)
	require.Equal(t, http.StatusBadRequest, post(t, url+"/v1/authorize", `[]`).status)

	a := get(t, url+"/metrics")
	require.Equal(t, http.StatusOK, a.status)
	text := string(a.body)
	for _, want := range []string{
		`authz_decisions_total{allow="true",code="",operation="openDuplexChannel"} 1`,
		`authz_decisions_total{allow="false",code="DUPLEX_CHANNEL_UNSUPPORTED",operation="openDuplexChannel"} 1`,
		`authz_decision_duration_seconds_count{operation="openDuplexChannel"} 2`,
		`authz_plugin_up{id="test.plugin",key="acme.daytona",status="ready"} 1`,
		`authz_plugin_restarts_total{id="test.plugin"} 0`,
		`authz_policy_revision_info{origin="embedded",revision="` + testEngine(t).Revision() + `"} 1`,
		`authz_ready 1`,
		`authz_http_requests_total{route="/v1/authorize",status="400"} 1`,
		`go_goroutines`,
		`go_sched_latencies_seconds_bucket{le=`,
		`go_sched_pauses_total_gc_seconds_bucket{le=`,
	} {
		assert.Contains(t, text, want)
	}
}

// lockedBuffer is a decision log the test can read while the server writes.
type lockedBuffer struct{ testutil.SyncBuffer }

func (b *lockedBuffer) lines(t testing.TB) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), "line %q", l)
		out = append(out, m)
	}
	return out
}

func TestDecisionLog(t *testing.T) {
	var buf lockedBuffer
	s := newServer(t, withDecisionLog(&buf), withConfig(func(c *server.Config) {
		c.DecisionLog.Mask = append(c.DecisionLog.Mask, "/input/lease/metadata/token", "/input/facts/plugin/key", "/input/command/2")
	}))
	url := startHTTP(t, s)
	grant := post(t, url+"/v1/authorize", fixture(t, func(r map[string]any) { metadata(r)["token"] = "s3cret" })).json(t)
	post(t, url+"/v1/data/authz/decision", `{"input":`+fixture(t, func(r map[string]any) { metadata(r)["driver"] = "foo" })+`}`)
	post(t, url+"/v1/authorize", `[]`) // a bad request is not a decision: no line

	lines := buf.lines(t)
	require.Len(t, lines, 2)
	l := lines[0]
	assert.Equal(t, grant["decision_id"], l["decision_id"])
	ts, err := time.Parse(time.RFC3339Nano, l["time"].(string))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), ts, time.Minute)
	assert.Equal(t, "openDuplexChannel", l["operation"])
	assert.Equal(t, "/v1/authorize", l["path"])
	assert.Equal(t, testEngine(t).Revision(), l["revision"])
	assert.Greater(t, l["latency_ns"], 0.0)
	assert.NotContains(t, l, "error")
	result := l["result"].(map[string]any)
	assert.Equal(t, true, result["allow"])
	delete(grant, "decision_id")
	for k, v := range grant {
		assert.Equal(t, v, result[k], k)
	}

	in := l["input"].(map[string]any)
	md := in["lease"].(map[string]any)["metadata"].(map[string]any)
	assert.Equal(t, masked, md["token"], "masked by configuration")
	assert.Equal(t, "test.plugin", md["pluginId"], "other fields are kept")
	assert.Equal(t, masked, in["environment"].(map[string]any)["config"], "masked by default")
	assert.Equal(t, []any{"sh", "-c", masked}, in["command"])
	assert.Equal(t, masked, in["facts"].(map[string]any)["plugin"].(map[string]any)["key"])
	assert.Contains(t, in, "resolved")
	assert.Contains(t, in, "narrowing")

	assert.Equal(t, "/v1/data/authz/decision", lines[1]["path"])
	assert.Equal(t, "ENVIRONMENT_DRIVER_NOT_REGISTERED", lines[1]["result"].(map[string]any)["code"])

	// Masking copies: the live facts still carry the plugin key.
	plugins := get(t, url+"/v1/plugins").json(t)["plugins"].([]any)
	assert.Equal(t, "acme.daytona", plugins[0].(map[string]any)["key"])
	assert.Equal(t, true, post(t, url+"/v1/authorize", fixture(t, nil)).json(t)["allow"])
}

func TestDecisionLogConcurrentLinesNeverInterleave(t *testing.T) {
	var buf lockedBuffer
	url := startHTTP(t, newServer(t, withDecisionLog(&buf)))
	const n = 40
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, err := testClient.Post(url+"/v1/authorize", "application/json", strings.NewReader(fixture(t, nil)))
			if assert.NoError(t, err) {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	assert.Len(t, buf.lines(t), n)
}

type brokenWriter struct{}

func (brokenWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestDecisionLogUnavailable(t *testing.T) {
	tests := []struct {
		name       string
		required   bool
		wantStatus int
	}{
		{name: "required: 503, nothing granted", required: true, wantStatus: http.StatusServiceUnavailable},
		{name: "not required: the decision is answered", required: false, wantStatus: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, withDecisionLog(brokenWriter{}), withConfig(func(c *server.Config) {
				c.DecisionLog.Path = "-"
				c.DecisionLog.Required = tt.required
			}))
			url := startHTTP(t, s)
			for _, path := range []string{"/v1/authorize", "/v1/capabilities", "/v1/data/authz/decision"} {
				body := fixture(t, nil)
				if path == "/v1/data/authz/decision" {
					body = `{"input":` + body + `}`
				}
				a := post(t, url+path, body)
				require.Equal(t, tt.wantStatus, a.status, path)
				if tt.required {
					requireAPIError(t, a, http.StatusServiceUnavailable, "DECISION_LOG_UNAVAILABLE")
					assert.Equal(t, false, a.json(t)["allow"])
					assert.Equal(t, "DECISION_LOG_UNAVAILABLE", a.header.Get("X-Authz-Error"))
					assert.NotContains(t, string(a.body), "capabilities")
				}
			}
			assert.Contains(t, string(get(t, url+"/metrics").body), "authz_decision_log_failures_total 3")
		})
	}
}

func TestDecisionLogFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	s := newServer(t, withConfig(func(c *server.Config) { c.DecisionLog.Path = path }))
	url := startHTTP(t, s)
	post(t, url+"/v1/authorize", fixture(t, nil))
	post(t, url+"/v1/authorize", fixture(t, nil))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, 2, strings.Count(string(b), "\n"))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "decision logs hold request data: owner only")
}

func TestExamples(t *testing.T) {
	url := startHTTP(t, newServer(t, withFacts(staticFacts(t, "example-facts.json"))))
	tests := []struct {
		name      string
		file      string
		wantAllow bool
		wantCode  string
	}{
		{name: "grant", file: "grant.json", wantAllow: true, wantCode: ""},
		{name: "deny", file: "deny.json", wantAllow: false, wantCode: "DUPLEX_CHANNEL_CAPABILITY_DENIED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "..", "examples", tt.file))
			require.NoError(t, err)
			a := post(t, url+"/v1/authorize", string(b))
			require.Equal(t, http.StatusOK, a.status)
			m := a.json(t)
			assert.Equal(t, tt.wantAllow, m["allow"])
			assert.Equal(t, tt.wantCode, m["code"])
		})
	}
}

// serveOn runs s.Serve on ln until the returned stop is called; stop waits for Serve to return.
func serveOn(t testing.TB, s *server.Server, ln net.Listener) (stop func() error) {
	t.Helper()
	return testutil.RunUntilStopped(t, "Serve", 20*time.Second, func(ctx context.Context) error { return s.Serve(ctx, ln) })
}

func unixClient(path string) *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}},
	}
}

func TestServeUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "authz")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "authz.sock")

	s := newServer(t, withConfig(func(c *server.Config) { c.Addr = "unix://" + sock }))
	ln, err := server.Listen("unix://" + sock)
	require.NoError(t, err)
	stop := serveOn(t, s, ln)

	_, err = server.Listen("unix://" + sock)
	require.ErrorContains(t, err, "another process is serving")

	c := unixClient(sock)
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://authz/v1/authorize", "application/json", strings.NewReader(fixture(t, nil)))
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, true, doc["allow"])

	require.NoError(t, stop())
	_, err = os.Stat(sock)
	assert.True(t, os.IsNotExist(err), "the socket file is removed on shutdown")
}

func TestListenReplacesStaleSocketOnly(t *testing.T) {
	dir, err := os.MkdirTemp("", "authz")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })

	regular := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(regular, nil, 0o600))
	_, err = server.Listen("unix://" + regular)
	require.ErrorContains(t, err, "not a socket")

	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
	ln, err := server.Listen("unix://" + stale)
	require.NoError(t, err)
	require.NoError(t, ln.Close())
}

// blockingDecider holds every decision until release is closed.
type blockingDecider struct {
	server.Decider
	entered chan struct{}
	release chan struct{}
}

func (d blockingDecider) Decide(ctx context.Context, req *snapshot.Request, f snapshot.Facts) (decision.Document, snapshot.Input, error) {
	d.entered <- struct{}{}
	<-d.release
	return d.Decider.Decide(ctx, req, f)
}

func TestGracefulShutdownFinishesInFlight(t *testing.T) {
	d := blockingDecider{Decider: testEngine(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	s := newServer(t, withDecider(d))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + ln.Addr().String()
	stop := serveOn(t, s, ln)

	type result struct {
		a   answer
		err error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := testClient.Post(url+"/v1/authorize", "application/json", strings.NewReader(fixture(t, nil)))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{a: answer{status: resp.StatusCode, body: b}, err: err}
	}()
	<-d.entered

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// New connections are refused once shutdown began; the in-flight decision still finishes.
	require.Eventually(t, func() bool {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err != nil
	}, 5*time.Second, 10*time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("Serve returned (%v) before the in-flight request finished", err)
	default:
	}
	close(d.release)

	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, http.StatusOK, r.a.status)
	assert.Contains(t, string(r.a.body), `"allow":true`)
	require.NoError(t, <-stopped)
}

func TestSlowClientCannotHoldTheServer(t *testing.T) {
	s := newServer(t, withConfig(func(c *server.Config) {
		c.HTTP.ReadHeaderTimeout = 200 * time.Millisecond
		c.HTTP.ReadTimeout = 300 * time.Millisecond
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serveOn(t, s, ln)

	tests := []struct {
		name string
		send string
	}{
		{name: "headers never finish", send: "POST /v1/authorize HTTP/1.1\r\nHost: x\r\n"},
		{name: "body never finishes", send: "POST /v1/authorize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"lease\":"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			_, err = io.WriteString(c, tt.send)
			require.NoError(t, err)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
			start := time.Now()
			b, _ := io.ReadAll(c) // ends when the server closes the connection
			assert.Less(t, time.Since(start), 4*time.Second, "the server cut the slow client off")
			assert.NotContains(t, string(b), `"allow":true`)
		})
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	cfg := testConfig()
	cfg.MaxBodyBytes = 0
	_, err := server.New(cfg, testEngine(t), staticFacts(t, "facts.json"), server.Options{})
	require.ErrorContains(t, err, "maxBodyBytes: must be positive")

	cfg = testConfig()
	cfg.TLS = server.TLSConfig{Cert: "/nonexistent/cert.pem", Key: "/nonexistent/key.pem"}
	_, err = server.New(cfg, testEngine(t), staticFacts(t, "facts.json"), server.Options{})
	require.ErrorContains(t, err, "tls.cert")
}

// BenchmarkAuthorize measures one grant through the whole handler, in process.
func BenchmarkAuthorize(b *testing.B) {
	s := newServer(b)
	h := s.Handler()
	body := []byte(fixture(b, nil))
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/authorize", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"allow":true`)) {
			b.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
	}
}

// FuzzDecisionEndpoints: whatever the body, no answer but a 200 decision ever grants, and
// nothing panics.
func FuzzDecisionEndpoints(f *testing.F) {
	for _, seed := range []string{
		fixture(f, nil), `{}`, `[]`, `null`, `{"lease":null}`, `{"operation":1}`, `{"input":{}}`,
		`{"lease":{"metadata":{"sandboxProviderPlugin":"true","pluginId":"test.plugin","provider":"daytona"}}}`,
	} {
		f.Add(seed)
	}
	s := newServer(f)
	h := s.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		for _, path := range []string{"/v1/authorize", "/v1/data/authz/decision", "/v1/capabilities"} {
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK && bytes.Contains(rec.Body.Bytes(), []byte(`"allow":true`)) {
				t.Fatalf("%s answered %d with a grant: %s", path, rec.Code, rec.Body)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s answered %d with invalid JSON: %s", path, rec.Code, rec.Body)
			}
		}
	})
}
