// Package specoracle is an independent, deliberately plain Go implementation of the decision
// contract written down in docs/contract.md ("The decision contract"). It exists so that property and
// fuzz tests can check the real, Rego-based engine against a second reading of the same text.
//
// The oracle is written from the text of docs/contract.md only (sections 2–8, 10 and 11) and shares no code or
// data with the engine. It computes the decision document (docs/contract.md, "The decision document") without the decision_id and
// revision fields, which are not part of the decision logic.
//
// Inputs are values as produced by encoding/json decoding into `any`: objects are
// map[string]any, arrays are []any, strings are string, booleans are bool, null is nil and
// numbers are json.Number (Decoder.UseNumber) or float64. Numbers never matter to the contract
// except as "not a string / not a boolean / not an object", so both number forms behave the same.
// Inputs are never modified.
package specoracle

import (
	"errors"
	"fmt"
)

// ErrBadRequest is wrapped by the error Decide returns for a bad request (docs/contract.md, "The request" and "Precise rules"
// "Request shape").
var ErrBadRequest = errors.New("bad request")

// ErrBadFacts is wrapped by the error Decide returns for malformed facts (docs/contract.md, "Precise rules" "Facts file").
var ErrBadFacts = errors.New("malformed facts")

// Operation names (docs/contract.md, "The decision, in order").
const (
	OpOpenDuplexChannel        = "openDuplexChannel"
	OpGetRunnerIngressEndpoint = "getRunnerIngressEndpoint"
)

// Decision codes (docs/contract.md, "Codes and messages").
const (
	CodeDuplexChannelCapabilityDenied    = "DUPLEX_CHANNEL_CAPABILITY_DENIED"
	CodeDuplexChannelUnsupported         = "DUPLEX_CHANNEL_UNSUPPORTED"
	CodeEnvironmentDriverNotRegistered   = "ENVIRONMENT_DRIVER_NOT_REGISTERED"
	CodeRunnerIngressCapabilityDenied    = "RUNNER_INGRESS_CAPABILITY_DENIED"
	CodeRunnerIngressUnsupported         = "RUNNER_INGRESS_UNSUPPORTED"
	MessageDuplexChannelCapabilityDenied = "Sandbox lease does not grant the duplex command stream capability."
	MessageRunnerIngressCapabilityDenied = "Sandbox lease does not grant runner WebSocket ingress."
)

// Reason codes (docs/contract.md, "Precise rules" "Reason codes"; evaluation_failed is not produced by the oracle, which
// cannot fail to evaluate).
const (
	ReasonDriverNotRegistered           = "driver_not_registered"
	ReasonOperationUnsupportedByDriver  = "operation_unsupported_by_driver"
	ReasonCapabilityUnsupportedByDriver = "capability_unsupported_by_driver"
	ReasonNoProvider                    = "no_provider"
	ReasonPluginNotPinned               = "plugin_not_pinned"
	ReasonPluginNotFound                = "plugin_not_found"
	ReasonPluginNotReady                = "plugin_not_ready"
	ReasonDriverEntryInvalid            = "driver_entry_invalid"
	ReasonDriverEntryMissing            = "driver_entry_missing"
	ReasonBuiltinProviderUnknown        = "builtin_provider_unknown"
	ReasonWorkerNotRunning              = "worker_not_running"
	ReasonMethodNotVerified             = "method_not_verified"
	ReasonCapabilityNotDeclared         = "capability_not_declared"
	ReasonCapabilityNarrowed            = "capability_narrowed"
	ReasonEvaluationFailed              = "evaluation_failed"
)

// Capability keys (docs/contract.md, "The nine capabilities").
const (
	CapReusableLeases             = "reusableLeases"
	CapNativeSyncIn               = "nativeSyncIn"
	CapNativeSyncOut              = "nativeSyncOut"
	CapPersistentProcessSessions  = "persistentProcessSessions"
	CapIndependentControlCommands = "independentControlCommands"
	CapIncrementalSessionOutput   = "incrementalSessionOutput"
	CapConcurrentSyncOperations   = "concurrentSyncOperations"
	CapDuplexCommandStream        = "duplexCommandStream"
	CapRunnerWebSocketIngress     = "runnerWebSocketIngress"
)

// CapabilityKeys lists the nine capabilities of docs/contract.md, "The nine capabilities" in the contract's order.
// It is the oracle's own list, on purpose: the oracle is a second reading of the contract and
// shares no data with the engine, whose list is the fields of api.Capabilities (internal/api). The worked
// examples (internal/specexamples) use this list, as contract data.
var CapabilityKeys = []string{
	CapReusableLeases,
	CapNativeSyncIn,
	CapNativeSyncOut,
	CapPersistentProcessSessions,
	CapIndependentControlCommands,
	CapIncrementalSessionOutput,
	CapConcurrentSyncOperations,
	CapDuplexCommandStream,
	CapRunnerWebSocketIngress,
}

// Worker method names (docs/contract.md, "The nine capabilities").
const (
	MethodResumeLease           = "environmentResumeLease"
	MethodReleaseLease          = "environmentReleaseLease"
	MethodDestroyLease          = "environmentDestroyLease"
	MethodSyncIn                = "environmentSyncIn"
	MethodSyncOut               = "environmentSyncOut"
	MethodExecute               = "environmentExecute"
	MethodDuplexChannelOpen     = "duplexChannelOpen"
	MethodRunnerIngressEndpoint = "environmentRunnerIngressEndpoint"
)

// Decision is the decision document of docs/contract.md, "The decision document" without decision_id and revision.
type Decision struct {
	Allow        bool
	Code         string
	Message      string
	Reasons      []string        // never nil; empty on a grant
	Capabilities map[string]bool // always all nine keys of CapabilityKeys
}

// capabilityRule is one row of the docs/contract.md, "The nine capabilities" table. Every requirement group has exactly one method,
// so "every group has a method in supportedMethods" is "every listed method is supported".
type capabilityRule struct {
	methods []string
	optIn   bool
}

// capabilityTable is the docs/contract.md, "The nine capabilities" table (the narrowing column is in narrowingAllows).
var capabilityTable = map[string]capabilityRule{
	CapReusableLeases:             {methods: []string{MethodResumeLease, MethodReleaseLease, MethodDestroyLease}},
	CapNativeSyncIn:               {methods: []string{MethodSyncIn}},
	CapNativeSyncOut:              {methods: []string{MethodSyncOut}},
	CapPersistentProcessSessions:  {methods: []string{MethodExecute}},
	CapIndependentControlCommands: {methods: []string{MethodExecute}},
	CapIncrementalSessionOutput:   {methods: []string{MethodExecute}, optIn: true},
	CapConcurrentSyncOperations:   {methods: []string{MethodSyncIn, MethodSyncOut}, optIn: true},
	CapDuplexCommandStream:        {methods: []string{MethodDuplexChannelOpen}, optIn: true},
	CapRunnerWebSocketIngress:     {methods: []string{MethodRunnerIngressEndpoint}, optIn: true},
}

// registeredDrivers is docs/contract.md, "The decision, in order" step 2.
var registeredDrivers = map[string]bool{"local": true, "ssh": true, "sandbox": true, "plugin": true}

// operationSupport is the operation-support table of docs/contract.md, "The decision, in order" (step 3 and the second operation).
var operationSupport = map[string]map[string]bool{
	OpOpenDuplexChannel:        {"sandbox": true, "plugin": true},
	OpGetRunnerIngressEndpoint: {"sandbox": true},
}

// Decide computes the contract's decision for a raw request and raw facts.
//
// When the request is bad (docs/contract.md, "The request" and "Precise rules" "Request shape") the error wraps ErrBadRequest; when
// the facts are malformed (docs/contract.md, "Precise rules" "Facts file") it wraps ErrBadFacts. When both are bad, the
// request is reported (docs/contract.md, "Precise rules" "Remaining edge values"). On error the Decision is the zero value.
func Decide(request any, facts any) (Decision, error) {
	req, err := parseRequest(request)
	if err != nil {
		return Decision{}, err
	}
	f, err := parseFacts(facts)
	if err != nil {
		return Decision{}, err
	}
	return decide(req, f), nil
}

// ---------------------------------------------------------------------------------------------
// Input shape (docs/contract.md, "The request" and "Precise rules" "Request shape" and "Facts file").

type request struct {
	operation   string
	environment map[string]any // never nil; absent counts as {}
	lease       map[string]any // never nil; absent counts as {}
	metadata    map[string]any // never nil; absent counts as {}
}

type facts struct {
	plugins          map[string]map[string]any // by plugin id
	workers          map[string]map[string]any // by plugin id
	builtinProviders map[string]map[string]any // by provider key
}

func badRequest(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
}

func badFacts(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadFacts, fmt.Sprintf(format, args...))
}

// optionalObject returns the object at m[key], {} when the key is absent, and ok=false when the
// key is present with a value that is not an object (JSON null included).
func optionalObject(m map[string]any, key string) (map[string]any, bool) {
	v, present := m[key]
	if !present {
		return map[string]any{}, true
	}
	obj, isObj := asObject(v)
	return obj, isObj
}

// parseRequest checks the request shape of docs/contract.md, "The request" and docs/contract.md, "Precise rules" "Request shape".
func parseRequest(raw any) (request, error) {
	top, ok := asObject(raw)
	if !ok {
		return request{}, badRequest("request is not a JSON object")
	}
	var r request
	if r.environment, ok = optionalObject(top, "environment"); !ok {
		return request{}, badRequest("environment is not an object")
	}
	if r.lease, ok = optionalObject(top, "lease"); !ok {
		return request{}, badRequest("lease is not an object")
	}
	if r.metadata, ok = optionalObject(r.lease, "metadata"); !ok {
		return request{}, badRequest("lease.metadata is not an object")
	}
	r.operation = OpOpenDuplexChannel
	if op, present := top["operation"]; present {
		s, isString := op.(string)
		if !isString || (s != OpOpenDuplexChannel && s != OpGetRunnerIngressEndpoint) {
			return request{}, badRequest("unknown operation")
		}
		r.operation = s
	}
	return r, nil
}

// objectOfObjects checks that v is an object whose values are all objects.
func objectOfObjects(v any) (map[string]map[string]any, bool) {
	obj, ok := asObject(v)
	if !ok {
		return nil, false
	}
	out := make(map[string]map[string]any, len(obj))
	for k, val := range obj {
		inner, ok := asObject(val)
		if !ok {
			return nil, false
		}
		out[k] = inner
	}
	return out, true
}

// parseFacts checks the facts shape of docs/contract.md, "Precise rules" "Facts file" (and the null rule of "Remaining
// edge values").
func parseFacts(raw any) (facts, error) {
	top, ok := asObject(raw)
	if !ok {
		return facts{}, badFacts("facts are not a JSON object")
	}
	f := facts{
		plugins:          map[string]map[string]any{},
		workers:          map[string]map[string]any{},
		builtinProviders: map[string]map[string]any{},
	}
	if v, present := top["plugins"]; present {
		list, isArray := v.([]any)
		if !isArray {
			return facts{}, badFacts("plugins is not an array")
		}
		for i, el := range list {
			plugin, isObj := asObject(el)
			if !isObj {
				return facts{}, badFacts("plugins[%d] is not an object", i)
			}
			id, isID := nonEmptyString(plugin["id"])
			if !isID {
				return facts{}, badFacts("plugins[%d].id is not a non-empty string", i)
			}
			if _, dup := f.plugins[id]; dup {
				return facts{}, badFacts("duplicate plugin id %q", id)
			}
			f.plugins[id] = plugin
		}
	}
	if v, present := top["workers"]; present {
		if f.workers, ok = objectOfObjects(v); !ok {
			return facts{}, badFacts("workers is not an object of objects")
		}
	}
	if v, present := top["builtinProviders"]; present {
		if f.builtinProviders, ok = objectOfObjects(v); !ok {
			return facts{}, badFacts("builtinProviders is not an object of objects")
		}
	}
	return f, nil
}

// ---------------------------------------------------------------------------------------------
// JSON value helpers (docs/contract.md, "The nine capabilities" last line, docs/contract.md, "Precise rules" "Strings").

func asObject(v any) (map[string]any, bool) {
	m, ok := v.(map[string]any)
	return m, ok && m != nil
}

// nonEmptyString: a JSON string of length at least one.
func nonEmptyString(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok && s != ""
}

// isTrue: only the JSON literal true is true.
func isTrue(v any) bool {
	b, ok := v.(bool)
	return ok && b
}

// equalsString: exact, case-sensitive; a non-string never equals a string.
func equalsString(v any, s string) bool {
	got, ok := v.(string)
	return ok && got == s
}

// ---------------------------------------------------------------------------------------------
// The decision (docs/contract.md, "The decision, in order", "Codes and messages", "The decision document" and "Precise rules" "Order of checks").

// resolveDriver is docs/contract.md, "The decision, in order" step 1 (and docs/contract.md, "Precise rules" "Driver and provider").
func resolveDriver(r request) string {
	if d, ok := nonEmptyString(r.metadata["driver"]); ok {
		return d
	}
	if d, ok := nonEmptyString(r.environment["driver"]); ok {
		return d
	}
	return "sandbox"
}

func decide(r request, f facts) Decision {
	driver := resolveDriver(r)
	res := resolveSnapshot(driver, r, f)
	caps := res.snapshot()

	if !registeredDrivers[driver] {
		return deny(CodeEnvironmentDriverNotRegistered,
			`Environment driver "`+driver+`" is not registered in the environment runtime yet.`,
			[]string{ReasonDriverNotRegistered}, caps)
	}
	supported := operationSupport[r.operation][driver]

	switch r.operation {
	case OpGetRunnerIngressEndpoint:
		// registered → capability → operation support.
		if !caps[CapRunnerWebSocketIngress] {
			return deny(CodeRunnerIngressCapabilityDenied, MessageRunnerIngressCapabilityDenied,
				res.denyReasons(CapRunnerWebSocketIngress), caps)
		}
		if !supported {
			return deny(CodeRunnerIngressUnsupported,
				`Environment driver "`+driver+`" does not support runner ingress.`,
				[]string{ReasonOperationUnsupportedByDriver}, caps)
		}
	default: // OpOpenDuplexChannel: registered → operation support → capability.
		if !supported {
			return deny(CodeDuplexChannelUnsupported,
				`Environment driver "`+driver+`" does not support duplex channels.`,
				[]string{ReasonOperationUnsupportedByDriver}, caps)
		}
		if !caps[CapDuplexCommandStream] {
			return deny(CodeDuplexChannelCapabilityDenied, MessageDuplexChannelCapabilityDenied,
				res.denyReasons(CapDuplexCommandStream), caps)
		}
	}
	return Decision{Allow: true, Code: "", Message: "", Reasons: []string{}, Capabilities: caps}
}

func deny(code, message string, reasons []string, caps map[string]bool) Decision {
	return Decision{Allow: false, Code: code, Message: message, Reasons: reasons, Capabilities: caps}
}

// ---------------------------------------------------------------------------------------------
// Resolving the snapshot (docs/contract.md, "The nine capabilities" and "Resolving the snapshot").

// resolution holds everything needed to compute the snapshot and to explain a capability deny.
type resolution struct {
	// classSupports is supported(k) of docs/contract.md, "The nine capabilities": true for sandbox and plugin, false for local,
	// ssh and any unregistered driver.
	classSupports bool
	// identityFailure is the first failing identity check (docs/contract.md, "Precise rules" "Reason codes"), or "".
	identityFailure string
	// pluginPath: the plugin-backed sandbox path or the plugin driver (worker_not_running applies).
	pluginPath bool
	// workerRunning: on a plugin path, the pinned plugin has an entry in `workers`.
	workerRunning bool
	verified      map[string]bool // verified worker methods
	declaration   map[string]any  // declared capability values (raw JSON values)
	configFailed  bool            // config resolution failed (plugin-backed sandbox path only)
	lease         map[string]any
	metadata      map[string]any
}

func resolveSnapshot(driver string, r request, f facts) resolution {
	res := resolution{
		verified:    map[string]bool{},
		declaration: map[string]any{},
		lease:       r.lease,
		metadata:    r.metadata,
	}
	switch driver {
	case "sandbox":
		res.classSupports = true
		resolveSandbox(&res, r, f)
	case "plugin":
		res.classSupports = true
		resolvePluginDriver(&res, r, f)
	default:
		// local, ssh: every capability false; an unregistered driver supports nothing.
	}
	return res
}

// providerKey is the docs/contract.md, "Resolving the snapshot" provider key of the sandbox driver (and docs/contract.md, "Precise rules" "Driver and
// provider": the fallback applies only when environment.driver is exactly "sandbox").
func providerKey(r request) (string, bool) {
	if p, ok := nonEmptyString(r.metadata["provider"]); ok {
		return p, true
	}
	if equalsString(r.environment["driver"], "sandbox") {
		if cfg, ok := asObject(r.environment["config"]); ok {
			return nonEmptyString(cfg["provider"])
		}
	}
	return "", false
}

// resolveSandbox is the docs/contract.md, "Resolving the snapshot" `sandbox` driver.
func resolveSandbox(res *resolution, r request, f facts) {
	key, ok := providerKey(r)
	if !ok {
		res.identityFailure = ReasonNoProvider
		return
	}
	if isTrue(r.metadata["sandboxProviderPlugin"]) {
		resolvePluginBackedSandbox(res, r, f, key)
		return
	}
	// Built-in provider.
	b, ok := f.builtinProviders[key]
	if !ok {
		res.identityFailure = ReasonBuiltinProviderUnknown
		return
	}
	if isTrue(b["execute"]) {
		res.verified[MethodExecute] = true
	}
	if isTrue(b["supportsReusableLeases"]) {
		res.verified[MethodResumeLease] = true
		res.verified[MethodReleaseLease] = true
		res.verified[MethodDestroyLease] = true
	}
	if v, isBool := b["supportsReusableLeases"].(bool); isBool {
		res.declaration[CapReusableLeases] = v
	}
}

// resolvePluginBackedSandbox is the docs/contract.md, "Resolving the snapshot" plugin-backed sandbox path.
func resolvePluginBackedSandbox(res *resolution, r request, f facts, key string) {
	res.pluginPath = true
	pluginID, ok := nonEmptyString(r.metadata["pluginId"])
	if !ok {
		res.identityFailure = ReasonPluginNotPinned
		return
	}
	entry, failure := pinnedEntry(f, pluginID, key, true)
	if failure != "" {
		res.identityFailure = failure
		return
	}
	worker, running := readPinned(res, f, pluginID, entry)
	if !running {
		return // no worker: nothing verified, config not consulted
	}
	if cv, present := worker["configValid"]; present && !isTrue(cv) {
		res.configFailed = true
	}
}

// resolvePluginDriver is the docs/contract.md, "Resolving the snapshot" `plugin` driver: any entry kind; config not consulted.
func resolvePluginDriver(res *resolution, r request, f facts) {
	res.pluginPath = true
	pluginID, okID := nonEmptyString(r.metadata["pluginId"])
	driverKey, okKey := nonEmptyString(r.metadata["driverKey"])
	if !okID || !okKey {
		res.identityFailure = ReasonPluginNotPinned
		return
	}
	entry, failure := pinnedEntry(f, pluginID, driverKey, false)
	if failure != "" {
		res.identityFailure = failure
		return
	}
	readPinned(res, f, pluginID, entry) // config is not consulted on this path
}

// readPinned records the pinned entry's declaration and, when the plugin's worker runs, its
// methods (docs/contract.md, "Resolving the snapshot", both plugin paths).
func readPinned(res *resolution, f facts, pluginID string, entry map[string]any) (worker map[string]any, running bool) {
	res.declaration = declarationOf(entry)
	worker, running = f.workers[pluginID]
	if running {
		res.workerRunning = true
		res.verified = supportedMethods(worker)
	}
	return worker, running
}

// pinnedEntry runs the identity checks plugin_not_found, plugin_not_ready, driver_entry_invalid
// and driver_entry_missing, in that order (docs/contract.md, "Resolving the snapshot" and "Precise rules" "Reason codes" and "Remaining edge
// values"). It returns the one manifest entry with the driver key, or the failing reason.
func pinnedEntry(f facts, pluginID, driverKey string, requireSandboxKind bool) (map[string]any, string) {
	plugin, ok := f.plugins[pluginID]
	if !ok {
		return nil, ReasonPluginNotFound
	}
	if !equalsString(plugin["status"], "ready") {
		return nil, ReasonPluginNotReady
	}
	var matches []map[string]any
	if manifest, ok := asObject(plugin["manifest"]); ok {
		if drivers, ok := manifest["environmentDrivers"].([]any); ok {
			for _, el := range drivers {
				if entry, ok := asObject(el); ok && equalsString(entry["driverKey"], driverKey) {
					matches = append(matches, entry)
				}
			}
		}
	}
	if len(matches) == 0 {
		return nil, ReasonDriverEntryMissing
	}
	if len(matches) >= 2 {
		return nil, ReasonDriverEntryInvalid
	}
	entry := matches[0]
	if sc, present := entry["sandboxCapabilities"]; present {
		if _, isObj := asObject(sc); !isObj {
			return nil, ReasonDriverEntryInvalid
		}
	}
	if requireSandboxKind && !equalsString(entry["kind"], "sandbox_provider") {
		return nil, ReasonDriverEntryMissing
	}
	return entry, ""
}

// declarationOf is the declaration of a valid manifest entry: its sandboxCapabilities plus the
// legacy supportsReusableLeases field (docs/contract.md, "The facts (host state)" and "Precise rules" "Facts values").
func declarationOf(entry map[string]any) map[string]any {
	decl := map[string]any{}
	if sc, ok := asObject(entry["sandboxCapabilities"]); ok {
		for k, v := range sc {
			decl[k] = v
		}
	}
	if v, present := decl[CapReusableLeases]; !present || v == nil {
		if legacy, present := entry["supportsReusableLeases"]; present && legacy != nil {
			decl[CapReusableLeases] = legacy
		}
	}
	return decl
}

// supportedMethods is the worker's method set: absent/null/non-array counts as [], only string
// elements count (docs/contract.md, "Precise rules" "Facts values").
func supportedMethods(worker map[string]any) map[string]bool {
	out := map[string]bool{}
	if list, ok := worker["supportedMethods"].([]any); ok {
		for _, el := range list {
			if s, ok := el.(string); ok {
				out[s] = true
			}
		}
	}
	return out
}

// verifiedAllows is verified(k) of docs/contract.md, "The nine capabilities".
func (res resolution) verifiedAllows(k string) bool {
	for _, m := range capabilityTable[k].methods {
		if !res.verified[m] {
			return false
		}
	}
	return true
}

// declaredAllows is declaredAllows(k) of docs/contract.md, "The nine capabilities".
func (res resolution) declaredAllows(k string) bool {
	v, present := res.declaration[k]
	if !present || v == nil {
		return !capabilityTable[k].optIn
	}
	b, isBool := v.(bool)
	return isBool && b
}

// narrowingAllows is narrowingAllows(k) of docs/contract.md, "The nine capabilities" (the table's last column).
func (res resolution) narrowingAllows(k string) bool {
	switch k {
	case CapReusableLeases:
		return equalsString(res.lease["leasePolicy"], "reuse_by_environment")
	case CapNativeSyncIn, CapNativeSyncOut:
		return !equalsString(res.metadata["backend"], "job") && !isTrue(res.metadata["nativeFileSyncUnsupported"])
	case CapPersistentProcessSessions, CapIncrementalSessionOutput, CapDuplexCommandStream:
		return !res.configFailed
	default:
		return true
	}
}

// capability is snapshot[k] of docs/contract.md, "The nine capabilities".
func (res resolution) capability(k string) bool {
	return res.classSupports && res.identityFailure == "" &&
		res.verifiedAllows(k) && res.declaredAllows(k) && res.narrowingAllows(k)
}

// snapshot returns all nine capabilities (docs/contract.md, "The nine capabilities" and "The decision document").
func (res resolution) snapshot() map[string]bool {
	caps := make(map[string]bool, len(CapabilityKeys))
	for _, k := range CapabilityKeys {
		caps[k] = res.capability(k)
	}
	return caps
}

// denyReasons explains why capability k is false (docs/contract.md, "Precise rules" "Reason codes").
func (res resolution) denyReasons(k string) []string {
	if !res.classSupports {
		return []string{ReasonCapabilityUnsupportedByDriver}
	}
	if res.identityFailure != "" {
		return []string{res.identityFailure}
	}
	reasons := []string{}
	if !res.verifiedAllows(k) {
		if res.pluginPath && !res.workerRunning {
			reasons = append(reasons, ReasonWorkerNotRunning)
		} else {
			reasons = append(reasons, ReasonMethodNotVerified)
		}
	}
	if !res.declaredAllows(k) {
		reasons = append(reasons, ReasonCapabilityNotDeclared)
	}
	if !res.narrowingAllows(k) {
		reasons = append(reasons, ReasonCapabilityNarrowed)
	}
	return reasons
}
