package decision

import (
	"reflect"
	"strings"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Capabilities is the snapshot: the capabilities the lease is entitled to now. Its fields are
// the one Go list of the capabilities (docs/contract.md, "The nine capabilities"): CapabilityKeys, every lookup by
// name, the plugin host's known capability keys and the TypeScript client's list derive from
// their JSON names. Tests fail when they and the policy's capability table
// (policies/authz/tables/tables.rego) or the TypeScript client disagree. Adding a capability
// therefore needs a release: a field here, its row in the policy table, and the TypeScript list
// regenerated (go generate ./internal/decision).
type Capabilities struct {
	ReusableLeases             bool `json:"reusableLeases"`
	NativeSyncIn               bool `json:"nativeSyncIn"`
	NativeSyncOut              bool `json:"nativeSyncOut"`
	PersistentProcessSessions  bool `json:"persistentProcessSessions"`
	IndependentControlCommands bool `json:"independentControlCommands"`
	IncrementalSessionOutput   bool `json:"incrementalSessionOutput"`
	ConcurrentSyncOperations   bool `json:"concurrentSyncOperations"`
	DuplexCommandStream        bool `json:"duplexCommandStream"`
	RunnerWebSocketIngress     bool `json:"runnerWebSocketIngress"`
}

// CapabilityKeys are the JSON names of the fields of Capabilities, in document order (the
// contract's order). Read it; never change it.
var CapabilityKeys, capabilityIndex = capabilityFields()

// capabilityFields reads the names and indexes of the fields of Capabilities.
func capabilityFields() ([]string, map[string]int) {
	t := reflect.TypeFor[Capabilities]()
	keys := make([]string, t.NumField())
	index := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() != reflect.Bool {
			panic("decision: every field of Capabilities must be a bool")
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		keys[i] = name
		index[name] = i
	}
	return keys, index
}

// field returns the field that holds capability key, or nil for an unknown key.
func (c *Capabilities) field(key string) *bool {
	i, ok := capabilityIndex[key]
	if !ok {
		return nil
	}
	return reflect.ValueOf(c).Elem().Field(i).Addr().Interface().(*bool)
}

// Get returns the value of capability key (false for an unknown key).
func (c Capabilities) Get(key string) bool {
	if f := c.field(key); f != nil {
		return *f
	}
	return false
}

// Document is the decision document of docs/contract.md, "The decision document". Every field is always present in JSON.
type Document struct {
	Allow        bool         `json:"allow"`
	Code         string       `json:"code"`
	Message      string       `json:"message"`
	Reasons      []string     `json:"reasons"`
	Capabilities Capabilities `json:"capabilities"`
	DecisionID   string       `json:"decision_id"`
	Revision     string       `json:"revision"`
}

// reasonEvaluationFailed is the only reason of a decision that could not be evaluated.
const reasonEvaluationFailed = "evaluation_failed"

// capabilityDenied holds each operation's capability-denied code and message (docs/contract.md, "Codes and messages"):
// the answer to every evaluation that fails.
var capabilityDenied = map[string][2]string{
	snapshot.OpOpenDuplexChannel: {
		"DUPLEX_CHANNEL_CAPABILITY_DENIED",
		"Sandbox lease does not grant the duplex command stream capability.",
	},
	snapshot.OpGetRunnerIngressEndpoint: {
		"RUNNER_INGRESS_CAPABILITY_DENIED",
		"Sandbox lease does not grant runner WebSocket ingress.",
	},
}

// FailedDocument is the deny of docs/contract.md, "Precise rules", "Failures": the operation's capability-denied
// code and message, no capability, and the reason evaluation_failed. An unknown operation gets
// the duplex channel's code.
func FailedDocument(operation string) Document {
	cd, ok := capabilityDenied[operation]
	if !ok {
		cd = capabilityDenied[snapshot.OpOpenDuplexChannel]
	}
	return Document{
		Code:    cd[0],
		Message: cd[1],
		Reasons: []string{reasonEvaluationFailed},
	}
}

// FailClosed is what answers a decision that could not be evaluated: whatever the decider
// returned beside err, the fail-closed deny of FailedDocument, keeping the decision id and the
// revision of doc; code is err's code (EVAL_ERROR when it has none). Every face that decides
// answers a failure through it.
func FailClosed(operation string, doc Document, err error) (failed Document, code coded.Code) {
	code = coded.CodeOf(err)
	if code == "" {
		code = coded.EvalError
	}
	failed = FailedDocument(operation)
	failed.DecisionID, failed.Revision = doc.DecisionID, doc.Revision
	return failed, code
}
