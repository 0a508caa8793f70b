package decision_test

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
)

// fixture is SPEC fixture F (sections 3 and 4) as decoded JSON, ready to be changed by a test row.
type fixture struct {
	Request map[string]any
	Facts   map[string]any
}

func loadFixture(t testing.TB) fixture {
	t.Helper()
	var f fixture
	for path, dst := range map[string]*map[string]any{
		"../snapshot/testdata/request.json": &f.Request,
		"../snapshot/testdata/facts.json":   &f.Facts,
	} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(b, dst))
	}
	return f
}

func (f fixture) metadata() map[string]any {
	return f.Request["lease"].(map[string]any)["metadata"].(map[string]any)
}

func (f fixture) plugin() map[string]any { return f.Facts["plugins"].([]any)[0].(map[string]any) }

func (f fixture) entry() map[string]any {
	return f.plugin()["manifest"].(map[string]any)["environmentDrivers"].([]any)[0].(map[string]any)
}

func (f fixture) worker() map[string]any {
	return f.Facts["workers"].(map[string]any)["test.plugin"].(map[string]any)
}

// decide runs a fixture through the public path: JSON bytes → parsers → engine.
func decide(t testing.TB, eng *decision.Engine, f fixture) decision.Document {
	t.Helper()
	reqJSON, err := json.Marshal(f.Request)
	require.NoError(t, err)
	factsJSON, err := json.Marshal(f.Facts)
	require.NoError(t, err)
	req, err := snapshot.ParseRequest(bytes.NewReader(reqJSON))
	require.NoError(t, err)
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	require.NoError(t, err)
	doc, _, err := eng.Decide(t.Context(), req, facts)
	require.NoError(t, err)
	return doc
}

func newEngine(t testing.TB) *decision.Engine {
	t.Helper()
	eng, err := decision.New(t.Context(), decision.Options{})
	require.NoError(t, err)
	return eng
}

const (
	capDenied    = "DUPLEX_CHANNEL_CAPABILITY_DENIED"
	capDeniedMsg = "Sandbox lease does not grant the duplex command stream capability."
)

// TestSpecExamples is SPEC section 10, row by row.
func TestSpecExamples(t *testing.T) {
	allMethods := []any{"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease",
		"environmentSyncIn", "environmentSyncOut", "environmentExecute", "duplexChannelOpen",
		"environmentRunnerIngressEndpoint"}
	tests := []struct {
		name    string
		change  func(f fixture)
		allow   bool
		code    string
		message string
		reasons []string
		also    func(t *testing.T, d decision.Document)
	}{
		{name: "1 fixture grants", change: func(fixture) {}, allow: true,
			also: func(t *testing.T, d decision.Document) {
				assert.True(t, d.Capabilities.DuplexCommandStream)
				assert.False(t, d.Capabilities.PersistentProcessSessions)
			}},
		{name: "2 no methods", change: func(f fixture) { f.worker()["supportedMethods"] = []any{} },
			code: capDenied, message: capDeniedMsg, reasons: []string{"method_not_verified"}},
		{name: "3 no sandboxCapabilities (opt-in)", change: func(f fixture) { delete(f.entry(), "sandboxCapabilities") },
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"}},
		{name: "4 local driver", change: func(f fixture) { f.metadata()["driver"] = "local" },
			code: "DUPLEX_CHANNEL_UNSUPPORTED", message: `Environment driver "local" does not support duplex channels.`,
			reasons: []string{"operation_unsupported_by_driver"}},
		{name: "5 unknown driver", change: func(f fixture) { f.metadata()["driver"] = "foo" },
			code:    "ENVIRONMENT_DRIVER_NOT_REGISTERED",
			message: `Environment driver "foo" is not registered in the environment runtime yet.`,
			reasons: []string{"driver_not_registered"}},
		{name: "6 plugin disabled", change: func(f fixture) { f.plugin()["status"] = "disabled" },
			code: capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_ready"}},
		{name: "7 entry kind environment_driver", change: func(f fixture) { f.entry()["kind"] = "environment_driver" },
			code: capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}},
		{name: "8 config not valid", change: func(f fixture) {
			f.worker()["configValid"] = false
			f.worker()["supportedMethods"] = []any{"duplexChannelOpen", "environmentExecute"}
		}, code: capDenied, message: capDeniedMsg, reasons: []string{"capability_narrowed"},
			also: func(t *testing.T, d decision.Document) {
				assert.False(t, d.Capabilities.PersistentProcessSessions)
				assert.True(t, d.Capabilities.IndependentControlCommands, "config failure narrows only its three keys")
			}},
		{name: "9 job backend", change: func(f fixture) {
			f.metadata()["backend"] = "job"
			f.worker()["supportedMethods"] = []any{"duplexChannelOpen", "environmentSyncIn"}
		}, allow: true, also: func(t *testing.T, d decision.Document) { assert.False(t, d.Capabilities.NativeSyncIn) }},
		{name: "10 declared as string", change: func(f fixture) {
			f.entry()["sandboxCapabilities"] = map[string]any{"duplexCommandStream": "true"}
		}, code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"}},
		{name: "11 no worker", change: func(f fixture) { f.Facts["workers"] = map[string]any{} },
			code: capDenied, message: capDeniedMsg, reasons: []string{"worker_not_running"}},
		{name: "12 all nine", change: func(f fixture) {
			f.worker()["supportedMethods"] = allMethods
			caps := map[string]any{}
			for _, k := range decision.CapabilityKeys {
				caps[k] = true
			}
			f.entry()["sandboxCapabilities"] = caps
			f.Request["lease"].(map[string]any)["leasePolicy"] = "reuse_by_environment"
		}, allow: true, also: func(t *testing.T, d decision.Document) {
			for _, k := range decision.CapabilityKeys {
				assert.True(t, d.Capabilities.Get(k), k)
			}
		}},
		{name: "13 built-in fake", change: func(f fixture) {
			delete(f.metadata(), "sandboxProviderPlugin")
			f.metadata()["provider"] = "fake"
		}, code: capDenied, message: capDeniedMsg, reasons: []string{"method_not_verified", "capability_not_declared"},
			also: func(t *testing.T, d decision.Document) {
				assert.True(t, d.Capabilities.PersistentProcessSessions)
				assert.True(t, d.Capabilities.IndependentControlCommands)
				assert.False(t, d.Capabilities.DuplexCommandStream)
			}},
		{name: "14 ingress on the plugin driver", change: func(f fixture) {
			f.Request["operation"] = "getRunnerIngressEndpoint"
			f.metadata()["driver"] = "plugin"
			f.metadata()["driverKey"] = "daytona"
			f.worker()["supportedMethods"] = []any{"environmentRunnerIngressEndpoint"}
			f.entry()["sandboxCapabilities"] = map[string]any{"runnerWebSocketIngress": true}
		}, code: "RUNNER_INGRESS_UNSUPPORTED", message: `Environment driver "plugin" does not support runner ingress.`,
			reasons: []string{"operation_unsupported_by_driver"},
			also:    func(t *testing.T, d decision.Document) { assert.True(t, d.Capabilities.RunnerWebSocketIngress) }},
	}
	eng := newEngine(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := loadFixture(t)
			tt.change(f)
			d := decide(t, eng, f)
			assert.Equal(t, tt.allow, d.Allow)
			assert.Equal(t, tt.code, d.Code)
			assert.Equal(t, tt.message, d.Message)
			if tt.allow {
				assert.Equal(t, []string{}, d.Reasons)
			} else {
				assert.Equal(t, tt.reasons, d.Reasons)
			}
			assert.NotEmpty(t, d.DecisionID)
			assert.Equal(t, eng.Revision(), d.Revision)
			if tt.also != nil {
				tt.also(t, d)
			}
		})
	}
}

// TestDocumentJSONHasEveryKey checks the wire shape of SPEC section 8.
func TestDocumentJSONHasEveryKey(t *testing.T) {
	d := decide(t, newEngine(t), loadFixture(t))
	b, err := json.Marshal(d)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	for _, k := range []string{"allow", "code", "message", "reasons", "capabilities", "decision_id", "revision"} {
		assert.Contains(t, m, k)
	}
	assert.Equal(t, []any{}, m["reasons"], "a grant has an empty reasons array, not null")
	caps := m["capabilities"].(map[string]any)
	assert.Len(t, caps, 9)
	for _, k := range decision.CapabilityKeys {
		assert.IsType(t, true, caps[k], k)
	}
}

func TestDecisionIDsAreFresh(t *testing.T) {
	eng := newEngine(t)
	f := loadFixture(t)
	a, b := decide(t, eng, f), decide(t, eng, f)
	assert.NotEqual(t, a.DecisionID, b.DecisionID)
	assert.Equal(t, a.Revision, b.Revision)
}
