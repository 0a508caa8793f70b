package decision

import (
	"fmt"
	"sort"
	"strings"

	"github.com/authz-dev/authz/internal/snapshot"
)

// reasonText says in words what each reason code of SPEC section 11 means.
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
	ReasonEvaluationFailed:             "the policy could not be evaluated; the service fails closed",
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
		fmt.Fprintf(&b, "  evaluation failed: %v\n", evalErr)
	}
	res, _ := in["resolved"].(map[string]any)
	facts, _ := in["facts"].(map[string]any)
	fmt.Fprintf(&b, "  driver %q, provider key %q, plugin-backed %v, pinned plugin %q, driver key %q\n",
		res["driver"], res["providerKey"], res["pluginBacked"], res["pluginId"], res["driverKey"])
	if p, ok := facts["plugin"].(map[string]any); ok {
		fmt.Fprintf(&b, "  plugin %q: key %v, status %v\n", p["id"], p["key"], p["status"])
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
		sort.Strings(on)
		if len(on) > 0 {
			fmt.Fprintf(&b, "  narrowing: %s\n", strings.Join(on, ", "))
		}
	}
	var granted []string
	for _, k := range CapabilityKeys {
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
