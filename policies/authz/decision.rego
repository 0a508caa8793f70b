# METADATA
# title: Sandbox capability gate
# description: |
#   Decides whether a sandbox lease may perform an operation (open a duplex command stream, get the
#   runner ingress endpoint) and which of the capabilities of data.authz.tables.capabilities the
#   lease is entitled to. The input is assembled by the host (docs/input-document.md). Everything
#   defaults to deny.
#
#   The rules are shaped for cost: the common lease (a plugin-backed sandbox lease whose facts
#   confirm it) has its snapshot in one rule body that reads each fact once and keeps its
#   intermediate values in local variables, one object.subset per capability
#   (_common_capabilities), and its reasons in another (_common_reasons); the decision evaluates
#   the snapshot once, for a grant or a deny. Other leases go through _general_capabilities,
#   _confirmed and _general_reasons, and the rules that explain a deny (checks, codes, reasons,
#   identity failures) are only evaluated when the decision denies.
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
	"capabilities": caps,
} if {
	# The common grant reads _common_capabilities itself (capabilities would cost it a rule
	# lookup more, about a dozen allocations); the common deny, next, finds it evaluated.
	tables.drivers[input.resolved.driver].operations[input.operation]
	caps := _common_capabilities
	caps[tables.operations[input.operation].capability] == true
} else := {
	"allow": false,
	"code": denial.code,
	"message": replace(denial.message, "%s", input.resolved.driver),
	"reasons": _common_reasons(operation.capability),
	"capabilities": caps,
} if {
	# The common deny: the driver is registered and supports the operation, so the first
	# failing check is the capability's (what code, message and reasons find on the last
	# branch, without evaluating every check). The general grant, next, cannot grant what
	# the common snapshot withholds (the snapshots agree).
	tables.drivers[input.resolved.driver].operations[input.operation]
	caps := _common_capabilities
	operation := tables.operations[input.operation]
	not caps[operation.capability] == true
	"capability_granted" in operation.checks
	denial := operation.denials.capability_granted
} else := {
	"allow": true,
	"code": "",
	"message": "",
	"reasons": [],
	"capabilities": caps,
} if {
	tables.drivers[input.resolved.driver].operations[input.operation]
	caps := capabilities
	caps[tables.operations[input.operation].capability] == true
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

allow if decision.allow == true

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
# description: |
#   Every capability of the capability table, each a boolean: the common lease's
#   (_common_capabilities) when it is one, else _general_capabilities. A decision evaluates it
#   once, for a grant and a deny alike.
capabilities := caps if {
	caps := _common_capabilities
} else := _general_capabilities

# METADATA
# title: General snapshot
# description: |
#   The capability snapshot of any lease. A capability is granted when the driver class supports
#   capabilities, the facts confirm the lease's identity (_confirmed), and _snapshot grants it
#   from the verified methods and the declarations.
_general_capabilities := _snapshot(methods, declarations, _unnarrowed) if {
	tables.drivers[input.resolved.driver].capabilities == true
	[methods, declarations] := _confirmed
} else := {k: false | some k, _ in tables.capabilities}

# METADATA
# title: Common snapshot
# description: |
#   The capability snapshot of the common lease, a plugin-backed sandbox lease whose pinned
#   plugin is ready with exactly one entry, of kind sandbox_provider, for the provider key:
#   _confirmed, _ready_entry, _worker_methods, _entry_declarations and _snapshot spelled out
#   rather than called (calling _ready_entry here costs a decision about 50 more allocations and
#   a tenth more CPU time, BenchmarkEvaluate). What it leaves out (a manifest with more than its
#   one entry, an entry with the legacy supportsReusableLeases) only leaves it undefined;
#   capabilities then decides exactly. Tests hold it to the general snapshot
#   (test_common_grant_*, test_common_path_*, TestCommonPathAgreesWithTheGeneralPath).
_common_capabilities := caps if {
	driver := tables.drivers[input.resolved.driver]
	driver.capabilities == true
	driver.identity == "sandbox_provider"
	input.resolved.pluginBacked == true
	key := input.resolved.providerKey
	is_string(key)
	key != ""
	pinned := input.resolved.pluginId
	is_string(pinned)
	pinned != ""
	plugin := input.facts.plugin
	plugin.id == pinned
	plugin.status == "ready"
	[entry] := plugin.manifest.environmentDrivers
	entry.driverKey == key
	entry.kind == "sandbox_provider"
	sandbox_capabilities := object.get(entry, "sandboxCapabilities", {})
	is_object(sandbox_capabilities)
	object.get(entry, "supportsReusableLeases", null) == null
	facts := object.union({"optIn": false}, {
		"methods": {m | supported := input.facts.worker.supportedMethods; is_array(supported); some m in supported},
		"narrowedBy": _unnarrowed,
	})
	capability_table := tables.capabilities
	declared := {k: object.subset(object.get({true: object.union(facts, {"optIn": cap.optIn})}, [v], {}), cap) |
		some k, v in sandbox_capabilities
		v != null
		cap := capability_table[k]
	}
	caps := object.union({k: object.subset(facts, cap) | some k, cap in capability_table}, declared)
}

# METADATA
# title: Snapshot of confirmed facts
# description: |
#   The capability snapshot of a lease whose identity the facts confirm, from its verified methods
#   (a set of strings), declarations (an object without nulls) and unnarrowed (the narrowing
#   flags that are not set, _unnarrowed). One pass over the capability table with one
#   object.subset per capability: a capability is granted when its entry is a subset of the
#   facts, {"optIn": false, "methods": the verified methods, "narrowedBy": unnarrowed}. So its
#   methods must all be verified, none of its flags true, and it must be ordinary; a declaration
#   changes the facts for its key: declared exactly true, the facts carry the capability's own
#   optIn (so opt-in is allowed); declared anything else, the facts are {} (never granted). The
#   decision's first branch computes the same for a plugin-backed lease.
_snapshot(methods, declarations, unnarrowed) := {k: object.subset(object.get(declared, k, facts), cap) |
	some k, cap in tables.capabilities
} if {
	facts := object.union({"optIn": false}, {"methods": methods, "narrowedBy": unnarrowed})
	declared := {k: f |
		some k, v in declarations
		cap := tables.capabilities[k]
		f := object.get({true: object.union(facts, {"optIn": cap.optIn})}, [v], {})
	}
}

# METADATA
# title: Unnarrowed flags
# description: The narrowing flags (data.authz.tables.narrowing_flags) that are not exactly true in the input.
_unnarrowed := tables.narrowing_flags - {f | some f, v in input.narrowing; v == true}

# METADATA
# title: Worker methods
# description: The string elements of the worker's live supportedMethods (none unless it is an array).
_worker_methods := {m |
	supported := input.facts.worker.supportedMethods
	is_array(supported)
	some m in supported
	is_string(m)
}

# METADATA
# title: Entry declarations
# description: |
#   The declarations of a manifest entry: its sandboxCapabilities (declarations) without nulls,
#   with the legacy supportsReusableLeases standing for reusableLeases when that key is absent or
#   null.
_entry_declarations(entry, declarations) := object.union(
	{"reusableLeases": v | v := entry.supportsReusableLeases; v != null},
	{k: v | some k, v in declarations; v != null},
)

# METADATA
# title: Confirmed identity
# description: |
#   [verified methods, declarations] of a lease tied to a provider or plugin entry that the facts
#   confirm (every identity check of _identity_failure passes); undefined otherwise. Plugin paths:
#   the pinned plugin is ready and has exactly one well-formed entry for the looked-up key (of
#   kind sandbox_provider on the plugin-backed path); the worker's live methods (string elements
#   only) verify; the entry's declarations (_entry_declarations) declare. Built-in path: the
#   provider record's flags verify (data.authz.tables.builtinProviderMethods) and its
#   supportsReusableLeases, when a boolean, declares reusableLeases.
_confirmed := [_worker_methods, _entry_declarations(entry, object.get(entry, "sandboxCapabilities", {}))] if {
	tables.drivers[input.resolved.driver].identity == "sandbox_provider"
	input.resolved.pluginBacked == true
	entry := _ready_entry(input.facts.plugin, input.resolved.pluginId, input.resolved.providerKey)
	entry.kind == "sandbox_provider"
} else := [_worker_methods, _entry_declarations(entry, object.get(entry, "sandboxCapabilities", {}))] if {
	tables.drivers[input.resolved.driver].identity == "plugin_driver"
	entry := _ready_entry(input.facts.plugin, input.resolved.pluginId, input.resolved.driverKey)
} else := [_builtin_methods(provider), _builtin_declarations(provider)] if {
	tables.drivers[input.resolved.driver].identity == "sandbox_provider"
	not input.resolved.pluginBacked == true
	_has_provider
	provider := input.facts.builtinProvider
	is_object(provider)
}

# METADATA
# title: Ready entry
# description: |
#   The manifest entry for key of plugin (the facts' plugin record), pinned by id: when plugin is
#   ready and has exactly one matching entry (_matching_entries), whose sandboxCapabilities is
#   absent or an object.
_ready_entry(plugin, pinned, key) := entry if {
	plugin.status == "ready"
	[entry] := _matching_entries(plugin, pinned, key)
	is_object(object.get(entry, "sandboxCapabilities", {}))
}

# METADATA
# title: Matching entries
# description: |
#   The object entries of plugin's manifest environmentDrivers (when it is an array) whose
#   driverKey equals key, of any kind, in manifest order. Undefined unless pinned and key are
#   non-empty strings and plugin is exactly the plugin pinned (its id is pinned).
_matching_entries(plugin, pinned, key) := [e |
	some e in environment_drivers
	e.driverKey == key
	is_object(e)
] if {
	_non_empty(key)
	_non_empty(pinned)
	plugin.id == pinned
	environment_drivers := plugin.manifest.environmentDrivers
	is_array(environment_drivers)
}

# METADATA
# title: Built-in provider methods
# description: The methods data.authz.tables.builtinProviderMethods grants for each flag of the provider that is true.
_builtin_methods(provider) := {m |
	some flag, methods in tables.builtinProviderMethods
	provider[flag] == true
	some m in methods
}

# METADATA
# title: Built-in declarations
# description: supportsReusableLeases as the reusableLeases declaration, when it is a boolean.
_builtin_declarations(provider) := {"reusableLeases": v | v := provider.supportsReusableLeases; is_boolean(v)}

# ---------------------------------------------------------------------------------------------
# The rules below explain a deny; a grant never evaluates them.

# METADATA
# title: Reasons a capability is withheld
# description: |
#   For one capability: capability_unsupported_by_driver alone for a driver class without
#   capabilities; else the first failed identity check alone; else every applicable reason among
#   worker_not_running / method_not_verified, capability_not_declared and capability_narrowed.
#   The common lease's are read in one body (_common_reasons), any other's by the rules
#   (_general_reasons).
capability_reasons(k) := reasons if {
	reasons := _common_reasons(k)
} else := _general_reasons(k)

# METADATA
# title: Reasons a capability is withheld, any lease
# description: capability_reasons of any lease, by the contract's rules one by one.
_general_reasons(k) := ["capability_unsupported_by_driver"] if {
	not _supported[k]
} else := [_identity_failure] if {
	_identity_failure
} else := _reasons_after_identity(k)

# METADATA
# title: Reasons of the common lease
# description: |
#   capability_reasons of a capability of the table for the common lease (_common_capabilities
#   is defined): its driver class supports every capability and every identity check passes,
#   so the reasons are those of _reasons_after_identity, read here from the input in one body
#   rather than through _methods, _declarations and _entry. Tests hold it to the general
#   explanation (test_common_path_*, TestCommonPathAgreesWithTheGeneralPath).
_common_reasons(k) := [r | some r in tables.reasons; applicable[r]] if {
	_common_capabilities
	cap := tables.capabilities[k]
	verified := object.subset(
		{m | supported := input.facts.worker.supportedMethods; is_array(supported); some m in supported},
		cap.methods,
	)
	v := object.get(input.facts.plugin.manifest.environmentDrivers[0], ["sandboxCapabilities", k], null)
	declared := object.get({null: cap.optIn == false, true: true}, [v], false)
	applicable := union({
		{"worker_not_running" | not verified; not _worker_present},
		{"method_not_verified" | not verified; _worker_present},
		{"capability_not_declared" | not declared},
		{"capability_narrowed" | some flag in cap.narrowedBy; input.narrowing[flag] == true},
	})
}

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

_check_passes("capability_granted") if capabilities[_operation.capability] == true

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
	tables.drivers[input.resolved.driver].identity == "plugin_driver"
} else := "plugin_backed" if {
	tables.drivers[input.resolved.driver].identity == "sandbox_provider"
	input.resolved.pluginBacked == true
} else := "builtin" if {
	tables.drivers[input.resolved.driver].identity == "sandbox_provider"
}

# METADATA
# title: Plugin path
# description: The paths that read a pinned plugin and its worker.
_plugin_path if _path != "builtin"

# METADATA
# title: First failed identity check
# description: |
#   The identity checks in order; the first failure is the only reason. Undefined when every
#   check passes.
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
#   plugin-backed path, the driver key on the plugin driver.
_entry_key := input.resolved.providerKey if {
	_path == "plugin_backed"
} else := input.resolved.driverKey if {
	_path == "plugin_driver"
}

# METADATA
# title: Entries for the key
# description: The pinned plugin's entries for the looked-up key (_matching_entries); none when undefined.
default _entries := []

_entries := _matching_entries(input.facts.plugin, input.resolved.pluginId, _entry_key)

# METADATA
# title: The entry
# description: The one matching entry; undefined when there are none or several.
_entry := entries[0] if {
	entries := _entries
	count(entries) == 1
}

# METADATA
# title: Declaration shape
# description: The entry's sandboxCapabilities is absent or an object.
_capabilities_shape_ok if is_object(object.get(_entry, "sandboxCapabilities", {}))

# METADATA
# title: Worker present
# description: |
#   The input carries a worker object. (A negated call such as `not is_object(x)` over a missing
#   path is undefined, not true, so every negation here goes through a positive helper.)
_worker_present if is_object(input.facts.worker)

# METADATA
# title: Verified methods
# description: |
#   As _confirmed reads them, whether or not the identity holds: the worker's live methods on
#   plugin paths, the methods of the provider's flags on the built-in path.
default _methods := set()

_methods := _worker_methods if {
	_plugin_path
} else := _builtin_methods(input.facts.builtinProvider) if {
	_path == "builtin"
}

# METADATA
# title: Declarations
# description: As _confirmed reads them, whether or not the identity holds.
default _declarations := {}

_declarations := _entry_declarations(_entry, object.get(_entry, "sandboxCapabilities", {})) if {
	_plugin_path
} else := _builtin_declarations(input.facts.builtinProvider) if {
	_path == "builtin"
}

# METADATA
# title: Reasons after the identity checks
# description: |
#   The reasons among worker_not_running / method_not_verified, capability_not_declared and
#   capability_narrowed that apply to capability k (of the table), in the order of the reasons
#   table, read in one body: not verified (not every method of k in _methods, as in _snapshot)
#   with no running worker on a plugin path, or with one; not allowed by the declarations (a
#   declared true allows, any other declared value withholds, no declaration allows an ordinary
#   capability and withholds an opt-in one); a narrowing flag of k exactly true in the input.
_reasons_after_identity(k) := [r | some r in tables.reasons; applicable[r]] if {
	cap := tables.capabilities[k]
	verified := object.subset(_methods, cap.methods)
	declared := object.get(_declarations, k, cap.optIn == false) == true
	applicable := union({
		{"worker_not_running" | not verified; _worker_missing},
		{"method_not_verified" | not verified; not _worker_missing},
		{"capability_not_declared" | not declared},
		{"capability_narrowed" | some flag in cap.narrowedBy; input.narrowing[flag] == true},
	})
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
