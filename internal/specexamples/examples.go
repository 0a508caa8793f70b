// Package specexamples holds the examples of docs/contract.md, "Worked examples" as data: fixture F (sections 3 and 4)
// and one change per row, with the expected answer. Every face of the product (the engine, the
// CLI, the HTTP service) is tested against the same rows.
package specexamples

import (
	_ "embed"
	"encoding/json"

	"github.com/authz-dev/authz/internal/specoracle"
)

var (
	//go:embed request.json
	requestJSON []byte
	//go:embed facts.json
	factsJSON []byte
)

// Fixture is the contract's fixture F as decoded JSON, ready to be changed.
type Fixture struct {
	Request map[string]any
	Facts   map[string]any
}

// NewFixture returns a fresh copy of fixture F.
func NewFixture() Fixture {
	var f Fixture
	if err := json.Unmarshal(requestJSON, &f.Request); err != nil {
		panic(err)
	}
	if err := json.Unmarshal(factsJSON, &f.Facts); err != nil {
		panic(err)
	}
	return f
}

// Metadata is the request's lease.metadata.
func (f Fixture) Metadata() map[string]any {
	return f.Request["lease"].(map[string]any)["metadata"].(map[string]any)
}

// Plugin is the facts' only plugin, test.plugin.
func (f Fixture) Plugin() map[string]any { return f.Facts["plugins"].([]any)[0].(map[string]any) }

// Entry is test.plugin's only manifest entry.
func (f Fixture) Entry() map[string]any {
	return f.Plugin()["manifest"].(map[string]any)["environmentDrivers"].([]any)[0].(map[string]any)
}

// Worker is test.plugin's worker.
func (f Fixture) Worker() map[string]any {
	return f.Facts["workers"].(map[string]any)["test.plugin"].(map[string]any)
}

// JSON returns the request and the facts as JSON documents.
func (f Fixture) JSON() (request, facts []byte) {
	request, err := json.Marshal(f.Request)
	if err != nil {
		panic(err)
	}
	facts, err = json.Marshal(f.Facts)
	if err != nil {
		panic(err)
	}
	return request, facts
}

// Example is one row of docs/contract.md, "Worked examples".
type Example struct {
	Name    string
	Change  func(Fixture)
	Allow   bool
	Code    string
	Message string
	Reasons []string
	// Also holds the capabilities the row's "also" column (or this project) pins down.
	Also map[string]bool
}

// Fixture returns fixture F with the row's change applied.
func (e Example) Fixture() Fixture {
	f := NewFixture()
	e.Change(f)
	return f
}

const (
	capDenied    = "DUPLEX_CHANNEL_CAPABILITY_DENIED"
	capDeniedMsg = "Sandbox lease does not grant the duplex command stream capability."
)

// AllMethods are the worker methods that verify all nine capabilities.
var AllMethods = []any{"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease",
	"environmentSyncIn", "environmentSyncOut", "environmentExecute", "duplexChannelOpen",
	"environmentRunnerIngressEndpoint"}

// Rows are docs/contract.md, "Worked examples", rows 1 to 14.
func Rows() []Example {
	all := map[string]bool{}
	for _, k := range specoracle.CapabilityKeys {
		all[k] = true
	}
	return []Example{
		{Name: "01 fixture grants", Change: func(Fixture) {}, Allow: true,
			Also: map[string]bool{"duplexCommandStream": true, "persistentProcessSessions": false}},
		{Name: "02 no methods", Change: func(f Fixture) { f.Worker()["supportedMethods"] = []any{} },
			Code: capDenied, Message: capDeniedMsg, Reasons: []string{"method_not_verified"},
			Also: map[string]bool{"duplexCommandStream": false}},
		{Name: "03 no sandboxCapabilities (opt-in)", Change: func(f Fixture) { delete(f.Entry(), "sandboxCapabilities") },
			Code: capDenied, Message: capDeniedMsg, Reasons: []string{"capability_not_declared"}},
		{Name: "04 local driver", Change: func(f Fixture) { f.Metadata()["driver"] = "local" },
			Code: "DUPLEX_CHANNEL_UNSUPPORTED", Message: `Environment driver "local" does not support duplex channels.`,
			Reasons: []string{"operation_unsupported_by_driver"}, Also: map[string]bool{"duplexCommandStream": false}},
		{Name: "05 unknown driver", Change: func(f Fixture) { f.Metadata()["driver"] = "foo" },
			Code:    "ENVIRONMENT_DRIVER_NOT_REGISTERED",
			Message: `Environment driver "foo" is not registered in the environment runtime yet.`,
			Reasons: []string{"driver_not_registered"}},
		{Name: "06 plugin disabled", Change: func(f Fixture) { f.Plugin()["status"] = "disabled" },
			Code: capDenied, Message: capDeniedMsg, Reasons: []string{"plugin_not_ready"}},
		{Name: "07 entry kind environment_driver", Change: func(f Fixture) { f.Entry()["kind"] = "environment_driver" },
			Code: capDenied, Message: capDeniedMsg, Reasons: []string{"driver_entry_missing"}},
		{Name: "08 config not valid", Change: func(f Fixture) {
			f.Worker()["configValid"] = false
			f.Worker()["supportedMethods"] = []any{"duplexChannelOpen", "environmentExecute"}
		}, Code: capDenied, Message: capDeniedMsg, Reasons: []string{"capability_narrowed"},
			Also: map[string]bool{"persistentProcessSessions": false, "independentControlCommands": true}},
		{Name: "09 job backend", Change: func(f Fixture) {
			f.Metadata()["backend"] = "job"
			f.Worker()["supportedMethods"] = []any{"duplexChannelOpen", "environmentSyncIn"}
		}, Allow: true, Also: map[string]bool{"nativeSyncIn": false, "duplexCommandStream": true}},
		{Name: "10 declared as a string", Change: func(f Fixture) {
			f.Entry()["sandboxCapabilities"] = map[string]any{"duplexCommandStream": "true"}
		}, Code: capDenied, Message: capDeniedMsg, Reasons: []string{"capability_not_declared"}},
		{Name: "11 no worker", Change: func(f Fixture) { f.Facts["workers"] = map[string]any{} },
			Code: capDenied, Message: capDeniedMsg, Reasons: []string{"worker_not_running"}},
		{Name: "12 all nine", Change: func(f Fixture) {
			f.Worker()["supportedMethods"] = AllMethods
			caps := map[string]any{}
			for _, k := range specoracle.CapabilityKeys {
				caps[k] = true
			}
			f.Entry()["sandboxCapabilities"] = caps
			f.Request["lease"].(map[string]any)["leasePolicy"] = "reuse_by_environment"
		}, Allow: true, Also: all},
		{Name: "13 built-in fake", Change: func(f Fixture) {
			delete(f.Metadata(), "sandboxProviderPlugin")
			f.Metadata()["provider"] = "fake"
		}, Code: capDenied, Message: capDeniedMsg, Reasons: []string{"method_not_verified", "capability_not_declared"},
			Also: map[string]bool{"persistentProcessSessions": true, "independentControlCommands": true, "duplexCommandStream": false}},
		{Name: "14 ingress on the plugin driver", Change: func(f Fixture) {
			f.Request["operation"] = "getRunnerIngressEndpoint"
			f.Metadata()["driver"] = "plugin"
			f.Metadata()["driverKey"] = "daytona"
			f.Worker()["supportedMethods"] = []any{"environmentRunnerIngressEndpoint"}
			f.Entry()["sandboxCapabilities"] = map[string]any{"runnerWebSocketIngress": true}
		}, Code: "RUNNER_INGRESS_UNSUPPORTED", Message: `Environment driver "plugin" does not support runner ingress.`,
			Reasons: []string{"operation_unsupported_by_driver"}, Also: map[string]bool{"runnerWebSocketIngress": true}},
	}
}
