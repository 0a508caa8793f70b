// Package api holds the types of the service's API that more than one package reads: the
// capability list of the decision document (docs/contract.md, "The nine capabilities"). It
// imports nothing of authz, so that any package may use it without linking what fills it.
package api

import (
	"reflect"
	"strings"
)

// Capabilities is the snapshot: the capabilities the lease is entitled to now. Its fields are
// the one Go list of the capabilities (docs/contract.md, "The nine capabilities"): CapabilityKeys, every lookup by
// name, the plugin host's known capability keys and the TypeScript client's list derive from
// their JSON names. Tests fail when they and the policy's capability table
// (policies/authz/tables/tables.rego) or the TypeScript client disagree. Adding a capability
// therefore needs a release: a field here, its row in the policy table, and the TypeScript list
// regenerated (go generate ./internal/decision).
//
// It lives here, below the decision engine, so that the plugin host, which checks manifests
// against the list, does not link the engine's Rego evaluator.
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
			panic("api: every field of Capabilities must be a bool")
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		keys[i] = name
		index[name] = i
	}
	return keys, index
}

// Set sets capability key to v; it reports false for an unknown key.
func (c *Capabilities) Set(key string, v bool) bool {
	f := c.field(key)
	if f == nil {
		return false
	}
	*f = v
	return true
}

// IsCapability reports whether key is a capability of this release.
func IsCapability(key string) bool {
	_, ok := capabilityIndex[key]
	return ok
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
