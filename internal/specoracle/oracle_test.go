package specoracle_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/specoracle"
)

// fixtureRequest is the request of docs/contract.md, "The request", as written.
const fixtureRequest = `{
  "operation": "openDuplexChannel",
  "environment": {"id": "env-1", "driver": "sandbox", "config": {"provider": "daytona"}},
  "lease": {
    "id": "lease-1", "companyId": "company-1", "leasePolicy": "ephemeral",
    "providerLeaseId": "provider-lease-1",
    "metadata": {"driver": "sandbox", "sandboxProviderPlugin": true, "pluginId": "test.plugin", "provider": "daytona"}
  },
  "command": ["sh", "-c", "echo hi"]
}`

// fixtureFacts is the facts document of docs/contract.md, "The facts (host state)", as written.
const fixtureFacts = `{
  "plugins": [
    {"id": "test.plugin", "key": "acme.daytona", "status": "ready",
     "manifest": {"environmentDrivers": [
       {"driverKey": "daytona", "kind": "sandbox_provider",
        "sandboxCapabilities": {"duplexCommandStream": true}}]}}
  ],
  "workers": {"test.plugin": {"supportedMethods": ["duplexChannelOpen"], "configValid": true}},
  "builtinProviders": {"fake": {"execute": true, "supportsReusableLeases": false}}
}`

const (
	capDenied    = specoracle.CodeDuplexChannelCapabilityDenied
	capDeniedMsg = specoracle.MessageDuplexChannelCapabilityDenied
	ingDenied    = specoracle.CodeRunnerIngressCapabilityDenied
	ingDeniedMsg = specoracle.MessageRunnerIngressCapabilityDenied
)

var allMethods = []any{
	"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease",
	"environmentSyncIn", "environmentSyncOut", "environmentExecute",
	"duplexChannelOpen", "environmentRunnerIngressEndpoint",
}

// decodeJSON decodes like the service does (UseNumber).
func decodeJSON(t testing.TB, s string) any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	require.NoError(t, dec.Decode(&v))
	return v
}

// fixture returns fresh, mutable copies of F (docs/contract.md, "Worked examples").
func fixture(t testing.TB) (map[string]any, map[string]any) {
	t.Helper()
	return decodeJSON(t, fixtureRequest).(map[string]any), decodeJSON(t, fixtureFacts).(map[string]any)
}

func obj(t testing.TB, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	require.True(t, ok, "not an object: %#v", v)
	return m
}

func envOf(t testing.TB, req map[string]any) map[string]any   { return obj(t, req["environment"]) }
func leaseOf(t testing.TB, req map[string]any) map[string]any { return obj(t, req["lease"]) }
func mdOf(t testing.TB, req map[string]any) map[string]any {
	return obj(t, leaseOf(t, req)["metadata"])
}
func pluginOf(t testing.TB, f map[string]any) map[string]any {
	return obj(t, f["plugins"].([]any)[0])
}
func manifestOf(t testing.TB, f map[string]any) map[string]any {
	return obj(t, pluginOf(t, f)["manifest"])
}
func entryOf(t testing.TB, f map[string]any) map[string]any {
	return obj(t, manifestOf(t, f)["environmentDrivers"].([]any)[0])
}
func declOf(t testing.TB, f map[string]any) map[string]any {
	return obj(t, entryOf(t, f)["sandboxCapabilities"])
}
func workerOf(t testing.TB, f map[string]any) map[string]any {
	return obj(t, obj(t, f["workers"])["test.plugin"])
}

// allCaps returns the nine keys, all set to v.
func allCaps(v bool) map[string]bool {
	m := map[string]bool{}
	for _, k := range specoracle.CapabilityKeys {
		m[k] = v
	}
	return m
}

// assertInvariants checks what every decision must satisfy (docs/contract.md, "The decision document").
func assertInvariants(t testing.TB, d specoracle.Decision) {
	t.Helper()
	require.NotNil(t, d.Reasons)
	require.Len(t, d.Capabilities, 9)
	for _, k := range specoracle.CapabilityKeys {
		_, ok := d.Capabilities[k]
		assert.True(t, ok, "missing capability key %s", k)
	}
	if d.Allow {
		assert.Empty(t, d.Code)
		assert.Empty(t, d.Message)
		assert.Empty(t, d.Reasons)
	} else {
		assert.NotEmpty(t, d.Code)
		assert.NotEmpty(t, d.Message)
		assert.NotEmpty(t, d.Reasons)
	}
}

type change func(t testing.TB, req, facts map[string]any)

type row struct {
	name    string
	change  change
	allow   bool
	code    string
	message string
	reasons []string
	caps    map[string]bool // subset of capabilities to assert; nil: not checked
}

func runRows(t *testing.T, rows []row) {
	t.Helper()
	for _, tc := range rows {
		t.Run(tc.name, func(t *testing.T) {
			req, facts := fixture(t)
			if tc.change != nil {
				tc.change(t, req, facts)
			}
			d, err := specoracle.Decide(req, facts)
			require.NoError(t, err)
			assertInvariants(t, d)
			assert.Equal(t, tc.allow, d.Allow, "allow")
			assert.Equal(t, tc.code, d.Code, "code")
			assert.Equal(t, tc.message, d.Message, "message")
			if tc.reasons != nil || tc.allow {
				want := tc.reasons
				if want == nil {
					want = []string{}
				}
				assert.Equal(t, want, d.Reasons, "reasons")
			}
			for k, v := range tc.caps {
				assert.Equal(t, v, d.Capabilities[k], "capability %s", k)
			}
		})
	}
}

// TestSpecExamples is every row of docs/contract.md, "Worked examples" (fixture F = docs/contract.md, "The request" + docs/contract.md, "The facts (host state)").
func TestSpecExamples(t *testing.T) {
	runRows(t, []row{
		{
			name:  "1 none",
			allow: true, reasons: []string{},
			caps: map[string]bool{"duplexCommandStream": true, "persistentProcessSessions": false},
		},
		{
			name: "2 worker supportedMethods empty",
			change: func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = []any{}
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified"},
			caps:    allCaps(false),
		},
		{
			name: "3 entry without sandboxCapabilities (opt-in)",
			change: func(t testing.TB, _, f map[string]any) {
				delete(entryOf(t, f), "sandboxCapabilities")
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"capability_not_declared"},
			caps:    map[string]bool{"duplexCommandStream": false},
		},
		{
			name: "4 lease driver local",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = "local"
			},
			code:    "DUPLEX_CHANNEL_UNSUPPORTED",
			message: `Environment driver "local" does not support duplex channels.`,
			reasons: []string{"operation_unsupported_by_driver"},
			caps:    allCaps(false),
		},
		{
			name: "5 lease driver foo",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = "foo"
			},
			code:    "ENVIRONMENT_DRIVER_NOT_REGISTERED",
			message: `Environment driver "foo" is not registered in the environment runtime yet.`,
			reasons: []string{"driver_not_registered"},
			caps:    allCaps(false),
		},
		{
			name: "6 plugin status disabled",
			change: func(t testing.TB, _, f map[string]any) {
				pluginOf(t, f)["status"] = "disabled"
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"plugin_not_ready"},
			caps:    allCaps(false),
		},
		{
			name: "7 entry kind environment_driver",
			change: func(t testing.TB, _, f map[string]any) {
				entryOf(t, f)["kind"] = "environment_driver"
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"driver_entry_missing"},
			caps:    allCaps(false),
		},
		{
			name: "8 configValid false",
			change: func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["configValid"] = false
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"capability_narrowed"},
			caps:    map[string]bool{"duplexCommandStream": false, "persistentProcessSessions": false},
		},
		{
			name: "9 backend job",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["backend"] = "job"
			},
			allow: true, reasons: []string{},
			caps: map[string]bool{"duplexCommandStream": true, "nativeSyncIn": false},
		},
		{
			name: "10 declared duplexCommandStream string true",
			change: func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["duplexCommandStream"] = "true"
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"capability_not_declared"},
			caps:    allCaps(false),
		},
		{
			name: "11 no worker for the plugin",
			change: func(t testing.TB, _, f map[string]any) {
				f["workers"] = map[string]any{}
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"worker_not_running"},
			caps:    allCaps(false),
		},
		{
			name: "12 all nine verified and declared, reuse_by_environment",
			change: func(t testing.TB, req, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = allMethods
				decl := declOf(t, f)
				for _, k := range specoracle.CapabilityKeys {
					decl[k] = true
				}
				leaseOf(t, req)["leasePolicy"] = "reuse_by_environment"
			},
			allow: true, reasons: []string{},
			caps: allCaps(true),
		},
		{
			name: "13 built-in provider fake",
			change: func(t testing.TB, req, _ map[string]any) {
				md := mdOf(t, req)
				md["provider"] = "fake"
				delete(md, "sandboxProviderPlugin")
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
			caps: map[string]bool{
				"persistentProcessSessions": true, "independentControlCommands": true,
				"reusableLeases": false, "nativeSyncIn": false, "nativeSyncOut": false,
				"incrementalSessionOutput": false, "concurrentSyncOperations": false,
				"duplexCommandStream": false, "runnerWebSocketIngress": false,
			},
		},
		{
			name: "14 getRunnerIngressEndpoint on the plugin driver",
			change: func(t testing.TB, req, f map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				md := mdOf(t, req)
				md["driver"] = "plugin"
				md["driverKey"] = "daytona"
				workerOf(t, f)["supportedMethods"] = []any{"duplexChannelOpen", "environmentRunnerIngressEndpoint"}
				declOf(t, f)["runnerWebSocketIngress"] = true
			},
			code:    "RUNNER_INGRESS_UNSUPPORTED",
			message: `Environment driver "plugin" does not support runner ingress.`,
			reasons: []string{"operation_unsupported_by_driver"},
			caps:    map[string]bool{"runnerWebSocketIngress": true, "duplexCommandStream": true},
		},
	})
}

// TestReasons covers every reason code of docs/contract.md, "Precise rules" (except evaluation_failed, which the oracle
// cannot produce) and the identity-check order.
func TestReasons(t *testing.T) {
	runRows(t, []row{
		// Step 2 / step 3 reasons are alone.
		{
			name:    "driver_not_registered case-sensitive Sandbox",
			change:  func(t testing.TB, req, _ map[string]any) { mdOf(t, req)["driver"] = "Sandbox" },
			code:    "ENVIRONMENT_DRIVER_NOT_REGISTERED",
			message: `Environment driver "Sandbox" is not registered in the environment runtime yet.`,
			reasons: []string{"driver_not_registered"}, caps: allCaps(false),
		},
		{
			name: "driver_not_registered for getRunnerIngressEndpoint",
			change: func(t testing.TB, req, _ map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				mdOf(t, req)["driver"] = "docker"
			},
			code:    "ENVIRONMENT_DRIVER_NOT_REGISTERED",
			message: `Environment driver "docker" is not registered in the environment runtime yet.`,
			reasons: []string{"driver_not_registered"}, caps: allCaps(false),
		},
		{
			name:    "operation_unsupported_by_driver ssh duplex",
			change:  func(t testing.TB, req, _ map[string]any) { mdOf(t, req)["driver"] = "ssh" },
			code:    "DUPLEX_CHANNEL_UNSUPPORTED",
			message: `Environment driver "ssh" does not support duplex channels.`,
			reasons: []string{"operation_unsupported_by_driver"}, caps: allCaps(false),
		},
		{
			name: "capability_unsupported_by_driver local runner ingress (capability before support)",
			change: func(t testing.TB, req, _ map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				mdOf(t, req)["driver"] = "local"
			},
			code: ingDenied, message: ingDeniedMsg,
			reasons: []string{"capability_unsupported_by_driver"}, caps: allCaps(false),
		},
		{
			name: "capability_unsupported_by_driver ssh runner ingress",
			change: func(t testing.TB, req, _ map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				mdOf(t, req)["driver"] = "ssh"
			},
			code: ingDenied, message: ingDeniedMsg,
			reasons: []string{"capability_unsupported_by_driver"}, caps: allCaps(false),
		},
		{
			name: "plugin driver runner ingress capability denied before support",
			change: func(t testing.TB, req, _ map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
			},
			code: ingDenied, message: ingDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
		},
		// Identity: no_provider.
		{
			name: "no_provider: no metadata provider, no config provider",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "provider")
				delete(obj(t, envOf(t, req)["config"]), "provider")
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"no_provider"}, caps: allCaps(false),
		},
		{
			name: "no_provider: config fallback only when environment.driver is exactly sandbox",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "provider")
				envOf(t, req)["driver"] = "Sandbox"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"no_provider"}, caps: allCaps(false),
		},
		{
			name: "no_provider: environment.config not an object",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "provider")
				envOf(t, req)["config"] = "daytona"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"no_provider"}, caps: allCaps(false),
		},
		{
			name: "no_provider: empty providers everywhere",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["provider"] = ""
				obj(t, envOf(t, req)["config"])["provider"] = ""
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"no_provider"}, caps: allCaps(false),
		},
		{
			name: "no_provider comes before plugin_not_pinned",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "provider")
				delete(mdOf(t, req), "pluginId")
				envOf(t, req)["driver"] = "local"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"no_provider"}, caps: allCaps(false),
		},
		// Identity: plugin_not_pinned.
		{
			name:   "plugin_not_pinned: no pluginId",
			change: func(t testing.TB, req, _ map[string]any) { delete(mdOf(t, req), "pluginId") },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_pinned"}, caps: allCaps(false),
		},
		{
			name:   "plugin_not_pinned: empty pluginId",
			change: func(t testing.TB, req, _ map[string]any) { mdOf(t, req)["pluginId"] = "" },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_pinned"}, caps: allCaps(false),
		},
		{
			name:   "plugin_not_pinned: numeric pluginId",
			change: func(t testing.TB, req, _ map[string]any) { mdOf(t, req)["pluginId"] = json.Number("1") },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_pinned"}, caps: allCaps(false),
		},
		{
			name: "plugin_not_pinned: plugin driver without driverKey",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_pinned"}, caps: allCaps(false),
		},
		{
			name: "plugin_not_pinned: plugin driver without pluginId",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				delete(mdOf(t, req), "pluginId")
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_pinned"}, caps: allCaps(false),
		},
		// Identity: plugin_not_found.
		{
			name:   "plugin_not_found: other id",
			change: func(t testing.TB, req, _ map[string]any) { mdOf(t, req)["pluginId"] = "Test.plugin" },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_found"}, caps: allCaps(false),
		},
		{
			name: "plugin_not_found: never another plugin declaring the same key",
			change: func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["pluginId"] = "other.plugin"
				f["plugins"] = append(f["plugins"].([]any), map[string]any{"id": "impostor", "status": "ready",
					"manifest": manifestOf(t, f)})
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_found"}, caps: allCaps(false),
		},
		{
			name: "plugin_not_ready: never read from another ready plugin declaring the same key",
			change: func(t testing.TB, _, f map[string]any) {
				pluginOf(t, f)["status"] = "error"
				f["plugins"] = append(f["plugins"].([]any), map[string]any{"id": "other.plugin", "status": "ready",
					"manifest": manifestOf(t, f)})
				obj(t, f["workers"])["other.plugin"] = map[string]any{"supportedMethods": allMethods}
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_ready"}, caps: allCaps(false),
		},
		{
			name: "declaration read from the pinned plugin only",
			change: func(t testing.TB, _, f map[string]any) {
				delete(declOf(t, f), "duplexCommandStream")
				f["plugins"] = append(f["plugins"].([]any), map[string]any{"id": "other.plugin", "status": "ready",
					"manifest": decodeJSON(t, `{"environmentDrivers":[{"driverKey":"daytona","kind":"sandbox_provider","sandboxCapabilities":{"duplexCommandStream":true}}]}`)})
				obj(t, f["workers"])["other.plugin"] = map[string]any{"supportedMethods": allMethods}
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"}, caps: allCaps(false),
		},
		{
			name:   "plugin_not_found: no plugins key",
			change: func(t testing.TB, _, f map[string]any) { delete(f, "plugins") },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_found"}, caps: allCaps(false),
		},
		// Identity: plugin_not_ready.
		{
			name:   "plugin_not_ready: Ready",
			change: func(t testing.TB, _, f map[string]any) { pluginOf(t, f)["status"] = "Ready" },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_ready"}, caps: allCaps(false),
		},
		{
			name:   "plugin_not_ready: status absent",
			change: func(t testing.TB, _, f map[string]any) { delete(pluginOf(t, f), "status") },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_ready"}, caps: allCaps(false),
		},
		{
			name: "plugin_not_ready before driver_entry_invalid",
			change: func(t testing.TB, _, f map[string]any) {
				pluginOf(t, f)["status"] = "upgrade_pending"
				entryOf(t, f)["sandboxCapabilities"] = nil
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_ready"}, caps: allCaps(false),
		},
		{
			name: "plugin_not_ready on the plugin driver",
			change: func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				pluginOf(t, f)["status"] = "installed"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"plugin_not_ready"}, caps: allCaps(false),
		},
		// Identity: driver_entry_invalid.
		{
			name:   "driver_entry_invalid: sandboxCapabilities null",
			change: func(t testing.TB, _, f map[string]any) { entryOf(t, f)["sandboxCapabilities"] = nil },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_invalid"}, caps: allCaps(false),
		},
		{
			name:   "driver_entry_invalid: sandboxCapabilities array",
			change: func(t testing.TB, _, f map[string]any) { entryOf(t, f)["sandboxCapabilities"] = []any{} },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_invalid"}, caps: allCaps(false),
		},
		{
			name: "driver_entry_invalid: two entries with the key, different kinds",
			change: func(t testing.TB, _, f map[string]any) {
				m := manifestOf(t, f)
				m["environmentDrivers"] = append(m["environmentDrivers"].([]any),
					map[string]any{"driverKey": "daytona", "kind": "environment_driver"})
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_invalid"}, caps: allCaps(false),
		},
		{
			name: "driver_entry_invalid checked before kind",
			change: func(t testing.TB, _, f map[string]any) {
				entryOf(t, f)["kind"] = "environment_driver"
				entryOf(t, f)["sandboxCapabilities"] = "yes"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_invalid"}, caps: allCaps(false),
		},
		{
			name: "driver_entry_invalid on the plugin driver (duplicate key)",
			change: func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				m := manifestOf(t, f)
				m["environmentDrivers"] = append(m["environmentDrivers"].([]any),
					map[string]any{"driverKey": "daytona", "kind": "sandbox_provider"})
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_invalid"}, caps: allCaps(false),
		},
		// Identity: driver_entry_missing.
		{
			name:   "driver_entry_missing: no manifest",
			change: func(t testing.TB, _, f map[string]any) { delete(pluginOf(t, f), "manifest") },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}, caps: allCaps(false),
		},
		{
			name:   "driver_entry_missing: manifest null",
			change: func(t testing.TB, _, f map[string]any) { pluginOf(t, f)["manifest"] = nil },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}, caps: allCaps(false),
		},
		{
			name:   "driver_entry_missing: environmentDrivers not an array",
			change: func(t testing.TB, _, f map[string]any) { manifestOf(t, f)["environmentDrivers"] = map[string]any{} },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}, caps: allCaps(false),
		},
		{
			name: "driver_entry_missing: entries not objects are skipped",
			change: func(t testing.TB, _, f map[string]any) {
				manifestOf(t, f)["environmentDrivers"] = []any{"daytona", nil, json.Number("1")}
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}, caps: allCaps(false),
		},
		{
			name:   "driver_entry_missing: driverKey differs in case",
			change: func(t testing.TB, _, f map[string]any) { entryOf(t, f)["driverKey"] = "Daytona" },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}, caps: allCaps(false),
		},
		{
			name:   "driver_entry_missing: kind absent",
			change: func(t testing.TB, _, f map[string]any) { delete(entryOf(t, f), "kind") },
			code:   capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}, caps: allCaps(false),
		},
		{
			name: "driver_entry_missing on the plugin driver",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "e2b"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"driver_entry_missing"}, caps: allCaps(false),
		},
		// Identity: builtin_provider_unknown.
		{
			name: "builtin_provider_unknown",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["sandboxProviderPlugin"] = "true" // not the literal true: built-in path
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"builtin_provider_unknown"}, caps: allCaps(false),
		},
		{
			name: "builtin_provider_unknown: no builtinProviders",
			change: func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["provider"] = "fake"
				delete(mdOf(t, req), "sandboxProviderPlugin")
				delete(f, "builtinProviders")
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"builtin_provider_unknown"}, caps: allCaps(false),
		},
		// Capability reasons after identity passed.
		{
			name: "worker_not_running with capability_not_declared",
			change: func(t testing.TB, _, f map[string]any) {
				delete(obj(t, f["workers"]), "test.plugin")
				delete(declOf(t, f), "duplexCommandStream")
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"worker_not_running", "capability_not_declared"}, caps: allCaps(false),
		},
		{
			name: "worker_not_running on the plugin driver",
			change: func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				delete(f, "workers")
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"worker_not_running"}, caps: allCaps(false),
		},
		{
			name: "worker present for another plugin only",
			change: func(t testing.TB, _, f map[string]any) {
				f["workers"] = map[string]any{"other.plugin": map[string]any{"supportedMethods": allMethods}}
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"worker_not_running"}, caps: allCaps(false),
		},
		{
			name: "method_not_verified: supportedMethods absent",
			change: func(t testing.TB, _, f map[string]any) {
				delete(workerOf(t, f), "supportedMethods")
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"method_not_verified"}, caps: allCaps(false),
		},
		{
			name: "method_not_verified: supportedMethods a string",
			change: func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = "duplexChannelOpen"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"method_not_verified"}, caps: allCaps(false),
		},
		{
			name: "method_not_verified: only non-string elements",
			change: func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = []any{[]any{"duplexChannelOpen"}, nil, true}
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"method_not_verified"}, caps: allCaps(false),
		},
		{
			name: "method_not_verified, capability_not_declared, capability_narrowed together",
			change: func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = []any{}
				workerOf(t, f)["configValid"] = false
				declOf(t, f)["duplexCommandStream"] = false
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared", "capability_narrowed"},
			caps:    allCaps(false),
		},
		{
			name: "capability_not_declared: declared false",
			change: func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["duplexCommandStream"] = false
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"}, caps: allCaps(false),
		},
		{
			name: "capability_not_declared: declared null (opt-in)",
			change: func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["duplexCommandStream"] = nil
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"}, caps: allCaps(false),
		},
		{
			name: "capability_not_declared: declared 1",
			change: func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["duplexCommandStream"] = json.Number("1")
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"}, caps: allCaps(false),
		},
		{
			name: "capability_narrowed: configValid null",
			change: func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["configValid"] = nil
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_narrowed"}, caps: allCaps(false),
		},
		{
			name: "capability_narrowed: configValid string true",
			change: func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["configValid"] = "true"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_narrowed"}, caps: allCaps(false),
		},
		{
			name: "runner ingress on sandbox: worker_not_running, capability_not_declared",
			change: func(t testing.TB, req, f map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				delete(obj(t, f["workers"]), "test.plugin")
			},
			code: ingDenied, message: ingDeniedMsg,
			reasons: []string{"worker_not_running", "capability_not_declared"}, caps: allCaps(false),
		},
		{
			name: "runner ingress never narrowed by config failure",
			change: func(t testing.TB, req, f map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				workerOf(t, f)["configValid"] = false
				declOf(t, f)["runnerWebSocketIngress"] = "yes"
			},
			code: ingDenied, message: ingDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
		},
	})
}

// TestGrants covers grants on each path and the second operation.
func TestGrants(t *testing.T) {
	runRows(t, []row{
		{
			name: "runner ingress granted on the plugin-backed sandbox path",
			change: func(t testing.TB, req, f map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				workerOf(t, f)["supportedMethods"] = []any{"environmentRunnerIngressEndpoint"}
				declOf(t, f)["runnerWebSocketIngress"] = true
			},
			allow: true,
			caps:  map[string]bool{"runnerWebSocketIngress": true, "duplexCommandStream": false},
		},
		{
			name: "runner ingress granted despite config failure",
			change: func(t testing.TB, req, f map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				workerOf(t, f)["supportedMethods"] = []any{"environmentRunnerIngressEndpoint", "duplexChannelOpen"}
				workerOf(t, f)["configValid"] = false
				declOf(t, f)["runnerWebSocketIngress"] = true
			},
			allow: true,
			caps:  map[string]bool{"runnerWebSocketIngress": true, "duplexCommandStream": false},
		},
		{
			name: "duplex on the plugin driver, any kind, configValid ignored",
			change: func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				entryOf(t, f)["kind"] = "environment_driver"
				workerOf(t, f)["configValid"] = false
			},
			allow: true,
			caps:  map[string]bool{"duplexCommandStream": true},
		},
		{
			name: "plugin driver with an unlisted kind",
			change: func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				entryOf(t, f)["kind"] = "whatever"
			},
			allow: true,
		},
		{
			name: "configValid absent means valid",
			change: func(t testing.TB, _, f map[string]any) {
				delete(workerOf(t, f), "configValid")
			},
			allow: true,
		},
		{
			name: "provider from environment.config when metadata has none",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "provider")
			},
			allow: true,
		},
		{
			name: "empty metadata provider falls back to config",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["provider"] = ""
			},
			allow: true,
		},
		{
			name: "metadata provider wins over config",
			change: func(t testing.TB, req, _ map[string]any) {
				obj(t, envOf(t, req)["config"])["provider"] = "other"
			},
			allow: true,
		},
		{
			name: "unknown extra fields ignored",
			change: func(t testing.TB, req, f map[string]any) {
				req["extra"] = []any{1.5}
				mdOf(t, req)["extra"] = nil
				f["extra"] = "x"
				pluginOf(t, f)["extra"] = true
			},
			allow: true,
		},
		{
			name: "operation absent defaults to openDuplexChannel",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(req, "operation")
			},
			allow: true,
		},
	})
}

// TestDriverResolution covers docs/contract.md, "The decision, in order" step 1 and docs/contract.md, "Precise rules" "Driver and provider".
func TestDriverResolution(t *testing.T) {
	unsupported := func(d string) string {
		return `Environment driver "` + d + `" does not support duplex channels.`
	}
	runRows(t, []row{
		{
			name:   "lease driver wins over environment driver",
			change: func(t testing.TB, req, _ map[string]any) { envOf(t, req)["driver"] = "local" },
			allow:  true,
		},
		{
			name: "empty lease driver falls back to environment driver",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = ""
				envOf(t, req)["driver"] = "ssh"
			},
			code: "DUPLEX_CHANNEL_UNSUPPORTED", message: unsupported("ssh"),
			reasons: []string{"operation_unsupported_by_driver"},
		},
		{
			name: "non-string lease driver ignored",
			change: func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = json.Number("7")
				envOf(t, req)["driver"] = "local"
			},
			code: "DUPLEX_CHANNEL_UNSUPPORTED", message: unsupported("local"),
			reasons: []string{"operation_unsupported_by_driver"},
		},
		{
			name: "no driver anywhere means sandbox",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "driver")
				delete(envOf(t, req), "driver")
			},
			allow: true,
		},
		{
			name: "empty environment driver means sandbox; no config fallback",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "driver")
				delete(mdOf(t, req), "provider")
				envOf(t, req)["driver"] = ""
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"no_provider"},
		},
		{
			name: "environment driver null means sandbox",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "driver")
				envOf(t, req)["driver"] = nil
			},
			allow: true,
		},
		{
			name: "absent environment and lease",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(req, "environment")
				delete(req, "lease")
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"no_provider"}, caps: allCaps(false),
		},
		{
			name: "absent lease metadata",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(leaseOf(t, req), "metadata")
			},
			// driver sandbox from environment, provider daytona from config, built-in path.
			code: capDenied, message: capDeniedMsg, reasons: []string{"builtin_provider_unknown"}, caps: allCaps(false),
		},
	})
}

// TestCapabilities covers docs/contract.md, "The nine capabilities" and "Resolving the snapshot": verification, declaration (incl. legacy) and narrowing.
func TestCapabilities(t *testing.T) {
	fullPlugin := func(t testing.TB, req, f map[string]any) {
		workerOf(t, f)["supportedMethods"] = allMethods
		decl := declOf(t, f)
		for _, k := range specoracle.CapabilityKeys {
			decl[k] = true
		}
		leaseOf(t, req)["leasePolicy"] = "reuse_by_environment"
	}
	then := func(a, b change) change {
		return func(t testing.TB, req, f map[string]any) { a(t, req, f); b(t, req, f) }
	}
	builtin := func(execute, reuse any) change {
		return func(t testing.TB, req, f map[string]any) {
			md := mdOf(t, req)
			md["provider"] = "fake"
			delete(md, "sandboxProviderPlugin")
			f["builtinProviders"] = map[string]any{"fake": map[string]any{"execute": execute, "supportsReusableLeases": reuse}}
			leaseOf(t, req)["leasePolicy"] = "reuse_by_environment"
		}
	}
	caps := func(trueKeys ...string) map[string]bool {
		m := allCaps(false)
		for _, k := range trueKeys {
			m[k] = true
		}
		return m
	}
	without := func(keys ...string) map[string]bool {
		m := allCaps(true)
		for _, k := range keys {
			m[k] = false
		}
		return m
	}
	runRows(t, []row{
		{
			name: "ordinary keys need no declaration; opt-in keys do",
			change: func(t testing.TB, req, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = allMethods
				entryOf(t, f)["sandboxCapabilities"] = map[string]any{}
				leaseOf(t, req)["leasePolicy"] = "reuse_by_environment"
			},
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"},
			caps: caps("reusableLeases", "nativeSyncIn", "nativeSyncOut", "persistentProcessSessions", "independentControlCommands"),
		},
		{
			name: "declaration false takes away an ordinary key",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["independentControlCommands"] = false
				declOf(t, f)["nativeSyncIn"] = "true"
			}),
			allow: true, caps: without("independentControlCommands", "nativeSyncIn"),
		},
		{
			name: "declaration never grants what was not verified",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = []any{"duplexChannelOpen", "environmentSyncIn", "environmentResumeLease", "environmentReleaseLease"}
			}),
			allow: true, caps: caps("duplexCommandStream", "nativeSyncIn"),
		},
		{
			name: "concurrentSyncOperations needs both sync methods",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["supportedMethods"] = []any{"duplexChannelOpen", "environmentSyncOut"}
			}),
			allow: true, caps: caps("duplexCommandStream", "nativeSyncOut"),
		},
		{
			name: "narrowing: leasePolicy ephemeral removes reusableLeases",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				leaseOf(t, req)["leasePolicy"] = "ephemeral"
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name: "narrowing: leasePolicy reuse_by_execution_workspace removes reusableLeases",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				leaseOf(t, req)["leasePolicy"] = "reuse_by_execution_workspace"
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name: "narrowing: leasePolicy absent or unknown removes reusableLeases, not an error",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				leaseOf(t, req)["leasePolicy"] = "Reuse_By_Environment"
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name: "narrowing: backend job removes native sync (not concurrentSyncOperations)",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["backend"] = "job"
			}),
			allow: true, caps: without("nativeSyncIn", "nativeSyncOut"),
		},
		{
			name: "narrowing: backend Job is not job",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["backend"] = "Job"
			}),
			allow: true, caps: allCaps(true),
		},
		{
			name: "narrowing: nativeFileSyncUnsupported true",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["nativeFileSyncUnsupported"] = true
			}),
			allow: true, caps: without("nativeSyncIn", "nativeSyncOut"),
		},
		{
			name: "narrowing: nativeFileSyncUnsupported string true is not true",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["nativeFileSyncUnsupported"] = "true"
			}),
			allow: true, caps: allCaps(true),
		},
		{
			name: "narrowing: config failure removes persistent, incremental, duplex only",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				workerOf(t, f)["configValid"] = false
			}),
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_narrowed"},
			caps: without("persistentProcessSessions", "incrementalSessionOutput", "duplexCommandStream"),
		},
		{
			name: "plugin driver: config not consulted, narrowing by metadata applies",
			change: then(fullPlugin, func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				mdOf(t, req)["backend"] = "job"
				leaseOf(t, req)["leasePolicy"] = "retain_on_failure"
				workerOf(t, f)["configValid"] = false
			}),
			allow: true, caps: without("nativeSyncIn", "nativeSyncOut", "reusableLeases"),
		},
		{
			name: "legacy supportsReusableLeases false stands for absent reusableLeases",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				delete(declOf(t, f), "reusableLeases")
				entryOf(t, f)["supportsReusableLeases"] = false
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name: "legacy applies when nested reusableLeases is null",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["reusableLeases"] = nil
				entryOf(t, f)["supportsReusableLeases"] = false
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name: "legacy ignored when nested reusableLeases is a boolean",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["reusableLeases"] = true
				entryOf(t, f)["supportsReusableLeases"] = false
			}),
			allow: true, caps: allCaps(true),
		},
		{
			name: "legacy ignored when nested reusableLeases is invalid (nested invalid wins)",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				declOf(t, f)["reusableLeases"] = "yes"
				entryOf(t, f)["supportsReusableLeases"] = true
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name: "legacy null counts as absent",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				delete(declOf(t, f), "reusableLeases")
				entryOf(t, f)["supportsReusableLeases"] = nil
			}),
			allow: true, caps: allCaps(true),
		},
		{
			name: "legacy non-boolean is used and counts false",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				delete(declOf(t, f), "reusableLeases")
				entryOf(t, f)["supportsReusableLeases"] = "true"
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name: "legacy applies when sandboxCapabilities is absent",
			change: then(fullPlugin, func(t testing.TB, _, f map[string]any) {
				delete(entryOf(t, f), "sandboxCapabilities")
				entryOf(t, f)["supportsReusableLeases"] = false
			}),
			code: capDenied, message: capDeniedMsg, reasons: []string{"capability_not_declared"},
			caps: caps("nativeSyncIn", "nativeSyncOut", "persistentProcessSessions", "independentControlCommands"),
		},
		{
			name: "legacy applies on the plugin driver",
			change: then(fullPlugin, func(t testing.TB, req, f map[string]any) {
				mdOf(t, req)["driver"] = "plugin"
				mdOf(t, req)["driverKey"] = "daytona"
				delete(declOf(t, f), "reusableLeases")
				entryOf(t, f)["supportsReusableLeases"] = false
			}),
			allow: true, caps: without("reusableLeases"),
		},
		{
			name:   "built-in: execute and reuse verified, reuse declared true",
			change: builtin(true, true),
			code:   capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
			caps:    caps("reusableLeases", "persistentProcessSessions", "independentControlCommands"),
		},
		{
			name: "built-in: narrowing applies (ephemeral)",
			change: then(builtin(true, true), func(t testing.TB, req, _ map[string]any) {
				leaseOf(t, req)["leasePolicy"] = "ephemeral"
			}),
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
			caps:    caps("persistentProcessSessions", "independentControlCommands"),
		},
		{
			name:   "built-in: string values are not true",
			change: builtin("true", "true"),
			code:   capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
			caps:    allCaps(false),
		},
		{
			name: "built-in: provider object empty",
			change: then(builtin(nil, nil), func(t testing.TB, _, f map[string]any) {
				f["builtinProviders"] = map[string]any{"fake": map[string]any{}}
			}),
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
			caps:    allCaps(false),
		},
		{
			name: "built-in: config failure never applies",
			change: then(builtin(true, false), func(t testing.TB, _, f map[string]any) {
				f["workers"] = map[string]any{"fake": map[string]any{"configValid": false}}
			}),
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
			caps:    caps("persistentProcessSessions", "independentControlCommands"),
		},
		{
			name: "built-in via environment.config provider",
			change: func(t testing.TB, req, _ map[string]any) {
				delete(mdOf(t, req), "sandboxProviderPlugin")
				delete(mdOf(t, req), "provider")
				obj(t, envOf(t, req)["config"])["provider"] = "fake"
			},
			code: capDenied, message: capDeniedMsg,
			reasons: []string{"method_not_verified", "capability_not_declared"},
			caps:    caps("persistentProcessSessions", "independentControlCommands"),
		},
		{
			name: "local gives all false even with everything verified",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				req["operation"] = "getRunnerIngressEndpoint"
				mdOf(t, req)["driver"] = "local"
			}),
			code: ingDenied, message: ingDeniedMsg, reasons: []string{"capability_unsupported_by_driver"},
			caps: allCaps(false),
		},
		{
			name: "unregistered gives all false even with everything verified",
			change: then(fullPlugin, func(t testing.TB, req, _ map[string]any) {
				mdOf(t, req)["driver"] = "daytona"
			}),
			code:    "ENVIRONMENT_DRIVER_NOT_REGISTERED",
			message: `Environment driver "daytona" is not registered in the environment runtime yet.`,
			reasons: []string{"driver_not_registered"}, caps: allCaps(false),
		},
	})
}

// TestMessageTemplates checks docs/contract.md, "Codes and messages": the driver name is inserted as given, inside double quotes.
func TestMessageTemplates(t *testing.T) {
	for _, driver := range []string{"local", "ssh", "foo", "Sandbox", " sandbox", `we"ird\name`, "ünïcødé", "a\nb"} {
		t.Run(driver, func(t *testing.T) {
			req, facts := fixture(t)
			mdOf(t, req)["driver"] = driver
			d, err := specoracle.Decide(req, facts)
			require.NoError(t, err)
			assertInvariants(t, d)
			switch driver {
			case "local", "ssh":
				assert.Equal(t, "DUPLEX_CHANNEL_UNSUPPORTED", d.Code)
				assert.Equal(t, "Environment driver \""+driver+"\" does not support duplex channels.", d.Message)
			default:
				assert.Equal(t, "ENVIRONMENT_DRIVER_NOT_REGISTERED", d.Code)
				assert.Equal(t, "Environment driver \""+driver+"\" is not registered in the environment runtime yet.", d.Message)
			}
		})
	}
	t.Run("runner ingress unsupported names plugin", func(t *testing.T) {
		req, facts := fixture(t)
		req["operation"] = "getRunnerIngressEndpoint"
		mdOf(t, req)["driver"] = "plugin"
		mdOf(t, req)["driverKey"] = "daytona"
		workerOf(t, facts)["supportedMethods"] = []any{"environmentRunnerIngressEndpoint"}
		declOf(t, facts)["runnerWebSocketIngress"] = true
		d, err := specoracle.Decide(req, facts)
		require.NoError(t, err)
		assert.Equal(t, `Environment driver "plugin" does not support runner ingress.`, d.Message)
	})
	t.Run("constants", func(t *testing.T) {
		assert.Equal(t, "Sandbox lease does not grant the duplex command stream capability.", capDeniedMsg)
		assert.Equal(t, "Sandbox lease does not grant runner WebSocket ingress.", ingDeniedMsg)
	})
}

// TestBadRequest covers docs/contract.md, "The request" and docs/contract.md, "Precise rules" "Request shape".
func TestBadRequest(t *testing.T) {
	tests := []struct {
		name    string
		request func(t testing.TB) any
	}{
		{name: "null", request: func(testing.TB) any { return nil }},
		{name: "string", request: func(testing.TB) any { return "{}" }},
		{name: "array", request: func(testing.TB) any { return []any{} }},
		{name: "number", request: func(testing.TB) any { return json.Number("1") }},
		{name: "float", request: func(testing.TB) any { return 1.0 }},
		{name: "bool", request: func(testing.TB) any { return true }},
	}
	mutate := func(f func(t testing.TB, req map[string]any)) func(t testing.TB) any {
		return func(t testing.TB) any {
			req, _ := fixture(t)
			f(t, req)
			return req
		}
	}
	for _, c := range []struct {
		name string
		f    func(t testing.TB, req map[string]any)
	}{
		{"environment null", func(_ testing.TB, r map[string]any) { r["environment"] = nil }},
		{"environment string", func(_ testing.TB, r map[string]any) { r["environment"] = "env-1" }},
		{"environment array", func(_ testing.TB, r map[string]any) { r["environment"] = []any{} }},
		{"lease null", func(_ testing.TB, r map[string]any) { r["lease"] = nil }},
		{"lease number", func(_ testing.TB, r map[string]any) { r["lease"] = json.Number("3") }},
		{"lease.metadata null", func(t testing.TB, r map[string]any) { leaseOf(t, r)["metadata"] = nil }},
		{"lease.metadata string", func(t testing.TB, r map[string]any) { leaseOf(t, r)["metadata"] = "{}" }},
		{"lease.metadata array", func(t testing.TB, r map[string]any) { leaseOf(t, r)["metadata"] = []any{} }},
		{"operation null", func(_ testing.TB, r map[string]any) { r["operation"] = nil }},
		{"operation empty", func(_ testing.TB, r map[string]any) { r["operation"] = "" }},
		{"operation wrong case", func(_ testing.TB, r map[string]any) { r["operation"] = "OpenDuplexChannel" }},
		{"operation unknown", func(_ testing.TB, r map[string]any) { r["operation"] = "exec" }},
		{"operation number", func(_ testing.TB, r map[string]any) { r["operation"] = json.Number("1") }},
		{"operation array", func(_ testing.TB, r map[string]any) { r["operation"] = []any{"openDuplexChannel"} }},
	} {
		tests = append(tests, struct {
			name    string
			request func(t testing.TB) any
		}{name: c.name, request: mutate(c.f)})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, facts := fixture(t)
			_, err := specoracle.Decide(tc.request(t), facts)
			require.Error(t, err)
			assert.ErrorIs(t, err, specoracle.ErrBadRequest)
			assert.NotErrorIs(t, err, specoracle.ErrBadFacts)

			// When both are bad, the request is reported.
			_, err = specoracle.Decide(tc.request(t), "not facts")
			assert.ErrorIs(t, err, specoracle.ErrBadRequest)
			assert.NotErrorIs(t, err, specoracle.ErrBadFacts)
		})
	}
}

// TestNotBadRequest covers values docs/contract.md, "Precise rules" says are not errors.
func TestNotBadRequest(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(t testing.TB, r map[string]any)
	}{
		{"empty object", func(t testing.TB, r map[string]any) {
			for k := range r {
				delete(r, k)
			}
		}},
		{"environment.config not an object", func(t testing.TB, r map[string]any) { envOf(t, r)["config"] = nil }},
		{"leasePolicy unknown", func(t testing.TB, r map[string]any) { leaseOf(t, r)["leasePolicy"] = json.Number("5") }},
		{"command not checked", func(_ testing.TB, r map[string]any) { r["command"] = nil }},
		{"companyId not checked", func(t testing.TB, r map[string]any) { leaseOf(t, r)["companyId"] = nil }},
		{"metadata driver wrong type", func(t testing.TB, r map[string]any) { mdOf(t, r)["driver"] = map[string]any{} }},
		{"operation getRunnerIngressEndpoint", func(_ testing.TB, r map[string]any) { r["operation"] = "getRunnerIngressEndpoint" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, facts := fixture(t)
			tc.f(t, req)
			d, err := specoracle.Decide(req, facts)
			require.NoError(t, err)
			assertInvariants(t, d)
		})
	}
}

// TestBadFacts covers docs/contract.md, "Precise rules" "Facts file" and the null rule of "Remaining edge values".
func TestBadFacts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		facts func(t testing.TB, f map[string]any) any
	}{
		{"null", func(testing.TB, map[string]any) any { return nil }},
		{"array", func(testing.TB, map[string]any) any { return []any{} }},
		{"string", func(testing.TB, map[string]any) any { return "{}" }},
		{"number", func(testing.TB, map[string]any) any { return 2.0 }},
		{"plugins null", func(_ testing.TB, f map[string]any) any { f["plugins"] = nil; return f }},
		{"plugins object", func(_ testing.TB, f map[string]any) any { f["plugins"] = map[string]any{}; return f }},
		{"plugins element not object", func(_ testing.TB, f map[string]any) any {
			f["plugins"] = append(f["plugins"].([]any), "p")
			return f
		}},
		{"plugins element null", func(_ testing.TB, f map[string]any) any {
			f["plugins"] = append(f["plugins"].([]any), nil)
			return f
		}},
		{"plugin id absent", func(t testing.TB, f map[string]any) any { delete(pluginOf(t, f), "id"); return f }},
		{"plugin id empty", func(t testing.TB, f map[string]any) any { pluginOf(t, f)["id"] = ""; return f }},
		{"plugin id number", func(t testing.TB, f map[string]any) any { pluginOf(t, f)["id"] = json.Number("1"); return f }},
		{"plugin id null", func(t testing.TB, f map[string]any) any { pluginOf(t, f)["id"] = nil; return f }},
		{"duplicate plugin id", func(_ testing.TB, f map[string]any) any {
			f["plugins"] = append(f["plugins"].([]any), map[string]any{"id": "test.plugin", "status": "disabled"})
			return f
		}},
		{"workers null", func(_ testing.TB, f map[string]any) any { f["workers"] = nil; return f }},
		{"workers array", func(_ testing.TB, f map[string]any) any { f["workers"] = []any{}; return f }},
		{"worker value null", func(_ testing.TB, f map[string]any) any {
			f["workers"] = map[string]any{"test.plugin": nil}
			return f
		}},
		{"worker value array", func(_ testing.TB, f map[string]any) any {
			f["workers"] = map[string]any{"test.plugin": []any{"duplexChannelOpen"}}
			return f
		}},
		{"unrelated worker value not object", func(t testing.TB, f map[string]any) any {
			obj(t, f["workers"])["other"] = true
			return f
		}},
		{"builtinProviders null", func(_ testing.TB, f map[string]any) any { f["builtinProviders"] = nil; return f }},
		{"builtinProviders string", func(_ testing.TB, f map[string]any) any { f["builtinProviders"] = "fake"; return f }},
		{"builtin provider value not object", func(_ testing.TB, f map[string]any) any {
			f["builtinProviders"] = map[string]any{"fake": true}
			return f
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, facts := fixture(t)
			_, err := specoracle.Decide(req, tc.facts(t, facts))
			require.Error(t, err)
			assert.ErrorIs(t, err, specoracle.ErrBadFacts)
			assert.NotErrorIs(t, err, specoracle.ErrBadRequest)
		})
	}
}

// TestFactsNotMalformed covers facts values that are not malformed (docs/contract.md, "Precise rules" "Remaining edge values").
func TestFactsNotMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(t testing.TB, f map[string]any)
	}{
		{"empty object", func(_ testing.TB, f map[string]any) {
			for k := range f {
				delete(f, k)
			}
		}},
		{"empty collections", func(_ testing.TB, f map[string]any) {
			f["plugins"], f["workers"], f["builtinProviders"] = []any{}, map[string]any{}, map[string]any{}
		}},
		{"unlisted status", func(t testing.TB, f map[string]any) { pluginOf(t, f)["status"] = "weird" }},
		{"status not a string", func(t testing.TB, f map[string]any) { pluginOf(t, f)["status"] = true }},
		{"manifest not an object", func(t testing.TB, f map[string]any) { pluginOf(t, f)["manifest"] = "x" }},
		{"unlisted kind", func(t testing.TB, f map[string]any) { entryOf(t, f)["kind"] = "weird" }},
		{"supportedMethods not array", func(t testing.TB, f map[string]any) { workerOf(t, f)["supportedMethods"] = nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, facts := fixture(t)
			tc.f(t, facts)
			d, err := specoracle.Decide(req, facts)
			require.NoError(t, err)
			assertInvariants(t, d)
			assert.False(t, d.Allow)
		})
	}
}

// TestNumberForms checks that json.Number and float64 decodings decide the same.
func TestNumberForms(t *testing.T) {
	const req = `{"operation":"openDuplexChannel","n":1.5,
	  "environment":{"driver":"sandbox","config":{"provider":"daytona","timeout":30}},
	  "lease":{"leasePolicy":7,"metadata":{"sandboxProviderPlugin":true,"pluginId":"test.plugin","provider":"daytona","backend":0}}}`
	const facts = `{"plugins":[{"id":"test.plugin","status":"ready","version":2,
	  "manifest":{"environmentDrivers":[1,{"driverKey":"daytona","kind":"sandbox_provider","sandboxCapabilities":{"duplexCommandStream":true,"reusableLeases":1}}]}}],
	  "workers":{"test.plugin":{"supportedMethods":["duplexChannelOpen",3],"configValid":true}},
	  "builtinProviders":{"fake":{"execute":1}}}`
	var rawReq, rawFacts any
	require.NoError(t, json.Unmarshal([]byte(req), &rawReq))
	require.NoError(t, json.Unmarshal([]byte(facts), &rawFacts))
	dFloat, err := specoracle.Decide(rawReq, rawFacts)
	require.NoError(t, err)
	dNumber, err := specoracle.Decide(decodeJSON(t, req), decodeJSON(t, facts))
	require.NoError(t, err)
	assert.Equal(t, dNumber, dFloat)
	assert.True(t, dFloat.Allow)
	assertInvariants(t, dFloat)
}

// TestDoesNotMutateInputs checks that Decide only reads its inputs.
func TestDoesNotMutateInputs(t *testing.T) {
	req, facts := fixture(t)
	delete(leaseOf(t, req), "metadata")
	delete(req, "environment")
	wantReq, wantFacts := fixture(t)
	delete(leaseOf(t, wantReq), "metadata")
	delete(wantReq, "environment")
	_, err := specoracle.Decide(req, facts)
	require.NoError(t, err)
	assert.Equal(t, wantReq, req)
	assert.Equal(t, wantFacts, facts)
}

// TestCapabilityKeys checks the exported key list (docs/contract.md, "The nine capabilities").
func TestCapabilityKeys(t *testing.T) {
	assert.Equal(t, []string{"reusableLeases", "nativeSyncIn", "nativeSyncOut", "persistentProcessSessions",
		"independentControlCommands", "incrementalSessionOutput", "concurrentSyncOperations",
		"duplexCommandStream", "runnerWebSocketIngress"}, specoracle.CapabilityKeys)
	assert.True(t, errors.Is(specoracle.ErrBadRequest, specoracle.ErrBadRequest))
	assert.False(t, errors.Is(specoracle.ErrBadRequest, specoracle.ErrBadFacts))
}
