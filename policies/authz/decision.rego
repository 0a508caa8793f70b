# METADATA
# title: Sandbox capability gate
# description: |
#   Decides whether a sandbox lease may perform an operation (open a duplex command stream, get the
#   runner ingress endpoint) and which of the capabilities of data.authz.tables.capabilities the
#   lease is entitled to. The input is assembled by the host (docs/input-document.md). Everything
#   defaults to deny.
#
#   The rules are shaped for cost: the grant path evaluates each fact once, as set operations over
#   the capability table, and the rules that explain a deny (reasons, codes, identity failures)
#   are only evaluated when the decision denies.
package authz

import data.authz.tables

# METADATA
# title: Decision document
# description: |
#   The decision document without decision_id and revision (the host adds those). When the input
#   has no known operation or no driver, the document denies with reason evaluation_failed and
#   every capability false. The default is the last line of defence for broken tables (no
#   capability table to list the keys from); the host reads it as a malformed result and denies.
# entrypoint: true
default decision := {
	"allow": false,
	"code": "DUPLEX_CHANNEL_CAPABILITY_DENIED",
	"message": "Sandbox lease does not grant the duplex command stream capability.",
	"reasons": ["evaluation_failed"],
	"capabilities": {},
}

decision := {
	"allow": true,
	"code": "",
	"message": "",
	"reasons": [],
	"capabilities": capabilities,
} if {
	allow
} else := {
	"allow": false,
	"code": code,
	"message": message,
	"reasons": reasons,
	"capabilities": capabilities,
} if {
	_operation
	_driver
} else := _evaluation_failed

# METADATA
# title: Evaluation failed
# description: |
#   The document of a decision that cannot be made: the operation's capability-denied code and
#   message (the duplex channel's for an unknown operation), every capability false.
_evaluation_failed := {
	"allow": false,
	"code": _failed_denial.code,
	"message": _failed_denial.message,
	"reasons": ["evaluation_failed"],
	"capabilities": {k: false | some k, _ in tables.capabilities},
}

# METADATA
# title: Denial of a failed evaluation
# description: The capability-denied denial of the operation, or of openDuplexChannel when unknown.
_failed_denial := _operation.denials.capability_granted if {
	_operation
} else := tables.operations.openDuplexChannel.denials.capability_granted

# METADATA
# title: Allow
# description: |
#   True only when the driver is registered, supports the operation, and the operation's
#   capability is granted. The operation's `checks` order these three checks for a deny; a grant
#   needs all three whatever the table lists.
default allow := false

allow if {
	_driver_entry.operations[input.operation]
	_operation.capability in _granted
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
# description: Every capability of the capability table, each a boolean.
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
# description: The driver the host resolved from the lease.
_driver := input.resolved.driver if is_string(input.resolved.driver)

# METADATA
# title: Driver entry
# description: The driver table's entry of the resolved driver; undefined when not registered.
_driver_entry := tables.drivers[_driver]

# METADATA
# title: Failed checks
# description: The operation's checks that fail, in the operation's order.
_failed_checks := [c | some c in _operation.checks; not _check_passes(c)]

# METADATA
# title: First failed check
# description: The check whose deny answers the request.
_first_failure := _failed_checks[0]

# METADATA
# title: Check outcomes
# description: |
#   A check passes only when its positive condition holds, so a missing input fails it: the driver
#   is registered; the driver supports the operation; the operation's capability is exactly true.
_check_passes("driver_registered") if _driver_entry

_check_passes("operation_supported") if _driver_entry.operations[input.operation]

_check_passes("capability_granted") if _operation.capability in _granted

# METADATA
# title: Granted capabilities
# description: |
#   supported AND identity AND verified AND declared AND not narrowed, as set operations over the
#   capability table.
default _granted := set()

_granted := ((_supported - _unverified) & _declared) - _narrowed if _identity_ok

# METADATA
# title: Supported capabilities
# description: |
#   The capabilities the driver class can have at all: every capability of the capability table
#   when the driver table says so, none otherwise.
default _supported := set()

_supported := object.keys(tables.capabilities) if _driver_entry.capabilities == true

# METADATA
# title: Path
# description: |
#   How the lease is tied to the facts: plugin_driver (a plugin's environment driver),
#   plugin_backed (sandbox driver, provider from a pinned plugin) or builtin (sandbox driver,
#   built-in provider). Undefined for a driver class tied to nothing.
_path := "plugin_driver" if {
	_driver_entry.identity == "plugin_driver"
} else := "plugin_backed" if {
	_driver_entry.identity == "sandbox_provider"
	input.resolved.pluginBacked == true
} else := "builtin" if {
	_driver_entry.identity == "sandbox_provider"
}

# METADATA
# title: Plugin path
# description: The paths that read a pinned plugin and its worker.
_plugin_path if _path != "builtin"

# METADATA
# title: Identity holds
# description: |
#   The lease is tied to a provider or plugin entry that the facts confirm: every identity check
#   of _identity_failure passes, written positively so that the grant path never walks the
#   failure chain.
_identity_ok if {
	_path == "builtin"
	_has_provider
	is_object(input.facts.builtinProvider)
}

_identity_ok if {
	_path == "plugin_backed"
	input.facts.plugin.status == "ready"
	_entry.kind == "sandbox_provider"
	_capabilities_shape_ok
}

_identity_ok if {
	_path == "plugin_driver"
	input.facts.plugin.status == "ready"
	_capabilities_shape_ok
}

# METADATA
# title: First failed identity check
# description: |
#   The identity checks in order; the first failure is the only reason. Undefined when every
#   check passes. Evaluated only to explain a deny.
_identity_failure := "no_provider" if {
	_path != "plugin_driver"
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
# description: |
#   The driver key looked up in the pinned plugin's manifest: the provider key on the
#   plugin-backed path, the driver key on the plugin driver. Undefined unless the lease pins the
#   plugin (and the key) as non-empty strings and the facts hold exactly that plugin.
_entry_key := key if {
	_path == "plugin_backed"
	key := input.resolved.providerKey
	is_string(key)
	key != ""
	_plugin_found
	is_string(input.resolved.pluginId)
	input.resolved.pluginId != ""
}

_entry_key := key if {
	_path == "plugin_driver"
	key := input.resolved.driverKey
	is_string(key)
	key != ""
	_plugin_found
	is_string(input.resolved.pluginId)
	input.resolved.pluginId != ""
}

# METADATA
# title: Matching entries
# description: |
#   The object entries of the manifest's environmentDrivers (when it is an array) whose driverKey
#   equals the looked-up key, of any kind.
default _entries := []

_entries := [e |
	some e in input.facts.plugin.manifest.environmentDrivers
	e.driverKey == key
	is_object(e)
] if {
	key := _entry_key
	is_array(input.facts.plugin.manifest.environmentDrivers)
}

# METADATA
# title: The entry
# description: The one matching entry; undefined when there are none or several.
_entry := _entries[0] if count(_entries) == 1

# METADATA
# title: Declaration shape
# description: The entry's sandboxCapabilities is absent or an object.
_capabilities_shape_ok if is_object(_entry.sandboxCapabilities)

_capabilities_shape_ok if {
	_entry
	not _declares_capabilities
}

# METADATA
# title: Entry has sandboxCapabilities
# description: The entry has the key sandboxCapabilities, whatever its value (null included).
_declares_capabilities if "sandboxCapabilities" in object.keys(_entry)

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
default _methods := set()

_methods := {m | some m in input.facts.worker.supportedMethods; is_string(m)} if {
	_plugin_path
	is_array(input.facts.worker.supportedMethods)
}

_methods := {m |
	some flag, methods in tables.builtinProviderMethods
	input.facts.builtinProvider[flag] == true
	some m in methods
} if _path == "builtin"

# METADATA
# title: Unverified capabilities
# description: Capabilities with a requirement group none of whose methods is verified.
_unverified contains k if {
	some k, cap in tables.capabilities
	some group in cap.methods
	group & _methods == set()
}

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
	not "reusableLeases" in object.keys(_nested_declarations)
	v := _entry.supportsReusableLeases
	v != null
}

_legacy_declarations := {"reusableLeases": v} if {
	_path == "builtin"
	v := input.facts.builtinProvider.supportsReusableLeases
	is_boolean(v)
}

# METADATA
# title: Capabilities the declaration allows
# description: |
#   A declared true allows; any other declared value (false, a string, a number) withholds; no
#   declaration allows ordinary capabilities and withholds opt-in ones.
_declared := (_ordinary - object.keys(_declarations)) | {k | some k, v in _declarations; v == true}

# METADATA
# title: Ordinary capabilities
# description: The capabilities that are not opt-in.
_ordinary := {k | some k, cap in tables.capabilities; cap.optIn == false}

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
	not _verified(k)
	_plugin_path
	not _worker_present
}

_capability_reason(k, "method_not_verified") if {
	not _verified(k)
	not _worker_missing
}

_capability_reason(k, "capability_not_declared") if not k in _declared

_capability_reason(k, "capability_narrowed") if k in _narrowed

# METADATA
# title: Capability verified
# description: A capability of the table whose every requirement group has a verified method.
_verified(k) if {
	tables.capabilities[k]
	not k in _unverified
}

# METADATA
# title: Worker missing
# description: A plugin path with no running worker for the pinned plugin.
_worker_missing if {
	_plugin_path
	not _worker_present
}

# METADATA
# title: Non-empty string
# description: A JSON string of length at least one.
_non_empty(s) if {
	is_string(s)
	s != ""
}
