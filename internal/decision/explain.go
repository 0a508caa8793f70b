package decision

import (
	"fmt"
	"slices"
	"strings"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
)

// reasonText says in words what each reason code (docs/contract.md, "Precise rules") means.
var reasonText = map[string]string{
	"driver_not_registered":            "the driver is not one the runtime registers (local, ssh, sandbox, plugin)",
	"operation_unsupported_by_driver":  "the driver does not support this operation",
	"capability_unsupported_by_driver": "the driver class supports no sandbox capability",
	"no_provider":                      "no provider key: set lease.metadata.provider (or environment.config.provider for a sandbox environment)",
	"plugin_not_pinned":                "the lease pins no plugin: lease.metadata.pluginId (and driverKey on the plugin driver) must be non-empty strings",
	"plugin_not_found":                 "no installed plugin has exactly the pinned id",
	"plugin_not_ready":                 "the pinned plugin's status is not \"ready\"",
	"driver_entry_invalid":             "the plugin's manifest entry is invalid (duplicate driverKey, or sandboxCapabilities not an object)",
	"driver_entry_missing":             "the plugin's manifest has no entry for the key (of kind sandbox_provider on the sandbox driver)",
	"builtin_provider_unknown":         "no built-in provider has this key",
	"worker_not_running":               "the plugin's worker is not running, so no method is verified",
	"method_not_verified":              "a method the capability requires is missing from the worker's methods right now",
	"capability_not_declared":          "the driver's declaration leaves the capability out (opt-in), says false, or is not a boolean",
	"capability_narrowed":              "the lease policy, lease metadata or a refused provider config removes the capability",
	reasonEvaluationFailed:             "the policy could not be evaluated; the service fails closed",
	ReasonServiceStopping:              "the service stopped while the grant was watched; the watch ends with this deny",
	ReasonLogUnavailable:               "a watched decision could not be recorded in the required decision log; the watch ends with this deny",
	ReasonAccessRevoked:                "the credential that opened the watch is no longer accepted (its token was revoked); the watch ends with this deny",
}

// Reasons that only end a watch (docs/service.md, "Watching a grant"); no policy gives them.
const (
	// ReasonServiceStopping ends every open watch when the service stops.
	ReasonServiceStopping = "service_stopping"
	// ReasonLogUnavailable ends a watch whose next decision a required decision log could not
	// record: a decision that is not recorded is not used.
	ReasonLogUnavailable = "decision_log_unavailable"
	// ReasonAccessRevoked ends a watch whose bearer token is no longer accepted (the tokens
	// file was re-read without it): access is checked for as long as the watch is open.
	ReasonAccessRevoked = "access_revoked"
)

// KnownReason reports whether r is a reason code of the contract's closed table.
func KnownReason(r string) bool {
	_, ok := reasonText[r]
	return ok
}

// Explain renders a readable account of a decision: the verdict, what the host resolved, the
// facts it read, and what each reason means.
func Explain(doc Document, in snapshot.Input, evalErr error) string {
	var b strings.Builder
	if doc.Allow {
		fmt.Fprintf(&b, "GRANT %v\n", in["operation"])
	} else {
		fmt.Fprintf(&b, "DENY %v: %s %s\n", in["operation"], doc.Code, doc.Message)
	}
	if evalErr != nil {
		fmt.Fprintf(&b, "  evaluation failed: %s: %v\n", coded.CodeOf(evalErr), evalErr)
	}
	res, _ := in["resolved"].(map[string]any)
	facts, _ := in["facts"].(map[string]any)
	explainResolved(&b, res)
	if p, ok := facts["plugin"].(map[string]any); ok {
		fmt.Fprintf(&b, "  plugin %q: key %v, status %v\n", p["id"], p["key"], p["status"])
	} else if id, _ := res["pluginId"].(string); id != "" {
		fmt.Fprintf(&b, "  no installed plugin has the id %q\n", id)
	}
	if w, ok := facts["worker"].(map[string]any); ok {
		fmt.Fprintf(&b, "  worker generation %v, methods %v\n", w["generation"], w["supportedMethods"])
	} else if res["pluginId"] != "" {
		fmt.Fprintf(&b, "  no worker is running for the pinned plugin\n")
	}
	if bp, ok := facts["builtinProvider"].(map[string]any); ok {
		fmt.Fprintf(&b, "  built-in provider %v\n", bp)
	}
	if n, ok := in["narrowing"].(map[string]any); ok {
		var on []string
		for k, v := range n {
			if v == true {
				on = append(on, k)
			}
		}
		slices.Sort(on)
		if len(on) > 0 {
			fmt.Fprintf(&b, "  narrowing: %s\n", strings.Join(on, ", "))
		}
	}
	var granted []string
	for _, k := range api.CapabilityKeys {
		if doc.Capabilities.Get(k) {
			granted = append(granted, k)
		}
	}
	if len(granted) == 0 {
		granted = []string{"none"}
	}
	fmt.Fprintf(&b, "  capabilities: %s\n", strings.Join(granted, ", "))
	for _, r := range doc.Reasons {
		fmt.Fprintf(&b, "  because %s: %s\n", r, reasonText[r])
	}
	return b.String()
}

// explainResolved writes what the host resolved from the request, as far as the driver uses it.
// An empty value is never printed as "": the line says which request field is missing.
func explainResolved(b *strings.Builder, res map[string]any) {
	driver, _ := res["driver"].(string)
	fmt.Fprintf(b, "  driver %q\n", driver)
	str := func(key string) string { s, _ := res[key].(string); return s }
	line := func(what, value, missing string) {
		if value == "" {
			fmt.Fprintf(b, "  %s: none (%s)\n", what, missing)
			return
		}
		fmt.Fprintf(b, "  %s %q\n", what, value)
	}
	switch driver {
	case "sandbox":
		line("provider key", str("providerKey"),
			"lease.metadata.provider is not a non-empty string, nor environment.config.provider on an environment whose driver is sandbox")
		backed := res["pluginBacked"] == true
		fmt.Fprintf(b, "  plugin-backed %v\n", backed)
		if backed {
			line("pinned plugin", str("pluginId"), "lease.metadata.pluginId is not a non-empty string")
		}
	case "plugin":
		line("pinned plugin", str("pluginId"), "lease.metadata.pluginId is not a non-empty string")
		line("driver key", str("driverKey"), "lease.metadata.driverKey is not a non-empty string")
	}
}
