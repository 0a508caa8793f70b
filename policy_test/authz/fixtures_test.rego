# METADATA
# title: Test fixtures for data.authz.decision
# description: |
#   Input documents and expected decision documents shared by the authz_test suites. The base
#   input is the contract's fixture F (sections 3 and 4 as written) as the host assembles it
#   (docs/input-document.md; compare `authz decide --print-input`); tests vary it with
#   object.union (deep merge of objects; arrays are replaced) and json.remove.
package authz_test

# METADATA
# title: Fixture F
# description: docs/contract.md, "The request" and "The facts (host state)" as written, assembled into the policy input document.
fixture_f := {
	"operation": "openDuplexChannel",
	"environment": {"id": "env-1", "driver": "sandbox", "config": {"provider": "daytona"}},
	"lease": {
		"id": "lease-1",
		"companyId": "company-1",
		"leasePolicy": "ephemeral",
		"providerLeaseId": "provider-lease-1",
		"metadata": {
			"driver": "sandbox",
			"sandboxProviderPlugin": true,
			"pluginId": "test.plugin",
			"provider": "daytona",
		},
	},
	"command": ["sh", "-c", "echo hi"],
	"now_ns": 1796042400000000000,
	"resolved": {
		"driver": "sandbox",
		"providerKey": "daytona",
		"pluginBacked": true,
		"pluginId": "test.plugin",
		"driverKey": "",
	},
	"facts": {
		"plugin": {
			"id": "test.plugin",
			"key": "acme.daytona",
			"status": "ready",
			"manifest": {"environmentDrivers": [daytona_entry]},
		},
		"worker": {"generation": 1, "supportedMethods": ["duplexChannelOpen"]},
	},
	"narrowing": {
		"leasePolicyNotReusable": true,
		"nativeSyncUnavailable": false,
		"configResolutionFailed": false,
	},
}

# METADATA
# title: Fixture F manifest entry
# description: The one environmentDrivers entry of fixture F.
daytona_entry := {
	"driverKey": "daytona",
	"kind": "sandbox_provider",
	"sandboxCapabilities": {"duplexCommandStream": true},
}

# METADATA
# title: Fixture F with a change
# description: Deep-merges patch into fixture F.
f(patch) := object.union(fixture_f, patch)

# METADATA
# title: Fixture F without some paths
# description: Fixture F with the given slash-separated paths removed (json.remove).
f_without(paths) := json.remove(fixture_f, paths)

# METADATA
# title: Manifest entries
# description: Fixture F with the pinned plugin's environmentDrivers replaced.
with_entries(entries) := f({"facts": {"plugin": {"manifest": {"environmentDrivers": entries}}}})

# METADATA
# title: Manifest entry with a change
# description: Fixture F whose one entry is deep-merged with patch.
with_entry(patch) := with_entries([object.union(daytona_entry, patch)])

# METADATA
# title: Entry with a declaration
# description: Fixture F whose one entry declares exactly sandboxCapabilities = sc.
with_declared(sc) := with_entries([{"driverKey": "daytona", "kind": "sandbox_provider", "sandboxCapabilities": sc}])

# METADATA
# title: Worker methods
# description: Fixture F whose worker reports supportedMethods = ms.
with_methods(ms) := f({"facts": {"worker": {"supportedMethods": ms}}})

# METADATA
# title: Capability keys
# description: The nine capability keys of docs/contract.md, "The nine capabilities", in table order.
capability_keys := [
	"reusableLeases",
	"nativeSyncIn",
	"nativeSyncOut",
	"persistentProcessSessions",
	"independentControlCommands",
	"incrementalSessionOutput",
	"concurrentSyncOperations",
	"duplexCommandStream",
	"runnerWebSocketIngress",
]

# METADATA
# title: Every worker method
# description: |
#   Every worker method some capability of the capability table requires, read from the table,
#   so that the suites that test the policy's mechanics follow a routine edit of a capability's
#   methods. The contract's own list is pinned in the contract suite (policy_test/authz/contract).
all_methods := sort({m | some c in data.authz.tables.capabilities; some m in c.methods})

# METADATA
# title: Everything declared
# description: A declaration with all nine capabilities true.
all_declared := {k: true | some k in capability_keys}

# METADATA
# title: contract example 12 input
# description: All nine methods verified, all nine declared true, leasePolicy reuse_by_environment.
row12 := f({
	"lease": {"leasePolicy": "reuse_by_environment"},
	"facts": {
		"plugin": {"manifest": {"environmentDrivers": [object.union(daytona_entry, {"sandboxCapabilities": all_declared})]}},
		"worker": {"supportedMethods": all_methods},
	},
	"narrowing": {"leasePolicyNotReusable": false},
})

# METADATA
# title: Row 12 with a change
# description: Deep-merges patch into the row 12 input.
full(patch) := object.union(row12, patch)

# METADATA
# title: Row 12 with other worker methods
# description: The row 12 input whose worker reports supportedMethods = ms.
full_methods(ms) := full({"facts": {"worker": {"supportedMethods": ms}}})

# METADATA
# title: Row 12 with another declaration
# description: The row 12 input whose one entry declares exactly sandboxCapabilities = sc.
full_declared(sc) := full({"facts": {"plugin": {"manifest": {"environmentDrivers": [{
	"driverKey": "daytona",
	"kind": "sandbox_provider",
	"sandboxCapabilities": sc,
}]}}}})

# METADATA
# title: Plugin driver input
# description: |
#   Fixture F on the `plugin` driver: the lease names driver `plugin` and driverKey `daytona`,
#   and the host resolves both (narrowing.configResolutionFailed stays false off the
#   plugin-backed sandbox path).
plugin_driver_f := f({
	"lease": {"metadata": {"driver": "plugin", "driverKey": "daytona"}},
	"resolved": {"driver": "plugin", "driverKey": "daytona"},
})

# METADATA
# title: Plugin driver input with a change
# description: Deep-merges patch into plugin_driver_f.
plugin_driver(patch) := object.union(plugin_driver_f, patch)

# METADATA
# title: Plugin driver entries
# description: plugin_driver_f with the pinned plugin's environmentDrivers replaced.
plugin_driver_entries(entries) := plugin_driver({"facts": {"plugin": {"manifest": {"environmentDrivers": entries}}}})

# METADATA
# title: Built-in provider input
# description: |
#   contract example 13: fixture F with lease.metadata.provider "fake" and no sandboxProviderPlugin, as
#   the host assembles it (the pinned plugin and its worker are still looked up from pluginId,
#   builtinProviders["fake"] is found, config resolution is not consulted).
builtin_f := object.union(f_without(["lease/metadata/sandboxProviderPlugin"]), {
	"lease": {"metadata": {"provider": "fake"}},
	"resolved": {"providerKey": "fake", "pluginBacked": false},
	"facts": {"builtinProvider": {"execute": true, "supportsReusableLeases": false}},
})

# METADATA
# title: Built-in provider input with a change
# description: Deep-merges patch into builtin_f.
builtin(patch) := object.union(builtin_f, patch)

# METADATA
# title: Built-in provider record
# description: builtin_f with facts.builtinProvider replaced by b.
builtin_provider(b) := object.union(json.remove(builtin_f, ["facts/builtinProvider"]), {"facts": {"builtinProvider": b}})

# METADATA
# title: Snapshot
# description: The nine capabilities, true exactly for the keys in trues.
caps(trues) := {k: is_member(k, trues) | some k in capability_keys}

# METADATA
# title: Membership as a boolean
# description: True when x is an element of the set or array xs, else false.
default is_member(_, _) := false

is_member(x, xs) if x in xs

# METADATA
# title: No capability
# description: The snapshot with all nine capabilities false.
caps_none := caps(set())

# METADATA
# title: Duplex denied message
# description: docs/contract.md, "Codes and messages".
duplex_denied_message := "Sandbox lease does not grant the duplex command stream capability."

# METADATA
# title: Runner ingress denied message
# description: docs/contract.md, "Codes and messages".
ingress_denied_message := "Sandbox lease does not grant runner WebSocket ingress."

# METADATA
# title: Unregistered driver message
# description: docs/contract.md, "Codes and messages" with the driver name inserted as given.
not_registered_message(driver) := concat("", ["Environment driver \"", driver, "\" is not registered in the environment runtime yet."])

# METADATA
# title: Duplex unsupported message
# description: docs/contract.md, "Codes and messages" with the driver name inserted as given.
duplex_unsupported_message(driver) := concat("", ["Environment driver \"", driver, "\" does not support duplex channels."])

# METADATA
# title: Runner ingress unsupported message
# description: docs/contract.md, "Codes and messages" with the driver name inserted as given.
ingress_unsupported_message(driver) := concat("", ["Environment driver \"", driver, "\" does not support runner ingress."])

# METADATA
# title: Grant document
# description: docs/contract.md, "The decision document" on a grant.
grant(trues) := {
	"allow": true,
	"code": "",
	"message": "",
	"reasons": [],
	"capabilities": caps(trues),
}

# METADATA
# title: Deny document
# description: docs/contract.md, "The decision document" on a deny.
deny(code, message, reasons, trues) := {
	"allow": false,
	"code": code,
	"message": message,
	"reasons": reasons,
	"capabilities": caps(trues),
}

# METADATA
# title: Duplex capability deny
# description: openDuplexChannel denied at the capability step.
duplex_denied(reasons, trues) := deny("DUPLEX_CHANNEL_CAPABILITY_DENIED", duplex_denied_message, reasons, trues)

# METADATA
# title: Runner ingress capability deny
# description: getRunnerIngressEndpoint denied at the capability step.
ingress_denied(reasons, trues) := deny("RUNNER_INGRESS_CAPABILITY_DENIED", ingress_denied_message, reasons, trues)

# METADATA
# title: Evaluation failed (openDuplexChannel)
# description: docs/contract.md, "Precise rules" Failures for the default operation.
evaluation_failed_doc := duplex_denied(["evaluation_failed"], set())

# METADATA
# title: Evaluation failed (getRunnerIngressEndpoint)
# description: docs/contract.md, "Precise rules" Failures for the runner ingress operation.
ingress_evaluation_failed_doc := ingress_denied(["evaluation_failed"], set())

# METADATA
# title: Input with one value replaced
# description: |
#   doc with the JSON pointer path set to value (json.patch add: replaces an existing member);
#   unlike object.union, an empty object here really empties the member.
set_path(doc, path, value) := json.patch(doc, [{"op": "add", "path": path, "value": value}])

# METADATA
# title: contract example 14 input
# description: getRunnerIngressEndpoint on the plugin driver, method and declaration present.
row14 := plugin_driver({
	"operation": "getRunnerIngressEndpoint",
	"facts": {
		"plugin": {"manifest": {"environmentDrivers": [object.union(daytona_entry, {"sandboxCapabilities": {"runnerWebSocketIngress": true}})]}},
		"worker": {"supportedMethods": ["environmentRunnerIngressEndpoint"]},
	},
})
