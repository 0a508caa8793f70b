package snapshot

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
)

func mustRequest(t testing.TB, body string) *Request {
	t.Helper()
	req, err := ParseRequest(strings.NewReader(body))
	require.NoError(t, err)
	return req
}

func mustFacts(t testing.TB, body string) *FileFacts {
	t.Helper()
	f, err := ParseFacts(strings.NewReader(body))
	require.NoError(t, err)
	return f
}

func TestParseRequestShape(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string // substring; "" means valid
		wantOp  string
	}{
		{name: "empty object defaults", body: `{}`, wantOp: OpOpenDuplexChannel},
		{name: "ingress operation", body: `{"operation":"getRunnerIngressEndpoint"}`, wantOp: OpGetRunnerIngressEndpoint},
		{name: "extra fields ignored", body: `{"foo":1,"lease":{"bar":[1]}}`, wantOp: OpOpenDuplexChannel},
		{name: "not JSON", body: `{`, wantErr: "not valid JSON"},
		{name: "empty body", body: ``, wantErr: "empty document"},
		{name: "trailing data", body: `{} {}`, wantErr: "unexpected data"},
		{name: "array", body: `[]`, wantErr: "must be a JSON object, got an array"},
		{name: "null", body: `null`, wantErr: "got null"},
		{name: "string", body: `"x"`, wantErr: "got a string"},
		{name: "unknown operation", body: `{"operation":"deleteSandbox"}`, wantErr: `got "deleteSandbox"`},
		{name: "null operation", body: `{"operation":null}`, wantErr: "got null"},
		{name: "operation case differs", body: `{"operation":"OpenDuplexChannel"}`, wantErr: "operation must be"},
		{name: "environment null", body: `{"environment":null}`, wantErr: "environment must be an object"},
		{name: "environment array", body: `{"environment":[]}`, wantErr: "environment must be an object"},
		{name: "lease string", body: `{"lease":"x"}`, wantErr: "lease must be an object"},
		{name: "metadata null", body: `{"lease":{"metadata":null}}`, wantErr: "lease.metadata must be an object"},
		{name: "metadata number", body: `{"lease":{"metadata":3}}`, wantErr: "lease.metadata must be an object when present, got a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := ParseRequest(strings.NewReader(tt.body))
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, coded.BadRequest, coded.CodeOf(err), "want a bad request, got %v", err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.wantOp, req.Operation)
			assert.NotNil(t, req.Environment)
			assert.NotNil(t, req.Lease)
			assert.NotNil(t, req.Metadata)
		})
	}
}

func TestParseFactsShape(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string
	}{
		{name: "empty object", body: `{}`},
		{name: "spec fixture", body: `{"plugins":[{"id":"a"}],"workers":{"a":{}},"builtinProviders":{"fake":{}}}`},
		{name: "not JSON", body: `{"plugins":`, wantErr: "not valid JSON"},
		{name: "array", body: `[]`, wantErr: "must be a JSON object"},
		{name: "plugins null", body: `{"plugins":null}`, wantErr: "facts.plugins must be an array"},
		{name: "plugins object", body: `{"plugins":{}}`, wantErr: "facts.plugins must be an array"},
		{name: "plugin not object", body: `{"plugins":[1]}`, wantErr: "facts.plugins[0] must be an object"},
		{name: "plugin id missing", body: `{"plugins":[{}]}`, wantErr: "facts.plugins[0].id must be a non-empty string"},
		{name: "plugin id empty", body: `{"plugins":[{"id":""}]}`, wantErr: "facts.plugins[0].id"},
		{name: "plugin id number", body: `{"plugins":[{"id":1}]}`, wantErr: "facts.plugins[0].id"},
		{name: "duplicate id", body: `{"plugins":[{"id":"a"},{"id":"a"}]}`, wantErr: `facts.plugins[1].id "a" is a duplicate`},
		{name: "workers null", body: `{"workers":null}`, wantErr: "facts.workers must be an object"},
		{name: "workers array", body: `{"workers":[]}`, wantErr: "facts.workers must be an object"},
		{name: "worker not object", body: `{"workers":{"a":true}}`, wantErr: `facts.workers["a"] must be an object`},
		{name: "builtins null", body: `{"builtinProviders":null}`, wantErr: "facts.builtinProviders must be an object"},
		{name: "builtin not object", body: `{"builtinProviders":{"fake":null}}`, wantErr: `facts.builtinProviders["fake"] must be an object`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseFacts(strings.NewReader(tt.body))
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, coded.BadFacts, coded.CodeOf(err), "want bad facts, got %v", err)
			assert.Contains(t, err.Error(), tt.wantErr)
		})
	}
}

func TestLoadFactsMissingFile(t *testing.T) {
	_, err := LoadFacts(t.TempDir() + "/nope.json")
	require.Error(t, err)
	assert.Equal(t, coded.BadFacts, coded.CodeOf(err))
}

func TestFileFactsConfigValid(t *testing.T) {
	f := mustFacts(t, `{"workers":{"absent":{},"yes":{"configValid":true},"no":{"configValid":false},
		"null":{"configValid":null},"str":{"configValid":"true"},"one":{"configValid":1}}}`)
	for id, want := range map[string]bool{"absent": true, "yes": true, "no": false, "null": false, "str": false, "one": false} {
		w, ok := f.Worker(id)
		require.True(t, ok, id)
		got, err := f.ConfigValid(t.Context(), id, w, "k", nil)
		require.NoError(t, err)
		assert.Equal(t, want, got, id)
	}
}

func TestFileFactsMethodsKeepStringsOnly(t *testing.T) {
	f := mustFacts(t, `{"workers":{"a":{"supportedMethods":["x",1,null,"y",{"z":1}]},"b":{"supportedMethods":"x"},"c":{"supportedMethods":null}}}`)
	a, _ := f.Worker("a")
	assert.Equal(t, []string{"x", "y"}, a.SupportedMethods)
	b, _ := f.Worker("b")
	assert.Empty(t, b.SupportedMethods)
	c, _ := f.Worker("c")
	assert.Empty(t, c.SupportedMethods)
	_, ok := f.Worker("missing")
	assert.False(t, ok)
}

// countingFacts records the config checks Build makes and answers them with a fixed result.
type countingFacts struct {
	*FileFacts
	calls  int
	valid  bool
	err    error
	waitOn bool // block until ctx is done
}

func (c *countingFacts) ConfigValid(ctx context.Context, _ string, _ *Worker, _ string, _ any) (bool, error) {
	c.calls++
	if c.waitOn {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return c.valid, c.err
}

const fixtureFacts = `{
  "plugins": [{"id": "test.plugin", "key": "acme.daytona", "status": "ready",
     "manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider",
        "sandboxCapabilities": {"duplexCommandStream": true}}]}}],
  "workers": {"test.plugin": {"supportedMethods": ["duplexChannelOpen"], "configValid": true}},
  "builtinProviders": {"fake": {"execute": true, "supportsReusableLeases": false}}
}`

func TestBuildResolvesDriverProviderAndPins(t *testing.T) {
	facts := mustFacts(t, fixtureFacts)
	tests := []struct {
		name         string
		request      string
		driver       string
		providerKey  string
		pluginBacked bool
		pluginID     string
		driverKey    string
	}{
		{name: "lease metadata wins", driver: "ssh", providerKey: "p",
			request: `{"environment":{"driver":"sandbox","config":{"provider":"env"}},"lease":{"metadata":{"driver":"ssh","provider":"p"}}}`},
		{name: "environment driver when metadata driver empty", driver: "local", providerKey: "",
			request: `{"environment":{"driver":"local","config":{"provider":"env"}},"lease":{"metadata":{"driver":""}}}`},
		{name: "metadata driver not a string is ignored", driver: "plugin",
			request: `{"environment":{"driver":"plugin"},"lease":{"metadata":{"driver":7}}}`},
		{name: "default sandbox", driver: "sandbox", request: `{}`},
		{name: "environment driver not a string", driver: "sandbox", request: `{"environment":{"driver":true}}`},
		{name: "provider from sandbox environment config", driver: "sandbox", providerKey: "env",
			request: `{"environment":{"driver":"sandbox","config":{"provider":"env"}}}`},
		{name: "provider fallback only for environment driver sandbox", driver: "sandbox", providerKey: "",
			request: `{"environment":{"driver":"Sandbox","config":{"provider":"env"}},"lease":{"metadata":{"driver":"sandbox"}}}`},
		{name: "config not an object gives no provider", driver: "sandbox",
			request: `{"environment":{"driver":"sandbox","config":["provider"]}}`},
		{name: "provider not a string", driver: "sandbox",
			request: `{"environment":{"driver":"sandbox","config":{"provider":3}}}`},
		{name: "pins", driver: "plugin", pluginBacked: true, pluginID: "x", driverKey: "k",
			request: `{"lease":{"metadata":{"driver":"plugin","sandboxProviderPlugin":true,"pluginId":"x","driverKey":"k"}}}`},
		{name: "pluginBacked must be literal true", driver: "sandbox", pluginID: "x",
			request: `{"lease":{"metadata":{"sandboxProviderPlugin":"true","pluginId":"x","driverKey":5}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Build(t.Context(), mustRequest(t, tt.request), facts, Options{})
			res := in["resolved"].(map[string]any)
			assert.Equal(t, tt.driver, res["driver"])
			assert.Equal(t, tt.providerKey, res["providerKey"])
			assert.Equal(t, tt.pluginBacked, res["pluginBacked"])
			assert.Equal(t, tt.pluginID, res["pluginId"])
			assert.Equal(t, tt.driverKey, res["driverKey"])
		})
	}
}

func TestBuildLooksUpFactsByExactPin(t *testing.T) {
	facts := mustFacts(t, fixtureFacts)
	in := Build(t.Context(), mustRequest(t, `{"lease":{"metadata":{"pluginId":"test.plugin","provider":"fake"}}}`), facts, Options{})
	f := in["facts"].(map[string]any)
	assert.Equal(t, "acme.daytona", f["plugin"].(map[string]any)["key"])
	assert.Equal(t, []any{"duplexChannelOpen"}, f["worker"].(map[string]any)["supportedMethods"])
	assert.Equal(t, true, f["builtinProvider"].(map[string]any)["execute"])

	for _, pin := range []string{"Test.plugin", "test.plugin ", "test"} {
		in := Build(t.Context(), mustRequest(t, `{"lease":{"metadata":{"pluginId":"`+pin+`"}}}`), facts, Options{})
		assert.Empty(t, in["facts"], "pin %q must not match test.plugin", pin)
	}
}

func TestBuildNarrowing(t *testing.T) {
	facts := mustFacts(t, fixtureFacts)
	tests := []struct {
		name   string
		lease  string
		reuse  bool
		nosync bool
	}{
		{name: "reuse policy keeps reusable leases", lease: `{"leasePolicy":"reuse_by_environment"}`, reuse: true},
		{name: "other policy", lease: `{"leasePolicy":"reuse_by_execution_workspace"}`},
		{name: "absent policy", lease: `{}`},
		{name: "policy case differs", lease: `{"leasePolicy":"Reuse_by_environment"}`},
		{name: "job backend", lease: `{"metadata":{"backend":"job"}}`, nosync: true},
		{name: "native sync unsupported", lease: `{"metadata":{"nativeFileSyncUnsupported":true}}`, nosync: true},
		{name: "native sync unsupported as string", lease: `{"metadata":{"nativeFileSyncUnsupported":"true"}}`},
		{name: "backend other", lease: `{"metadata":{"backend":"Job"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Build(t.Context(), mustRequest(t, `{"lease":`+tt.lease+`}`), facts, Options{})
			n := in["narrowing"].(map[string]any)
			assert.Equal(t, !tt.reuse, n["leasePolicyNotReusable"])
			assert.Equal(t, tt.nosync, n["nativeSyncUnavailable"])
			assert.Equal(t, false, n["configResolutionFailed"])
		})
	}
}

func TestBuildConsultsConfigOnlyOnPluginBackedSandboxPath(t *testing.T) {
	const backed = `{"environment":{"driver":"sandbox","config":{"provider":"daytona"}},"lease":{"metadata":{"sandboxProviderPlugin":true,"pluginId":"test.plugin","provider":"daytona"}}}`
	tests := []struct {
		name      string
		request   string
		facts     string
		valid     bool
		err       error
		wantCalls int
		wantFail  bool
	}{
		{name: "valid", request: backed, facts: fixtureFacts, valid: true, wantCalls: 1},
		{name: "refused", request: backed, facts: fixtureFacts, valid: false, wantCalls: 1, wantFail: true},
		{name: "error counts as not valid", request: backed, facts: fixtureFacts, valid: true, err: errors.New("boom"), wantCalls: 1, wantFail: true},
		{name: "no worker: not consulted", request: backed, facts: `{"plugins":[{"id":"test.plugin","status":"ready"}]}`},
		{name: "plugin not ready: not consulted", request: backed, facts: `{"plugins":[{"id":"test.plugin","status":"error"}],"workers":{"test.plugin":{}}}`},
		{name: "plugin driver: not consulted", facts: fixtureFacts,
			request: `{"lease":{"metadata":{"driver":"plugin","pluginId":"test.plugin","driverKey":"daytona"}}}`},
		{name: "built-in: not consulted", facts: fixtureFacts, request: `{"lease":{"metadata":{"pluginId":"test.plugin","provider":"fake"}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cf := &countingFacts{FileFacts: mustFacts(t, tt.facts), valid: tt.valid, err: tt.err}
			in := Build(t.Context(), mustRequest(t, tt.request), cf, Options{})
			assert.Equal(t, tt.wantCalls, cf.calls)
			assert.Equal(t, tt.wantFail, in["narrowing"].(map[string]any)["configResolutionFailed"])
		})
	}
}

func TestBuildConfigTimeoutCountsAsNotValid(t *testing.T) {
	cf := &countingFacts{FileFacts: mustFacts(t, fixtureFacts), waitOn: true}
	req := mustRequest(t, `{"lease":{"metadata":{"sandboxProviderPlugin":true,"pluginId":"test.plugin","provider":"daytona"}}}`)
	start := time.Now()
	in := Build(t.Context(), req, cf, Options{ConfigTimeout: 20 * time.Millisecond})
	assert.Less(t, time.Since(start), 5*time.Second, "the config check must be bounded")
	assert.Equal(t, true, in["narrowing"].(map[string]any)["configResolutionFailed"])
}

func TestBuildPassesRequestThrough(t *testing.T) {
	now := time.Unix(1700000000, 5)
	in := Build(t.Context(), mustRequest(t, `{"lease":{"companyId":"c"},"command":["sh"]}`), mustFacts(t, `{}`), Options{Now: func() time.Time { return now }})
	assert.Equal(t, now.UnixNano(), in["now_ns"])
	assert.Equal(t, []any{"sh"}, in["command"])
	assert.Equal(t, "c", in["lease"].(map[string]any)["companyId"])
	assert.Equal(t, map[string]any{}, in["lease"].(map[string]any)["metadata"], "absent metadata is {}")
	in = Build(t.Context(), mustRequest(t, `{}`), mustFacts(t, `{}`), Options{})
	_, has := in["command"]
	assert.False(t, has)
}

// liveFacts is a plugin whose worker dies at a chosen moment of the input assembly.
type liveFacts struct {
	record     map[string]any
	worker     *Worker
	dieOnCheck bool // the process ends during the config check
	dead       atomic.Bool
	reads      int
}

func (l *liveFacts) Plugin(id string) (PluginFacts, bool) {
	if id != "test.plugin" {
		return PluginFacts{}, false
	}
	l.reads++
	return PluginFacts{Record: l.record, Worker: l.worker}, true
}

func (l *liveFacts) BuiltinProvider(string) (map[string]any, bool) { return nil, false }

func (l *liveFacts) ConfigValid(context.Context, string, *Worker, string, any) (bool, error) {
	if l.dieOnCheck {
		l.dead.Store(true)
	}
	return true, nil
}

// TestBuildDropsAWorkerThatDiedWhileAssembling: the worker is confirmed alive after its methods
// were read (and its config checked); a worker that ended meanwhile is absent from the input,
// so the policy denies (worker_not_running) instead of granting on a dead generation.
func TestBuildDropsAWorkerThatDiedWhileAssembling(t *testing.T) {
	const backed = `{"environment":{"driver":"sandbox","config":{"provider":"daytona"}},"lease":{"metadata":{"sandboxProviderPlugin":true,"pluginId":"test.plugin","provider":"daytona"}}}`
	record := map[string]any{"id": "test.plugin", "key": "acme.daytona", "status": "ready", "manifest": map[string]any{"environmentDrivers": []any{}}}
	tests := []struct {
		name       string
		deadBefore bool
		dieOnCheck bool
		wantWorker bool
	}{
		{name: "alive throughout", wantWorker: true},
		{name: "dead before the read", deadBefore: true},
		{name: "dies during the config check", dieOnCheck: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lf := &liveFacts{record: record, dieOnCheck: tt.dieOnCheck}
			lf.dead.Store(tt.deadBefore)
			lf.worker = NewWorker(7, []string{"duplexChannelOpen"}, func() bool { return !lf.dead.Load() })
			in := Build(t.Context(), mustRequest(t, backed), lf, Options{})
			f := in["facts"].(map[string]any)
			_, hasWorker := f["worker"]
			assert.Equal(t, tt.wantWorker, hasWorker)
			assert.Equal(t, record, f["plugin"], "the record stays: the policy needs it to say why it denies")
			assert.Equal(t, 1, lf.reads, "the plugin and its worker are read in one call")
			assert.Equal(t, false, in["narrowing"].(map[string]any)["configResolutionFailed"])
		})
	}
}

// TestBuildSharesTheRenderedWorker: the worker document is rendered once, not per decision.
func TestBuildSharesTheRenderedWorker(t *testing.T) {
	w := NewWorker(3, []string{"a", "b"}, nil)
	assert.Equal(t, map[string]any{"generation": uint64(3), "supportedMethods": []any{"a", "b"}}, w.Document())
	lf := &liveFacts{record: map[string]any{"id": "test.plugin"}, worker: w}
	in := Build(t.Context(), mustRequest(t, `{"lease":{"metadata":{"pluginId":"test.plugin"}}}`), lf, Options{})
	got := in["facts"].(map[string]any)["worker"].(map[string]any)
	assert.Same(t, &w.Document()["supportedMethods"].([]any)[0], &got["supportedMethods"].([]any)[0])
	var nilWorker *Worker
	assert.False(t, nilWorker.Alive())
}
