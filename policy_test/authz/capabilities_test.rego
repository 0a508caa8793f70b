# Capability snapshot
#
# docs/contract.md, "The nine capabilities" and "Resolving the snapshot": all nine capabilities (supported AND verified AND declared AND not
# narrowed), narrowing flags per capability, strict booleans, the legacy supportsReusableLeases
# field, the built-in path, the plugin driver, and worker methods in odd shapes.
package authz_test

import data.authz
import data.authz.tables

# ---------------------------------------------------------------------------------------------
# All nine, and each one on its own

test_all_nine_computed if {
	snap := authz.capabilities with input as row12
	snap == caps(capability_keys)
}

test_common_grant_agrees_with_the_snapshot if {
	# the decision's first branch (a plugin-backed grant) spells out the snapshot: for every
	# narrowing flag, alone and all together, its document carries the same capabilities
	flags := data.authz.tables.narrowing_flags
	count(flags) > 0
	every narrowing in array.concat([{}, {f: true | some f in flags}], [{f: true} | some f in flags]) {
		inp := json.patch(row12, [{"op": "replace", "path": "/narrowing", "value": object.union({f: false | some f in flags}, narrowing)}])
		d := authz.decision with input as inp
		snap := authz.capabilities with input as inp
		d.capabilities == snap
	}
	d := authz.decision with input as row12
	d.allow == true
	d.capabilities == caps(capability_keys)
}

test_common_grant_agrees_on_every_manifest if {
	# the decision's first branch looks up the pinned plugin's entry itself (as _ready_entry
	# does): on every shape of plugin and manifest it grants what the snapshot grants, or
	# leaves the decision to the next branch
	entry := object.union(daytona_entry, {"sandboxCapabilities": all_declared})
	other := object.union(entry, {"driverKey": "other"})
	patches := [
		[],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [other, entry]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [entry, entry]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": ["daytona", entry]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": {"daytona": entry}}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [object.union(entry, {"kind": "environment_driver"})]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [object.union(entry, {"supportsReusableLeases": false})]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [object.remove(entry, {"sandboxCapabilities"})]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [object.union(entry, {"sandboxCapabilities": "all"})]}],
		[{"op": "replace", "path": "/facts/plugin/id", "value": "other.plugin"}],
		[{"op": "replace", "path": "/facts/plugin/status", "value": "starting"}],
		[{"op": "replace", "path": "/resolved/pluginId", "value": ""}],
		[{"op": "replace", "path": "/resolved/providerKey", "value": ""}],
		[{"op": "replace", "path": "/resolved/providerKey", "value": "other"}],
	]
	every patch in patches {
		inp := json.patch(row12, patch)
		d := authz.decision with input as inp
		snap := authz.capabilities with input as inp
		d.capabilities == snap
		d.allow == snap.duplexCommandStream
	}
}

test_common_grant_reads_the_flags_from_the_table if {
	# a narrowing flag added to the tables removes its capability in the common grant exactly
	# when the input sets it true, as in the snapshot
	table := object.union(data.authz.tables.capabilities, {"gpuPassthrough": {"methods": {"duplexChannelOpen"}, "optIn": false, "narrowedBy": {"gpuUnavailable"}}})
	flags := data.authz.tables.narrowing_flags | {"gpuUnavailable"}
	every flag, granted in {false: true, true: false} {
		inp := json.patch(row12, [{"op": "add", "path": "/narrowing/gpuUnavailable", "value": flag}])
		d := authz.decision with input as inp with data.authz.tables.capabilities as table with data.authz.tables.narrowing_flags as flags
		snap := authz.capabilities with input as inp with data.authz.tables.capabilities as table with data.authz.tables.narrowing_flags as flags
		d.allow == true
		d.capabilities.gpuPassthrough == granted
		d.capabilities == snap
	}
}

test_common_path_agrees_on_the_worker if {
	# _common_capabilities and _common_reasons (the common lease read in one body each) agree
	# with the general snapshot and reasons for every capability, on grants and denies: a grant,
	# no worker, no methods
	every patch in [
		[],
		[{"op": "remove", "path": "/facts/worker"}],
		[{"op": "replace", "path": "/facts/worker/supportedMethods", "value": []}],
	] {
		common_path_agrees(json.patch(row12, patch))
	}
}

test_common_path_agrees_on_odd_methods if {
	# the same with methods of odd shapes, and with no declaration at all (an empty
	# sandboxCapabilities, none)
	every patch in [
		[{"op": "replace", "path": "/facts/worker/supportedMethods", "value": "duplexChannelOpen"}],
		[{"op": "replace", "path": "/facts/worker/supportedMethods", "value": ["duplexChannelOpen", 1, null]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [object.union(daytona_entry, {"sandboxCapabilities": {}})]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [object.remove(daytona_entry, {"sandboxCapabilities"})]}],
	] {
		common_path_agrees(json.patch(row12, patch))
	}
}

test_common_path_agrees_on_declarations if {
	# the same with every declaration true, false, a string, a number and null in turn
	values := [true, false, "true", 1, null]
	every j, _ in values {
		declarations := {k: values[(i + j) % count(values)] | some i, k in capability_keys}
		entry := object.union(daytona_entry, {"sandboxCapabilities": declarations})
		common_path_agrees(json.patch(row12, [{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [entry]}]))
	}
}

test_common_path_agrees_on_narrowing if {
	# the same with each narrowing flag set
	flags := data.authz.tables.narrowing_flags
	count(flags) > 0
	every flag in flags {
		common_path_agrees(json.patch(row12, [{"op": "replace", "path": "/narrowing", "value": object.union({f: false | some f in flags}, {flag: true})}]))
	}
}

test_common_path_undefined_elsewhere if {
	# where the lease is not the common one, the common path is undefined and the general one decides
	entry := object.union(daytona_entry, {"sandboxCapabilities": all_declared})
	every patch in [
		[{"op": "replace", "path": "/facts/plugin/status", "value": "starting"}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [entry, entry]}],
		[{"op": "replace", "path": "/facts/plugin/manifest/environmentDrivers", "value": [object.union(entry, {"supportsReusableLeases": false})]}],
		[{"op": "replace", "path": "/resolved/pluginId", "value": ""}],
	] {
		inp := json.patch(row12, patch)
		not authz._common_capabilities with input as inp
		common_reasons == {} with input as inp
	}
}

# METADATA
# title: Common path agrees
# description: The common snapshot and reasons of inp are defined and equal the general ones.
common_path_agrees(inp) if {
	[common, general, reasons, general_reasons_] := [authz._common_capabilities, authz._general_capabilities, common_reasons, general_reasons] with input as inp
	common == general
	reasons == general_reasons_
	count(reasons) == count(capability_keys)
}

# METADATA
# title: The reasons of _common_reasons for every capability it is defined for
common_reasons := {k: r | some k in capability_keys; r := authz._common_reasons(k)}

# METADATA
# title: The reasons of _general_reasons for every capability
general_reasons := {k: authz._general_reasons(k) | some k in capability_keys}

test_capability_narrowed_by_an_unknown_flag_is_never_granted if {
	# a narrowedBy flag that is not among the narrowing flags (the host never computes it) fails
	# closed: the capability is never granted, on either branch
	table := object.union(data.authz.tables.capabilities, {"gpuPassthrough": {"methods": {"duplexChannelOpen"}, "optIn": false, "narrowedBy": {"gpuUnavailable"}}})
	every inp in [row12, json.patch(row12, [{"op": "add", "path": "/narrowing/gpuUnavailable", "value": false}])] {
		d := authz.decision with input as inp with data.authz.tables.capabilities as table
		snap := authz.capabilities with input as inp with data.authz.tables.capabilities as table
		d.allow == true
		d.capabilities.gpuPassthrough == false
		d.capabilities == snap
	}
}

test_each_capability_needs_its_methods if {
	every k in capability_keys {
		every m in data.authz.tables.capabilities[k].methods {
			snap := authz.capabilities with input as full_methods([x | some x in all_methods; x != m])
			snap[k] == false
		}
	}
}

test_only_capabilities_needing_a_method_lose_it if {
	snap := authz.capabilities with input as full_methods([x | some x in all_methods; x != "environmentExecute"])
	snap == caps([k | some k in capability_keys; not k in {"persistentProcessSessions", "independentControlCommands", "incrementalSessionOutput"}])
}

test_requirement_groups_all_needed if {
	# every capability needs every one of the methods the table lists for it
	every k, c in tables.capabilities {
		with_all := authz.capabilities with input as full_methods([m | some m in c.methods])
		with_all[k] == true
		every m in c.methods {
			without := authz.capabilities with input as full_methods([x | some x in c.methods; x != m])
			without[k] == false
		}
	}
}

test_each_capability_verified_alone if {
	expected := {
		"environmentExecute": {"persistentProcessSessions", "independentControlCommands", "incrementalSessionOutput"},
		"environmentSyncOut": {"nativeSyncOut"},
		"duplexChannelOpen": {"duplexCommandStream"},
		"environmentRunnerIngressEndpoint": {"runnerWebSocketIngress"},
	}
	every m, trues in expected {
		snap := authz.capabilities with input as full_methods([m])
		snap == caps(trues)
	}
}

test_declaration_false_removes_each if {
	every k in capability_keys {
		snap := authz.capabilities with input as full_declared(object.union(all_declared, {k: false}))
		snap == caps([x | some x in capability_keys; x != k])
		authz.capability_reasons(k) == ["capability_not_declared"] with input as full_declared(object.union(all_declared, {k: false}))
	}
}

test_no_declaration_ordinary_true_opt_in_false if {
	snap := authz.capabilities with input as full_declared({})
	snap == caps({"reusableLeases", "nativeSyncIn", "nativeSyncOut", "persistentProcessSessions", "independentControlCommands"})
}

test_null_declaration_is_absent if {
	snap := authz.capabilities with input as full_declared({k: null | some k in capability_keys})
	snap == caps({"reusableLeases", "nativeSyncIn", "nativeSyncOut", "persistentProcessSessions", "independentControlCommands"})
}

test_declaration_never_grants_unverified if {
	snap := authz.capabilities with input as full_methods([])
	snap == caps_none
	every k in capability_keys {
		authz.capability_reasons(k) == ["method_not_verified"] with input as full_methods([])
	}
}

test_snapshot_always_nine_booleans if {
	every inp in [{}, fixture_f, row12, row14, builtin_f, plugin_driver_f, with_declared(null), f({"resolved": {"driver": "foo"}})] {
		snap := authz.capabilities with input as inp
		count(snap) == 9
		every k in capability_keys {
			is_boolean(snap[k])
		}
	}
}

# ---------------------------------------------------------------------------------------------
# Narrowing flags, per capability

test_narrowing_lease_policy_not_reusable if {
	snap := authz.capabilities with input as full({"lease": {"leasePolicy": "ephemeral"}, "narrowing": {"leasePolicyNotReusable": true}})
	snap == caps([k | some k in capability_keys; k != "reusableLeases"])
}

test_narrowing_native_sync_unavailable if {
	snap := authz.capabilities with input as full({"lease": {"metadata": {"nativeFileSyncUnsupported": true}}, "narrowing": {"nativeSyncUnavailable": true}})
	snap == caps([k | some k in capability_keys; not k in {"nativeSyncIn", "nativeSyncOut"}])
}

test_narrowing_config_resolution_failed if {
	snap := authz.capabilities with input as full({"narrowing": {"configResolutionFailed": true}})
	snap == caps([k | some k in capability_keys; not k in {"persistentProcessSessions", "incrementalSessionOutput", "duplexCommandStream"}])
}

test_narrowing_all_flags if {
	inp := full({"narrowing": {"leasePolicyNotReusable": true, "nativeSyncUnavailable": true, "configResolutionFailed": true}})
	snap := authz.capabilities with input as inp
	snap == caps({"independentControlCommands", "concurrentSyncOperations", "runnerWebSocketIngress"})
	every k in ["reusableLeases", "nativeSyncIn", "nativeSyncOut", "persistentProcessSessions", "incrementalSessionOutput", "duplexCommandStream"] {
		authz.capability_reasons(k) == ["capability_narrowed"] with input as inp
	}
}

test_narrowing_never_removes_independent_concurrent_ingress if {
	inp := full({"narrowing": {"leasePolicyNotReusable": true, "nativeSyncUnavailable": true, "configResolutionFailed": true}})
	every k in ["independentControlCommands", "concurrentSyncOperations", "runnerWebSocketIngress"] {
		authz.capabilities[k] == true with input as inp
	}
}

test_narrowing_applies_on_plugin_driver if {
	inp := full({
		"lease": {"metadata": {"driver": "plugin", "driverKey": "daytona", "backend": "job"}},
		"resolved": {"driver": "plugin", "driverKey": "daytona"},
		"narrowing": {"nativeSyncUnavailable": true, "leasePolicyNotReusable": true},
	})
	snap := authz.capabilities with input as inp
	snap == caps([k | some k in capability_keys; not k in {"nativeSyncIn", "nativeSyncOut", "reusableLeases"}])
}

test_narrowing_applies_on_builtin if {
	b := {"execute": true, "supportsReusableLeases": true}
	reuse := authz.capabilities with input as object.union(builtin_provider(b), {"narrowing": {"leasePolicyNotReusable": false}})
	reuse == caps({"reusableLeases", "persistentProcessSessions", "independentControlCommands"})
	narrowed := authz.capabilities with input as builtin_provider(b)
	narrowed == caps({"persistentProcessSessions", "independentControlCommands"})
}

test_narrowing_flags_not_literal_true_do_not_narrow if {
	# every boolean is true only when it is the literal true: these flags are not set
	every v in ["true", 1, null, "yes", {}, [true], false] {
		inp := full({"narrowing": {"leasePolicyNotReusable": v, "nativeSyncUnavailable": v, "configResolutionFailed": v}})
		snap := authz.capabilities with input as inp
		snap == caps(capability_keys)
	}
}

test_narrowing_flags_not_literal_never_grant if {
	# a non-boolean flag cannot give back what verification or declaration withholds
	every v in ["false", 0, null, false] {
		inp := object.union(with_methods([]), {"narrowing": {"leasePolicyNotReusable": v, "nativeSyncUnavailable": v, "configResolutionFailed": v}})
		d := authz.decision with input as inp
		d == duplex_denied(["method_not_verified"], set())
	}
}

# ---------------------------------------------------------------------------------------------
# Strict booleans everywhere a boolean is read

test_strict_declarations if {
	every v in ["true", 1, "yes", {}, [true], "TRUE"] {
		snap := authz.capabilities with input as full_declared({k: v | some k in capability_keys})
		snap == caps_none
	}
}

test_strict_plugin_backed if {
	# pluginBacked not the literal true: the built-in path, never the plugin's declaration
	every v in ["true", 1, null, "yes", {}] {
		d := authz.decision with input as full({"resolved": {"pluginBacked": v}})
		d == duplex_denied(["builtin_provider_unknown"], set())
	}
}

test_strict_plugin_backed_with_builtin_record if {
	every v in ["true", 1, null] {
		d := authz.decision with input as full({"resolved": {"pluginBacked": v}, "facts": {"builtinProvider": {"execute": true}}})
		d == duplex_denied(["method_not_verified", "capability_not_declared"], {"persistentProcessSessions", "independentControlCommands"})
	}
}

test_strict_builtin_flags if {
	every v in ["true", 1, null, "yes", {}, [true]] {
		snap := authz.capabilities with input as object.union(
			builtin_provider({"execute": v, "supportsReusableLeases": v}),
			{"narrowing": {"leasePolicyNotReusable": false}},
		)
		snap == caps_none
	}
}

test_strict_legacy_field if {
	every v in ["true", 1, "yes", {}, [true]] {
		inp := full({"facts": {"plugin": {"manifest": {"environmentDrivers": [{
			"driverKey": "daytona",
			"kind": "sandbox_provider",
			"supportsReusableLeases": v,
			"sandboxCapabilities": object.remove(all_declared, ["reusableLeases"]),
		}]}}}})
		authz.capabilities.reusableLeases == false with input as inp
		authz.capability_reasons("reusableLeases") == ["capability_not_declared"] with input as inp
	}
}

# ---------------------------------------------------------------------------------------------
# Legacy supportsReusableLeases

# METADATA
# title: Legacy entry
# description: The row 12 input whose one entry has sandboxCapabilities sc plus the given legacy fields.
legacy_input(sc, legacy) := full({"facts": {"plugin": {"manifest": {"environmentDrivers": [object.union(
	{"driverKey": "daytona", "kind": "sandbox_provider", "sandboxCapabilities": sc},
	legacy,
)]}}}})

# METADATA
# title: Reusable leases under a legacy entry
# description: snapshot.reusableLeases for legacy_input(sc, legacy).
legacy_reusable(sc, legacy) := v if {
	v := authz.capabilities.reusableLeases with input as legacy_input(sc, legacy)
}

test_legacy_stands_for_absent_nested_key if {
	nested := object.remove(all_declared, ["reusableLeases"])
	legacy_reusable(nested, {"supportsReusableLeases": true}) == true
	legacy_reusable(nested, {"supportsReusableLeases": false}) == false
	authz.capability_reasons("reusableLeases") == ["capability_not_declared"] with input as legacy_input(nested, {"supportsReusableLeases": false})
}

test_legacy_stands_for_null_nested_key if {
	nested := object.union(all_declared, {"reusableLeases": null})
	legacy_reusable(nested, {"supportsReusableLeases": false}) == false
	legacy_reusable(nested, {"supportsReusableLeases": true}) == true
}

test_legacy_nested_key_wins if {
	legacy_reusable(all_declared, {"supportsReusableLeases": false}) == true
	nested_false := object.union(all_declared, {"reusableLeases": false})
	legacy_reusable(nested_false, {"supportsReusableLeases": true}) == false
}

test_legacy_null_is_absent if {
	nested := object.remove(all_declared, ["reusableLeases"])

	# reusableLeases is an ordinary key: absent means allowed
	legacy_reusable(nested, {"supportsReusableLeases": null}) == true
	legacy_reusable(object.union(nested, {"reusableLeases": null}), {"supportsReusableLeases": null}) == true
}

test_legacy_non_boolean_counts_false if {
	nested := object.remove(all_declared, ["reusableLeases"])
	every v in ["true", 1, 0, {}, [], "false"] {
		legacy_reusable(nested, {"supportsReusableLeases": v}) == false
	}
}

test_legacy_without_sandbox_capabilities if {
	inp := full({"facts": {"plugin": {"manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider", "supportsReusableLeases": false}]}}}})
	snap := authz.capabilities with input as inp
	snap == caps({"nativeSyncIn", "nativeSyncOut", "persistentProcessSessions", "independentControlCommands"})
}

test_legacy_only_reusable_leases if {
	nested := object.remove(all_declared, ["reusableLeases"])
	snap := authz.capabilities with input as legacy_input(nested, {"supportsReusableLeases": false})
	snap == caps([k | some k in capability_keys; k != "reusableLeases"])
}

test_legacy_on_plugin_driver if {
	inp := full({
		"lease": {"metadata": {"driver": "plugin", "driverKey": "daytona"}},
		"resolved": {"driver": "plugin", "driverKey": "daytona"},
		"facts": {"plugin": {"manifest": {"environmentDrivers": [{
			"driverKey": "daytona",
			"kind": "environment_driver",
			"supportsReusableLeases": false,
			"sandboxCapabilities": object.remove(all_declared, ["reusableLeases"]),
		}]}}},
	})
	snap := authz.capabilities with input as inp
	snap == caps([k | some k in capability_keys; k != "reusableLeases"])
}

# ---------------------------------------------------------------------------------------------
# Built-in path

test_builtin_execute if {
	snap := authz.capabilities with input as builtin_f
	snap == caps({"persistentProcessSessions", "independentControlCommands"})
}

test_builtin_supports_reusable_leases if {
	inp := object.union(builtin_provider({"execute": true, "supportsReusableLeases": true}), {
		"lease": {"leasePolicy": "reuse_by_environment"},
		"narrowing": {"leasePolicyNotReusable": false},
	})
	snap := authz.capabilities with input as inp
	snap == caps({"reusableLeases", "persistentProcessSessions", "independentControlCommands"})
}

test_builtin_reusable_only if {
	inp := object.union(builtin_provider({"supportsReusableLeases": true}), {"narrowing": {"leasePolicyNotReusable": false}})
	snap := authz.capabilities with input as inp
	snap == caps({"reusableLeases"})
}

test_builtin_reusable_false_declares_false if {
	inp := object.union(builtin_provider({"execute": true, "supportsReusableLeases": false}), {"narrowing": {"leasePolicyNotReusable": false}})
	authz.capability_reasons("reusableLeases") == ["method_not_verified", "capability_not_declared"] with input as inp
}

test_builtin_reusable_non_boolean_is_not_a_declaration if {
	# not a boolean: no declaration (ordinary key allowed) but also not verified
	inp := object.union(builtin_provider({"execute": true, "supportsReusableLeases": "true"}), {"narrowing": {"leasePolicyNotReusable": false}})
	authz.capability_reasons("reusableLeases") == ["method_not_verified"] with input as inp
}

test_builtin_never_opt_in if {
	every k in ["concurrentSyncOperations", "duplexCommandStream", "runnerWebSocketIngress"] {
		authz.capability_reasons(k) == ["method_not_verified", "capability_not_declared"] with input as builtin_f
	}

	# environmentExecute is verified, but the opt-in key is never declared on the built-in path
	authz.capability_reasons("incrementalSessionOutput") == ["capability_not_declared"] with input as builtin_f
}

test_builtin_never_duplex if {
	# the built-in path never verifies duplexChannelOpen, whatever the record or the worker say
	inp := builtin_provider({
		"execute": true,
		"supportsReusableLeases": true,
		"duplexChannelOpen": true,
		"duplexCommandStream": true,
		"methods": all_methods,
		"supportedMethods": all_methods,
		"sandboxCapabilities": all_declared,
	})
	d := authz.decision with input as object.union(inp, {"facts": {"worker": {"supportedMethods": all_methods}}})
	d.allow == false
	d.capabilities.duplexCommandStream == false
	d.reasons == ["method_not_verified", "capability_not_declared"]
}

test_builtin_ignores_pinned_plugin if {
	# the pinned plugin and its worker are in the input but the built-in path never reads them
	inp := object.union(builtin_f, {"facts": {
		"plugin": {"manifest": {"environmentDrivers": [{"driverKey": "fake", "kind": "sandbox_provider", "sandboxCapabilities": all_declared}]}},
		"worker": {"supportedMethods": all_methods},
	}})
	snap := authz.capabilities with input as inp
	snap == caps({"persistentProcessSessions", "independentControlCommands"})
}

# ---------------------------------------------------------------------------------------------
# Plugin driver

test_plugin_driver_reads_any_entry_kind if {
	every kind in ["environment_driver", "sandbox_provider", "other", null] {
		d := authz.decision with input as plugin_driver_entries([{"driverKey": "daytona", "kind": kind, "sandboxCapabilities": {"duplexCommandStream": true}}])
		d == grant({"duplexCommandStream"})
	}
}

test_plugin_driver_entry_without_kind if {
	d := authz.decision with input as plugin_driver_entries([{"driverKey": "daytona", "sandboxCapabilities": {"duplexCommandStream": true}}])
	d == grant({"duplexCommandStream"})
}

test_plugin_driver_looks_up_driver_key_not_provider if {
	# the lease's provider is "daytona" but the plugin driver looks up driverKey "runner"
	inp := object.union(plugin_driver_f, {
		"resolved": {"driverKey": "runner"},
		"facts": {"plugin": {"manifest": {"environmentDrivers": [
			{"driverKey": "daytona", "kind": "sandbox_provider"},
			{"driverKey": "runner", "kind": "environment_driver", "sandboxCapabilities": {"duplexCommandStream": true}},
		]}}},
	})
	d := authz.decision with input as inp
	d == grant({"duplexCommandStream"})
}

test_plugin_driver_needs_no_provider if {
	d := authz.decision with input as plugin_driver({"resolved": {"providerKey": "", "pluginBacked": false}})
	d == grant({"duplexCommandStream"})
}

test_plugin_driver_all_nine if {
	inp := full({
		"lease": {"metadata": {"driver": "plugin", "driverKey": "daytona"}},
		"resolved": {"driver": "plugin", "driverKey": "daytona"},
	})
	snap := authz.capabilities with input as inp
	snap == caps(capability_keys)
}

# ---------------------------------------------------------------------------------------------
# Worker methods in odd shapes

test_methods_not_an_array if {
	every ms in ["duplexChannelOpen", {"duplexChannelOpen": true}, null, true, 1] {
		d := authz.decision with input as with_methods(ms)
		d == duplex_denied(["method_not_verified"], set())
	}
}

test_methods_absent if {
	d := authz.decision with input as f_without(["facts/worker/supportedMethods"])
	d == duplex_denied(["method_not_verified"], set())
}

test_methods_non_string_elements if {
	d := authz.decision with input as with_methods([1, null, true, {"method": "duplexChannelOpen"}, ["duplexChannelOpen"], {"duplexChannelOpen": true}])
	d == duplex_denied(["method_not_verified"], set())
}

test_methods_mixed_elements if {
	d := authz.decision with input as with_methods([1, null, "duplexChannelOpen", ["x"]])
	d == grant({"duplexCommandStream"})
}

test_methods_exact_names if {
	every m in ["DuplexChannelOpen", "duplexchannelopen", " duplexChannelOpen", "duplexChannelOpen ", "duplexChannel"] {
		d := authz.decision with input as with_methods([m])
		d == duplex_denied(["method_not_verified"], set())
	}
}

test_methods_set_or_object_with_method_keys if {
	# a worker record that is not the array shape grants nothing, on the plugin driver too
	d := authz.decision with input as plugin_driver({"facts": {"worker": {"supportedMethods": {"0": "duplexChannelOpen"}}}})
	d == duplex_denied(["method_not_verified"], set())
}

test_plugin_id_mismatch_denies_everything if {
	every inp in [
		full({"facts": {"plugin": {"id": "other.plugin"}}}),
		full({"resolved": {"pluginId": "other.plugin"}}),
	] {
		d := authz.decision with input as inp
		d == duplex_denied(["plugin_not_found"], set())
	}
}
