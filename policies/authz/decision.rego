# METADATA
# title: Sandbox capability gate
# description: |
#   Decides whether a sandbox lease may perform an operation (open a duplex command stream, get the
#   runner ingress endpoint) and which of the nine capabilities the lease is entitled to. The input
#   is assembled by the host (docs/input-document.md); the tables are in data.authz.tables.
#   Everything defaults to deny.
package authz

import data.authz.tables

# METADATA
# title: Decision document
# description: |
#   The decision of SPEC section 8 without decision_id and revision (the host adds those). When
#   the input has no known operation or a part of the decision is undefined, the default document
#   denies with reason evaluation_failed and no capability.
# entrypoint: true
default decision := {
	"allow": false,
	"code": "DUPLEX_CHANNEL_CAPABILITY_DENIED",
	"message": "Sandbox lease does not grant the duplex command stream capability.",
	"reasons": ["evaluation_failed"],
	"capabilities": {
		"reusableLeases": false,
		"nativeSyncIn": false,
		"nativeSyncOut": false,
		"persistentProcessSessions": false,
		"independentControlCommands": false,
		"incrementalSessionOutput": false,
		"concurrentSyncOperations": false,
		"duplexCommandStream": false,
		"runnerWebSocketIngress": false,
	},
}

decision := {
	"allow": allow,
	"code": code,
	"message": message,
	"reasons": reasons,
	"capabilities": capabilities,
} if {
	_operation
	_driver
}

decision := object.union(_evaluation_failed, {
	"code": _operation.denials.capability_granted.code,
	"message": _operation.denials.capability_granted.message,
}) if {
	_operation
	not _driver
}

# METADATA
# title: Evaluation failed
# description: The document of a decision that cannot be made (SPEC section 11, "Failures").
_evaluation_failed := {
	"allow": false,
	"reasons": ["evaluation_failed"],
	"capabilities": {k: false | some k, _ in tables.capabilities},
}

# METADATA
# title: Allow
# description: True only when the operation is known and none of its checks fails.
default allow := false

allow if {
	_operation
	count(_failed_checks) == 0
}

# METADATA
# title: Deny code
# description: The code of the first failing check of the operation; empty on a grant.
default code := ""

code := _operation.denials[_first_failure].code

# METADATA
# title: Deny message
# description: The message of the first failing check, with the driver name inserted as given.
default message := ""

message := replace(_operation.denials[_first_failure].message, "%s", _driver)

# METADATA
# title: Reasons
# description: Why the decision denies (closed list, data.authz.tables.reasons); empty on a grant.
default reasons := []

reasons := ["driver_not_registered"] if _first_failure == "driver_registered"

reasons := ["operation_unsupported_by_driver"] if _first_failure == "operation_supported"

reasons := capability_reasons(_operation.capability) if _first_failure == "capability_granted"

# METADATA
# title: Capability snapshot
# description: The nine capabilities the lease is entitled to now, each a boolean (SPEC section 2).
capabilities := {k: v | some k, _ in tables.capabilities; v := k in _granted}

# METADATA
# title: Reasons a capability is withheld
# description: |
#   For one capability: capability_unsupported_by_driver alone for a driver class without
#   capabilities; else the first failed identity check alone; else every applicable reason among
#   worker_not_running / method_not_verified, capability_not_declared and capability_narrowed.
capability_reasons(k) := ["capability_unsupported_by_driver"] if {
	not _supported[k]
} else := [_identity_failure] if {
	_identity_failure
} else := [r | some r in tables.reasons; _capability_reason(k, r)]

# METADATA
# title: Requested operation
# description: The table entry of the input's operation; undefined for an unknown operation.
_operation := tables.operations[input.operation]

# METADATA
# title: Driver
# description: The driver the host resolved from the lease (SPEC section 5, step 1).
_driver := input.resolved.driver if is_string(input.resolved.driver)

# METADATA
# title: Failed checks
# description: The operation's checks that fail, in the operation's order.
_failed_checks := [c | some c in _operation.checks; _check_fails(c)]

# METADATA
# title: First failed check
# description: The check whose deny answers the request.
_first_failure := _failed_checks[0]

# METADATA
# title: Check outcomes
# description: A check fails unless its positive condition holds, so a missing input fails it.
_check_fails("driver_registered") if not _registered

_check_fails("operation_supported") if not _operation_supported

_check_fails("capability_granted") if not _capability_granted

# METADATA
# title: Driver is registered
# description: The resolved driver is in the driver table.
_registered if tables.drivers[_driver]

# METADATA
# title: Driver supports the operation
# description: The operation is in the driver's operation set.
_operation_supported if tables.drivers[_driver].operations[input.operation]

# METADATA
# title: Capability granted
# description: The operation's capability is exactly true in the snapshot.
_capability_granted if capabilities[_operation.capability] == true

# METADATA
# title: Granted capabilities
# description: |
#   supported AND identity AND verified AND declared AND not narrowed (SPEC section 2), computed
#   once per decision as set operations over the capability table.
default _granted := set()

_granted := ((_supported & _verified) & _declared) - _narrowed if _identity_ok

# METADATA
# title: Supported capabilities
# description: local and ssh support none; sandbox and plugin all nine (the driver table).
default _supported := set()

_supported := tables.drivers[_driver].capabilities

# METADATA
# title: Path
# description: |
#   How the lease is tied to the facts: builtin (sandbox driver, built-in provider),
#   plugin_backed (sandbox driver, provider from a pinned plugin) or plugin_driver.
_path := "builtin" if {
	tables.drivers[_driver].identity == "sandbox_provider"
	not input.resolved.pluginBacked == true
}

_path := "plugin_backed" if {
	tables.drivers[_driver].identity == "sandbox_provider"
	input.resolved.pluginBacked == true
}

_path := "plugin_driver" if tables.drivers[_driver].identity == "plugin_driver"

# METADATA
# title: Plugin path
# description: The paths that read a pinned plugin and its worker.
_plugin_path if _path == "plugin_backed"

_plugin_path if _path == "plugin_driver"

# METADATA
# title: Sandbox path
# description: The paths of the sandbox driver class, which need a provider key.
_sandbox_path if tables.drivers[_driver].identity == "sandbox_provider"

# METADATA
# title: First failed identity check
# description: |
#   The identity checks in SPEC order (section 11); the first failure is the only reason.
#   Undefined when every check passes.
_identity_failure := "no_provider" if {
	_sandbox_path
	not _has_provider
} else := "plugin_not_pinned" if {
	_plugin_path
	not _pinned
} else := "plugin_not_found" if {
	_plugin_path
	not _plugin_found
} else := "plugin_not_ready" if {
	_plugin_path
	not input.facts.plugin.status == "ready"
} else := "driver_entry_invalid" if {
	_plugin_path
	count(_entries) > 1
} else := "driver_entry_invalid" if {
	_plugin_path
	_entry
	not _capabilities_shape_ok
} else := "driver_entry_missing" if {
	_plugin_path
	count(_entries) == 0
} else := "driver_entry_missing" if {
	_path == "plugin_backed"
	not _entry.kind == "sandbox_provider"
} else := "builtin_provider_unknown" if {
	_path == "builtin"
	not _builtin_present
}

# METADATA
# title: Identity holds
# description: The lease is tied to a provider or plugin entry that the facts confirm.
_identity_ok if {
	_path
	not _identity_failure
}

# METADATA
# title: Built-in provider present
# description: The facts hold a built-in provider record for the provider key.
_builtin_present if is_object(input.facts.builtinProvider)

# METADATA
# title: Provider key present
# description: The host found a non-empty provider key.
_has_provider if _non_empty(input.resolved.providerKey)

# METADATA
# title: Plugin pinned
# description: The lease pins a plugin id (and, on the plugin driver, a driver key).
_pinned if {
	_path == "plugin_backed"
	_non_empty(input.resolved.pluginId)
}

_pinned if {
	_path == "plugin_driver"
	_non_empty(input.resolved.pluginId)
	_non_empty(input.resolved.driverKey)
}

# METADATA
# title: Pinned plugin found
# description: The facts hold the plugin with exactly the pinned id, never another one.
_plugin_found if input.facts.plugin.id == input.resolved.pluginId

# METADATA
# title: Entry key
# description: The driver key looked up in the pinned plugin's manifest.
_entry_key := input.resolved.providerKey if _path == "plugin_backed"

_entry_key := input.resolved.driverKey if _path == "plugin_driver"

# METADATA
# title: Manifest entries
# description: The manifest's environmentDrivers when it is an array; none otherwise.
default _manifest_entries := []

_manifest_entries := input.facts.plugin.manifest.environmentDrivers if {
	is_array(input.facts.plugin.manifest.environmentDrivers)
}

# METADATA
# title: Matching entries
# description: The object entries whose driverKey equals the looked-up key (any kind).
_entries := [e | some e in _manifest_entries; is_object(e); e.driverKey == _entry_key]

# METADATA
# title: The entry
# description: The one matching entry; undefined when there are none or several.
_entry := _entries[0] if count(_entries) == 1

# METADATA
# title: Declaration shape
# description: The entry's sandboxCapabilities is absent or an object.
default _capabilities_shape_ok := false

_capabilities_shape_ok if {
	_entry
	not _declares_capabilities
}

_capabilities_shape_ok if is_object(_entry.sandboxCapabilities)

# METADATA
# title: Entry has sandboxCapabilities
# description: The entry has the key sandboxCapabilities, whatever its value (null included).
_declares_capabilities if "sandboxCapabilities" in object.keys(_entry)

# METADATA
# title: Worker missing
# description: A plugin path with no running worker for the pinned plugin.
_worker_missing if {
	_plugin_path
	not _worker_present
}

# METADATA
# title: Worker present
# description: |
#   The input carries a worker object. (A negated call such as `not is_object(x)` over a missing
#   path is undefined, not true, so every negation here goes through a positive helper.)
_worker_present if is_object(input.facts.worker)

# METADATA
# title: Verified methods
# description: |
#   Plugin paths: the worker's live methods (string elements only). Built-in path: the methods
#   data.authz.tables.builtinProviderMethods grants for each flag of the provider that is true.
_verified_methods contains m if {
	_plugin_path
	is_array(input.facts.worker.supportedMethods)
	some m in input.facts.worker.supportedMethods
	is_string(m)
}

_verified_methods contains m if {
	_path == "builtin"
	some flag, methods in tables.builtinProviderMethods
	input.facts.builtinProvider[flag] == true
	some m in methods
}

# METADATA
# title: Verified capabilities
# description: Every requirement group has at least one method in the verified methods.
_verified := _all_capabilities - _unverified

# METADATA
# title: Unverified capabilities
# description: Capabilities with a requirement group none of whose methods is verified.
_unverified contains k if {
	some k, cap in tables.capabilities
	some group in cap.methods
	count(group & _verified_methods) == 0
}

# METADATA
# title: All capabilities
# description: The keys of the capability table.
_all_capabilities := {k | some k, _ in tables.capabilities}

# METADATA
# title: Declarations
# description: |
#   The declared values, null ones left out. Plugin paths: the entry's sandboxCapabilities, with
#   the legacy supportsReusableLeases standing for reusableLeases when that key is absent or null.
#   Built-in path: supportsReusableLeases when it is a boolean.
_declarations := object.union(_nested_declarations, _legacy_declarations)

# METADATA
# title: Entry declarations
# description: The entry's sandboxCapabilities without null values.
default _nested_declarations := {}

_nested_declarations := {k: v | some k, v in _entry.sandboxCapabilities; v != null} if {
	_plugin_path
	is_object(_entry.sandboxCapabilities)
}

# METADATA
# title: Legacy declaration
# description: supportsReusableLeases (entry or built-in provider) as the reusableLeases declaration.
default _legacy_declarations := {}

_legacy_declarations := {"reusableLeases": v} if {
	_plugin_path
	not _nested_declares_reusable
	v := _entry.supportsReusableLeases
	v != null
}

_legacy_declarations := {"reusableLeases": v} if {
	_path == "builtin"
	v := input.facts.builtinProvider.supportsReusableLeases
	is_boolean(v)
}

# METADATA
# title: Entry declares reusableLeases
# description: sandboxCapabilities.reusableLeases is present and not null.
_nested_declares_reusable if "reusableLeases" in object.keys(_nested_declarations)

# METADATA
# title: Declared keys
# description: The capabilities that have a declared value (of any type).
_declared_keys := {k | some k, _ in _declarations}

# METADATA
# title: Capabilities the declaration allows
# description: |
#   A declared true allows; any other declared value (false, a string, a number) withholds; no
#   declaration allows ordinary capabilities and withholds opt-in ones.
_declared contains k if {
	some k, _ in tables.capabilities
	_declarations[k] == true
}

_declared contains k if {
	some k, cap in tables.capabilities
	cap.optIn == false
	not _declared_keys[k]
}

# METADATA
# title: Narrowed capabilities
# description: A narrowing flag of the capability is exactly true in the input.
_narrowed contains k if {
	some k, cap in tables.capabilities
	some flag in cap.narrowedBy
	input.narrowing[flag] == true
}

# METADATA
# title: Capability reason applies
# description: Whether a reason after the identity checks applies to capability k.
_capability_reason(k, "worker_not_running") if {
	not _verified[k]
	_worker_missing
}

_capability_reason(k, "method_not_verified") if {
	not _verified[k]
	not _worker_missing
}

_capability_reason(k, "capability_not_declared") if not _declared[k]

_capability_reason(k, "capability_narrowed") if _narrowed[k]

# METADATA
# title: Non-empty string
# description: A JSON string of length at least one.
_non_empty(s) if {
	is_string(s)
	s != ""
}
