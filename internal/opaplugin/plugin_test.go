package opaplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/sandbox"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

func TestMain(m *testing.M) {
	sandbox.Init() // the tests start drivers through this binary
	RegisterActivator()
	goleak.VerifyTestMain(m)
}

// writeFacts writes a facts document to a fresh file and returns its path.
func writeFacts(t testing.TB, facts []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "facts.json")
	require.NoError(t, os.WriteFile(p, facts, 0o600))
	return p
}

func specFactsFile(t testing.TB) string {
	t.Helper()
	_, facts := specexamples.NewFixture().JSON()
	return writeFacts(t, facts)
}

func TestParseConfig(t *testing.T) {
	facts := specFactsFile(t)
	noHost, someHost := false, true
	tests := []struct {
		name    string
		raw     string
		host    bool
		wantErr []string // each a line of the error; none: valid
		check   func(t *testing.T, c *Config)
	}{
		{name: "facts, defaults", raw: `{"facts": "` + facts + `"}`, host: noHost, check: func(t *testing.T, c *Config) {
			assert.Equal(t, defaultAddr, c.Server.Addr)
			assert.Equal(t, service.DefaultEvalTimeout, c.Decision.EvalTimeout)
			assert.NotNil(t, c.staticFacts)
			assert.Equal(t, []string{"/input/environment/config"}, c.Server.DecisionLog.Mask)
		}},
		{name: "YAML knobs", raw: "addr: 127.0.0.1:0\nfacts: " + facts + "\nevalTimeout: 3s\ndecisionCache: 'off'\n", host: noHost, check: func(t *testing.T, c *Config) {
			assert.Equal(t, "127.0.0.1:0", c.Server.Addr)
			assert.Equal(t, 3*time.Second, c.Decision.EvalTimeout)
			assert.Equal(t, "off", c.Decision.Cache)
		}},
		{name: "empty section: the example driver, through the host", raw: `{}`, host: someHost, check: func(t *testing.T, c *Config) {
			require.Len(t, c.Host.Plugins, 1)
			assert.Equal(t, service.ExamplePluginID, c.Host.Plugins[0].ID)
			assert.Nil(t, c.staticFacts)
		}},
		{name: "bad addr", raw: `{"addr": "localhost", "facts": "` + facts + `"}`, host: noHost,
			wantErr: []string{`plugins.authz.addr: "localhost": want host:port`}},
		{name: "unknown field", raw: `{"adress": "127.0.0.1:1", "facts": "` + facts + `"}`, host: noHost,
			wantErr: []string{"plugins.authz.adress: unknown field; the fields are addr, authentication, builtinProviders,"}},
		{name: "OPA's write APIs opened", raw: `{"facts": "` + facts + `", "opaWriteAPI": true, "evalTimeout": "9s"}`, host: noHost, check: func(t *testing.T, c *Config) {
			assert.True(t, c.OPAWriteAPI)
			assert.Equal(t, 9*time.Second, c.Decision.EvalTimeout, "the other fields are read as without it")
		}},
		{name: "OPA's write APIs off by default", raw: `{"facts": "` + facts + `"}`, host: noHost, check: func(t *testing.T, c *Config) {
			assert.False(t, c.OPAWriteAPI)
		}},
		{name: "opaWriteAPI not a boolean", raw: `{"facts": "` + facts + `", "opaWriteAPI": "yes"}`, host: noHost,
			wantErr: []string{"plugins.authz.opaWriteAPI: must be true or false; got yes"}},
		{name: "unknown nested field", raw: `{"http": {"readTimout": "1s"}, "facts": "` + facts + `"}`, host: noHost,
			wantErr: []string{"plugins.authz.http (line 1): field readTimout not found"}},
		{name: "both plugins and facts", raw: `{"plugins": [], "facts": "` + facts + `"}`, host: someHost,
			wantErr: []string{"plugins.authz.plugins: must not be set together with plugins.authz.facts"}},
		{name: "both builtinProviders and facts", raw: `{"builtinProviders": {"fake": {"execute": true}}, "facts": "` + facts + `"}`, host: someHost,
			wantErr: []string{"plugins.authz.builtinProviders: must not be set together with plugins.authz.facts"}},
		{name: "plugins without a host", raw: `{"plugins": []}`, host: noHost,
			wantErr: []string{"plugins.authz.facts: required: this build runs no driver plugins"}},
		{name: "bad pin, named below plugins.authz", raw: `{"plugins": [{"id": "x", "path": "/opt/x", "sha256": "abc"}]}`, host: someHost,
			wantErr: []string{"plugins.authz.plugins[0].sha256: must be 64 hex characters"}},
		{name: "every problem reported", raw: `{"evalTimeout": "0s", "maxBodyBytes": 0, "facts": "` + facts + `"}`, host: noHost,
			wantErr: []string{"plugins.authz.maxBodyBytes: must be positive", "plugins.authz.evalTimeout: must be a positive duration"}},
		{name: "missing facts file", raw: `{"facts": "` + facts + `.none"}`, host: noHost,
			wantErr: []string{"plugins.authz.facts: " + facts + ".none"}},
		{name: "not an object", raw: `[1]`, host: someHost, wantErr: []string{"plugins.authz: must be an object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Factory{Plugins: tt.host}.Validate(nil, []byte(tt.raw))
			if len(tt.wantErr) == 0 {
				require.NoError(t, err)
				tt.check(t, cfg.(*Config))
				return
			}
			require.Error(t, err)
			for _, want := range tt.wantErr {
				assert.Contains(t, err.Error(), want)
			}
			for line := range strings.SplitSeq(err.Error(), "\n") {
				assert.True(t, strings.HasPrefix(line, "plugins.authz"), "every line names its field: %q", line)
			}
		})
	}
}

// policyBundle is the shipped policy as a bundle with root authz and the given revision.
func policyBundle(t testing.TB, revision string) *bundle.Bundle {
	t.Helper()
	return policytest.NewBundle(t, policytest.BundleSpec{Revision: revision, Roots: []string{"authz"}})
}

// newManager returns an initialized OPA plugin manager with b activated (none when nil),
// stopped when the test ends.
func newManager(t testing.TB, b *bundle.Bundle, opts ...func(*plugins.Manager)) *plugins.Manager {
	t.Helper()
	if b != nil {
		opts = append(opts, plugins.InitBundles(map[string]*bundle.Bundle{"authz": b}))
	}
	m, err := plugins.New([]byte(`{}`), "test", inmem.New(), opts...)
	require.NoError(t, err)
	require.NoError(t, m.Init(t.Context()))
	t.Cleanup(func() { m.Stop(context.Background()) })
	return m
}

// startPlugin makes and starts the plugin for raw; Stop runs when the test ends.
func startPlugin(t testing.TB, m *plugins.Manager, raw string, log io.Writer) *Plugin {
	t.Helper()
	f := Factory{LogOutput: log}
	cfg, err := f.Validate(m, []byte(raw))
	require.NoError(t, err)
	p := f.New(m, cfg).(*Plugin)
	m.Register(Name, p)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() { p.Stop(context.Background()) })
	return p
}

func waitState(t testing.TB, m *plugins.Manager, want plugins.State) *plugins.Status {
	t.Helper()
	var st *plugins.Status
	require.Eventually(t, func() bool {
		st = m.PluginStatus()[Name]
		return st != nil && st.State == want
	}, 10*time.Second, 10*time.Millisecond, "plugin state %v, want %v", st, want)
	return st
}

func post(t testing.TB, url string, body []byte) (int, http.Header, map[string]any) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Post(url, "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var doc map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	return resp.StatusCode, resp.Header, doc
}

// serveHandler serves the service of `authz serve --facts factsPath` with the embedded policy
// on a loopback port until the test ends, and returns its URL.
func serveHandler(t testing.TB, eng *decision.Engine, factsPath string) string {
	t.Helper()
	cfg := server.DefaultConfig()
	facts, err := server.LoadStaticFacts(factsPath)
	require.NoError(t, err)
	srv, err := server.New(cfg, eng, facts, server.Options{})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	stop := testutil.RunUntilStopped(t, "Serve", 20*time.Second, func(ctx context.Context) error { return srv.Serve(ctx, ln) })
	t.Cleanup(func() {
		assert.NoError(t, stop())
		assert.NoError(t, srv.Close())
	})
	return "http://" + ln.Addr().String()
}

// sameDecision asserts two answers are the same decision: equal but for the decision id.
func sameDecision(t testing.TB, want, got map[string]any) {
	t.Helper()
	require.NotEmpty(t, want["decision_id"])
	require.NotEmpty(t, got["decision_id"])
	want, got = maps.Clone(want), maps.Clone(got)
	delete(want, "decision_id")
	delete(got, "decision_id")
	assert.Equal(t, want, got)
}

// TestDecidesLikeServe answers every contract example through the plugin (OPA's manager
// holding the policies/ bundle, whose revision is the embedded policy's) and through the
// service of `authz serve` (the embedded policy) with the same facts: the answers are the same
// but for the decision id, on the decision and on the Data API endpoints. The plugin is
// reconfigured from one example's facts to the next.
func TestDecidesLikeServe(t *testing.T) {
	embedded := decisiontest.EmbeddedEngine(t, decision.Options{})
	m := newManager(t, policyBundle(t, embedded.Revision()))
	_, baseFacts := specexamples.NewFixture().JSON()
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+writeFacts(t, baseFacts)+`"}`, io.Discard)
	waitState(t, m, plugins.StateOK)
	for _, ex := range specexamples.Rows() {
		t.Run(ex.Name, func(t *testing.T) {
			reqJSON, factsJSON := ex.Fixture().JSON()
			factsPath := writeFacts(t, factsJSON)
			cfg, err := Factory{}.Validate(m, []byte(`{"addr": "127.0.0.1:0", "facts": "`+factsPath+`"}`))
			require.NoError(t, err)
			p.Reconfigure(t.Context(), cfg)
			waitState(t, m, plugins.StateOK)
			gateURL := "http://" + p.Addr().String()
			serveURL := serveHandler(t, embedded, factsPath)

			for _, path := range []string{"/v1/authorize", "/v1/capabilities"} {
				wantStatus, _, want := post(t, serveURL+path, reqJSON)
				gotStatus, _, got := post(t, gateURL+path, reqJSON)
				assert.Equal(t, wantStatus, gotStatus, path)
				sameDecision(t, want, got)
			}
			assert.Equal(t, ex.Allow, mustPost(t, gateURL+"/v1/authorize", reqJSON)["allow"])
			assert.Equal(t, embedded.Revision(), mustPost(t, gateURL+"/v1/authorize", reqJSON)["revision"])

			data := []byte(`{"input": ` + string(reqJSON) + `}`)
			_, _, want := post(t, serveURL+"/v1/data/authz/decision", data)
			_, _, got := post(t, gateURL+"/v1/data/authz/decision", data)
			sameDecision(t, want["result"].(map[string]any), got["result"].(map[string]any))
		})
	}
}

func mustPost(t testing.TB, url string, body []byte) map[string]any {
	t.Helper()
	status, _, doc := post(t, url, body)
	require.Equal(t, http.StatusOK, status, "%v", doc)
	return doc
}

// grantAllModule is a policy that grants every request every capability.
const grantAllModule = `package authz
decision := {"allow": true, "code": "", "message": "", "reasons": [], "capabilities": {"reusableLeases": true,
	"nativeSyncIn": true, "nativeSyncOut": true, "persistentProcessSessions": true, "independentControlCommands": true,
	"incrementalSessionOutput": true, "concurrentSyncOperations": true, "duplexCommandStream": true, "runnerWebSocketIngress": true}}
`

// putModule writes a policy into OPA's store, as OPA's Policy API does.
func putModule(t testing.TB, m *plugins.Manager, id, src string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, storage.Txn(ctx, m.Store, storage.WriteParams, func(txn storage.Transaction) error {
		return m.Store.UpsertPolicy(ctx, txn, id, []byte(src))
	}))
}

// TestGateIgnoresOPAStore: without a bundle the gate decides with the embedded policy (origin
// embedded, ready); a policy written into OPA's store (as OPA's Policy API writes it) changes
// none of its answers: the gate compiles only what OPA activated from bundles.
func TestGateIgnoresOPAStore(t *testing.T) {
	embedded := decisiontest.EmbeddedEngine(t, decision.Options{})
	m := newManager(t, nil)
	log := &testutil.SyncBuffer{}
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`, log)
	waitState(t, m, plugins.StateOK)
	gateURL := "http://" + p.Addr().String()
	var deny []byte
	for _, ex := range specexamples.Rows() {
		if req, facts := ex.Fixture().JSON(); !ex.Allow && bytes.Equal(facts, must(os.ReadFile(specFactsFile(t)))) {
			deny = req
			break
		}
	}
	require.NotNil(t, deny)
	before := mustPost(t, gateURL+"/v1/authorize", deny)
	assert.Equal(t, false, before["allow"])
	assert.Equal(t, embedded.Revision(), before["revision"])
	assert.Equal(t, "embedded", p.gate.Status().Origin)

	putModule(t, m, "grant.rego", grantAllModule)
	putModule(t, m, "drop.rego", "package system.log\ndrop if true\n")
	p.requestReload()
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "outside a bundle") }, 10*time.Second, 5*time.Millisecond,
		"the gate warns that OPA's policy is not its own; log:\n%s", log)
	after := mustPost(t, gateURL+"/v1/authorize", deny)
	delete(before, "decision_id")
	delete(after, "decision_id")
	assert.Equal(t, before, after, "what OPA's store holds is not the gate's policy")
	waitState(t, m, plugins.StateOK)

	eng := p.gate.active.Load().engine
	assert.Empty(t, eng.CacheStatus(), "decisions are cached, as in authz serve")
	assert.Equal(t, uint64(1), eng.CacheStats().Hits, "the second decision of the same input came from the cache")
}

// TestGateWaitsForConfiguredBundle: with a bundle configured in OPA's bundles section and not
// activated yet, the gate is not ready and every decision denies (EVAL_NO_POLICY), even with a
// grant-all policy in OPA's store.
func TestGateWaitsForConfiguredBundle(t *testing.T) {
	m, err := plugins.New([]byte(`{"services": {"s": {"url": "http://127.0.0.1:1"}}, "bundles": {"authz": {"service": "s", "resource": "/b.tar.gz"}}}`),
		"test", inmem.New())
	require.NoError(t, err)
	require.NoError(t, m.Init(t.Context()))
	t.Cleanup(func() { m.Stop(context.Background()) })
	putModule(t, m, "grant.rego", grantAllModule)
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`, io.Discard)
	st := waitState(t, m, plugins.StateNotReady)
	assert.Contains(t, st.Message, "waiting for bundle(s) authz")
	gateURL := "http://" + p.Addr().String()
	reqJSON, _ := specexamples.NewFixture().JSON()
	status, header, doc := post(t, gateURL+"/v1/authorize", reqJSON)
	assert.Equal(t, http.StatusInternalServerError, status)
	assert.Equal(t, string(coded.EvalNoPolicy), header.Get("X-Authz-Error"))
	assert.Equal(t, false, doc["allow"])
	resp, err := http.Get(gateURL + "/health/ready")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

// consoleRecorder is an OPA logger that keeps the fields of every "Decision Log" entry.
type consoleRecorder struct {
	mu     *sync.Mutex
	fields map[string]any
	events *[]map[string]any
}

func newConsoleRecorder() consoleRecorder {
	return consoleRecorder{mu: &sync.Mutex{}, events: &[]map[string]any{}}
}

func (r consoleRecorder) Debug(string, ...any) {}
func (r consoleRecorder) Error(string, ...any) {}
func (r consoleRecorder) Warn(string, ...any)  {}
func (r consoleRecorder) Info(msg string, _ ...any) {
	if msg == "Decision Log" {
		r.mu.Lock()
		*r.events = append(*r.events, r.fields)
		r.mu.Unlock()
	}
}
func (r consoleRecorder) WithFields(f map[string]any) logging.Logger {
	r.fields = maps.Clone(f)
	return r
}
func (r consoleRecorder) GetLevel() logging.Level { return logging.Debug }
func (r consoleRecorder) SetLevel(logging.Level)  {}

func (r consoleRecorder) Events() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.events)
}

// TestDecisionsInOPADecisionLog: with OPA's decision_logs configured (console here), every
// gate decision is an OPA decision log event with its decision id, path, revision, bundles,
// input and result, and the input is masked as the gate's own decision log masks it.
func TestDecisionsInOPADecisionLog(t *testing.T) {
	console := newConsoleRecorder()
	m := newManager(t, policyBundle(t, "rev-7"), plugins.ConsoleLogger(console))
	lcfg, err := logs.NewConfigBuilder().WithBytes([]byte(`{"console": true}`)).Parse()
	require.NoError(t, err)
	lp := logs.New(lcfg, m)
	m.Register(logs.Name, lp)
	require.NoError(t, lp.Start(t.Context())) // the manager stops it

	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`, io.Discard)
	waitState(t, m, plugins.StateOK)
	reqJSON, _ := specexamples.NewFixture().JSON()
	doc := mustPost(t, "http://"+p.Addr().String()+"/v1/authorize", reqJSON)
	require.Equal(t, true, doc["allow"])
	assert.Equal(t, "rev-7", doc["revision"])

	events := console.Events()
	require.Len(t, events, 1)
	ev := testutil.JSONObject(t, events[0])
	assert.Equal(t, doc["decision_id"], ev["decision_id"])
	assert.Equal(t, "authz/decision", ev["path"])
	assert.Equal(t, "rev-7", ev["revision"])
	assert.Equal(t, map[string]any{"authz": map[string]any{"revision": "rev-7"}}, ev["bundles"])
	assert.Equal(t, doc, ev["result"], "the event's result is the answer")
	input := ev["input"].(map[string]any)
	assert.Equal(t, "openDuplexChannel", input["operation"])
	assert.Equal(t, "[MASKED]", input["environment"].(map[string]any)["config"], "masked by default, as the gate's own log")
	assert.NotContains(t, string(must(json.Marshal(input))), `"daytona"`, "no copy of the masked provider")
	assert.Equal(t, "[MASKED]", input["resolved"].(map[string]any)["providerKey"])
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestStartAndStop: an address in use fails the start with the field named; Stop ends the
// gate's server (its address refuses connections) and reports the plugin not ready.
func TestStartAndStop(t *testing.T) {
	m := newManager(t, policyBundle(t, "rev-1"))
	facts := specFactsFile(t)
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+facts+`"}`, io.Discard)
	waitState(t, m, plugins.StateOK)
	addr := p.Addr().String()

	f := Factory{LogOutput: io.Discard}
	cfg, err := f.Validate(m, []byte(`{"addr": "`+addr+`", "facts": "`+facts+`"}`))
	require.NoError(t, err)
	busy := f.New(newManager(t, nil), cfg).(*Plugin)
	err = busy.Start(t.Context())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "plugins.authz.addr: listen on "+addr)
	busy.Stop(t.Context())

	p.Stop(t.Context())
	st := waitState(t, m, plugins.StateNotReady)
	assert.Equal(t, "stopped", st.Message)
	assert.Nil(t, p.Addr())
	_, err = net.DialTimeout("tcp", addr, time.Second)
	assert.Error(t, err, "nothing listens on the gate's address after Stop")
}

// TestBundleCopyHoldsItsData: the copy of a bundle holds its data whether OPA read it whole or
// lazily (as it reads downloaded bundles: data files kept raw).
func TestBundleCopyHoldsItsData(t *testing.T) {
	want := map[string]any{"authz": map[string]any{"tables": map[string]any{"a": json.Number("1"), "b": []any{"x"}}}}
	raw := policytest.MakeBundle(t, policytest.BundleSpec{Revision: "d1", Roots: []string{"authz"}, Data: want})
	for _, lazy := range []bool{false, true} {
		b, err := bundle.NewReader(bytes.NewReader(raw)).WithLazyLoadingMode(lazy).Read()
		require.NoError(t, err)
		c := copyBundle("authz", &b)
		require.Empty(t, c.err)
		assert.Equal(t, "d1", c.revision)
		assert.Equal(t, []string{"authz"}, c.roots)
		assert.NotEmpty(t, c.modules)
		assert.Equal(t, testutil.JSONObject(t, want), testutil.JSONObject(t, c.data), "lazy %v", lazy)
	}
}

// TestBundleLogRulesApplyStoreOnesDoNot: the gate's events in OPA's decision log are masked
// by the system.log rules of the bundle, and a drop rule written into OPA's store (as OPA's
// Policy API writes it) does not drop them.
func TestBundleLogRulesApplyStoreOnesDoNot(t *testing.T) {
	mods := policytest.EmbeddedModules(t)
	mods["system/log.rego"] = "package system.log\nmask contains \"/input/operation\"\n"
	b := policytest.NewBundle(t, policytest.BundleSpec{Revision: "m1", Roots: []string{"authz", "system/log"}, Modules: mods})
	console := newConsoleRecorder()
	m := newManager(t, b, plugins.ConsoleLogger(console))
	lcfg, err := logs.NewConfigBuilder().WithBytes([]byte(`{"console": true}`)).Parse()
	require.NoError(t, err)
	lp := logs.New(lcfg, m)
	m.Register(logs.Name, lp)
	require.NoError(t, lp.Start(t.Context()))
	putModule(t, m, "drop.rego", "package system.log.extra\ndrop if true\n")
	putModule(t, m, "drop2.rego", "package system\nlog.drop if true\n")
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`, io.Discard)
	waitState(t, m, plugins.StateOK)
	reqJSON, _ := specexamples.NewFixture().JSON()
	doc := mustPost(t, "http://"+p.Addr().String()+"/v1/authorize", reqJSON)
	require.Equal(t, "m1", doc["revision"])
	events := console.Events()
	require.Len(t, events, 1, "not dropped by the store's rule")
	ev := testutil.JSONObject(t, events[0])
	assert.Equal(t, doc["decision_id"], ev["decision_id"])
	input := ev["input"].(map[string]any)
	assert.NotContains(t, input, "operation", "masked by the bundle's rule")
	assert.Contains(t, input, "resolved")

	// The store's rule is in force for OPA's own plugin: the same event through it is dropped.
	require.NoError(t, policy.LogToOPA(t.Context(), lp, policy.Decision{ID: "opa-own", Path: "authz/decision", Input: map[string]any{}, Result: map[string]any{}}))
	assert.Len(t, console.Events(), 1, "OPA's own plugin drops it")
}
