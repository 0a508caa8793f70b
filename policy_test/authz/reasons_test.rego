# Reason codes
#
# Every reason code of docs/contract.md, "Precise rules" with the exact reasons array (order matters), the
# identity-check order (first failure alone), worker_not_running replacing only
# method_not_verified, and a test per reason with an empty input (no reason path can grant on
# missing input).
package authz_test

import data.authz
import data.authz.tables

# ---------------------------------------------------------------------------------------------
# driver_not_registered

test_driver_not_registered_open_duplex if {
	d := authz.decision with input as f({"resolved": {"driver": "foo"}})
	d == deny("ENVIRONMENT_DRIVER_NOT_REGISTERED", not_registered_message("foo"), ["driver_not_registered"], set())
}

test_driver_not_registered_runner_ingress if {
	d := authz.decision with input as f({"operation": "getRunnerIngressEndpoint", "resolved": {"driver": "foo"}})
	d == deny("ENVIRONMENT_DRIVER_NOT_REGISTERED", not_registered_message("foo"), ["driver_not_registered"], set())
}

test_driver_not_registered_is_case_sensitive if {
	every driver in ["Sandbox", "PLUGIN", " sandbox", "sandbox ", "Local", ""] {
		d := authz.decision with input as f({"resolved": {"driver": driver}})
		d == deny("ENVIRONMENT_DRIVER_NOT_REGISTERED", not_registered_message(driver), ["driver_not_registered"], set())
	}
}

test_driver_not_registered_reason_alone if {
	# every later check would fail too: the registration deny carries its reason alone
	d := authz.decision with input as f({
		"resolved": {"driver": "foo", "providerKey": "", "pluginId": ""},
		"facts": {"plugin": {"status": "disabled"}, "worker": {"supportedMethods": []}},
		"narrowing": {"configResolutionFailed": true},
	})
	d.reasons == ["driver_not_registered"]
	d.code == "ENVIRONMENT_DRIVER_NOT_REGISTERED"
}

# ---------------------------------------------------------------------------------------------
# operation_unsupported_by_driver

test_operation_unsupported_local_and_ssh_open_duplex if {
	every driver in ["local", "ssh"] {
		d := authz.decision with input as f({"resolved": {"driver": driver}})
		d == deny("DUPLEX_CHANNEL_UNSUPPORTED", duplex_unsupported_message(driver), ["operation_unsupported_by_driver"], set())
	}
}

test_operation_unsupported_plugin_runner_ingress if {
	d := authz.decision with input as row14
	d.reasons == ["operation_unsupported_by_driver"]
	d.code == "RUNNER_INGRESS_UNSUPPORTED"
}

# ---------------------------------------------------------------------------------------------
# capability_unsupported_by_driver

test_capability_unsupported_local_and_ssh_runner_ingress if {
	# getRunnerIngressEndpoint checks the capability before driver support
	every driver in ["local", "ssh"] {
		d := authz.decision with input as f({"operation": "getRunnerIngressEndpoint", "resolved": {"driver": driver}})
		d == ingress_denied(["capability_unsupported_by_driver"], set())
	}
}

test_capability_unsupported_alone_for_every_capability if {
	every driver in ["local", "ssh"] {
		every k in capability_keys {
			authz.capability_reasons(k) == ["capability_unsupported_by_driver"] with input as row12
				with input.resolved.driver as driver
		}
	}
}

test_capability_unsupported_even_with_everything_verified if {
	d := authz.decision with input as full({"operation": "getRunnerIngressEndpoint", "resolved": {"driver": "local"}})
	d == ingress_denied(["capability_unsupported_by_driver"], set())
}

# ---------------------------------------------------------------------------------------------
# no_provider

test_no_provider_plugin_backed if {
	d := authz.decision with input as f({"resolved": {"providerKey": ""}})
	d == duplex_denied(["no_provider"], set())
}

test_no_provider_builtin if {
	d := authz.decision with input as builtin({"resolved": {"providerKey": ""}})
	d == duplex_denied(["no_provider"], set())
}

test_no_provider_not_a_string if {
	every key in [null, 1, true, ["daytona"], {"daytona": true}] {
		d := authz.decision with input as f({"resolved": {"providerKey": key}})
		d == duplex_denied(["no_provider"], set())
	}
}

test_no_provider_absent if {
	d := authz.decision with input as f_without(["resolved/providerKey"])
	d == duplex_denied(["no_provider"], set())
}

test_no_provider_runner_ingress if {
	d := authz.decision with input as full({"operation": "getRunnerIngressEndpoint", "resolved": {"providerKey": ""}})
	d == ingress_denied(["no_provider"], set())
}

# ---------------------------------------------------------------------------------------------
# plugin_not_pinned

test_plugin_not_pinned_plugin_backed if {
	every pin in ["", null, 7, true, ["test.plugin"]] {
		d := authz.decision with input as f({"resolved": {"pluginId": pin}})
		d == duplex_denied(["plugin_not_pinned"], set())
	}
}

test_plugin_not_pinned_absent if {
	d := authz.decision with input as f_without(["resolved/pluginId"])
	d == duplex_denied(["plugin_not_pinned"], set())
}

test_plugin_not_pinned_plugin_driver_without_plugin_id if {
	d := authz.decision with input as plugin_driver({"resolved": {"pluginId": ""}})
	d == duplex_denied(["plugin_not_pinned"], set())
}

test_plugin_not_pinned_plugin_driver_without_driver_key if {
	every key in ["", null, 1] {
		d := authz.decision with input as plugin_driver({"resolved": {"driverKey": key}})
		d == duplex_denied(["plugin_not_pinned"], set())
	}
}

test_plugin_not_pinned_plugin_driver_driver_key_absent if {
	d := authz.decision with input as json.remove(plugin_driver_f, ["resolved/driverKey"])
	d == duplex_denied(["plugin_not_pinned"], set())
}

# ---------------------------------------------------------------------------------------------
# plugin_not_found

test_plugin_not_found_absent if {
	d := authz.decision with input as f_without(["facts/plugin"])
	d == duplex_denied(["plugin_not_found"], set())
}

test_plugin_not_found_id_mismatch if {
	# a plugin that declares the same key but is not the pinned one is never read
	every id in ["other.plugin", "Test.Plugin", "test.plugin ", "", null, 1] {
		d := authz.decision with input as f({"facts": {"plugin": {"id": id}}})
		d == duplex_denied(["plugin_not_found"], set())
	}
}

test_plugin_not_found_id_mismatch_plugin_driver if {
	d := authz.decision with input as plugin_driver({"facts": {"plugin": {"id": "other.plugin"}}})
	d == duplex_denied(["plugin_not_found"], set())
}

test_plugin_not_found_plugin_without_id if {
	d := authz.decision with input as f_without(["facts/plugin/id"])
	d == duplex_denied(["plugin_not_found"], set())
}

# ---------------------------------------------------------------------------------------------
# plugin_not_ready

test_plugin_not_ready_every_other_status if {
	every status in ["installed", "disabled", "error", "upgrade_pending", "uninstalled", "Ready", "READY", " ready", "", null, true, 1, "unknown"] {
		d := authz.decision with input as f({"facts": {"plugin": {"status": status}}})
		d == duplex_denied(["plugin_not_ready"], set())
	}
}

test_plugin_not_ready_status_absent if {
	d := authz.decision with input as f_without(["facts/plugin/status"])
	d == duplex_denied(["plugin_not_ready"], set())
}

test_plugin_not_ready_plugin_driver if {
	d := authz.decision with input as plugin_driver({"facts": {"plugin": {"status": "error"}}})
	d == duplex_denied(["plugin_not_ready"], set())
}

# ---------------------------------------------------------------------------------------------
# driver_entry_invalid

test_driver_entry_invalid_duplicate_driver_key if {
	d := authz.decision with input as with_entries([daytona_entry, daytona_entry])
	d == duplex_denied(["driver_entry_invalid"], set())
}

test_driver_entry_invalid_duplicate_driver_key_whatever_kinds if {
	d := authz.decision with input as with_entries([
		daytona_entry,
		{"driverKey": "daytona", "kind": "environment_driver"},
	])
	d == duplex_denied(["driver_entry_invalid"], set())
}

test_driver_entry_invalid_duplicate_driver_key_plugin_driver if {
	d := authz.decision with input as plugin_driver_entries([
		{"driverKey": "daytona", "kind": "environment_driver", "sandboxCapabilities": {"duplexCommandStream": true}},
		{"driverKey": "daytona", "kind": "sandbox_provider"},
	])
	d == duplex_denied(["driver_entry_invalid"], set())
}

test_driver_entry_invalid_sandbox_capabilities_null if {
	d := authz.decision with input as with_declared(null)
	d == duplex_denied(["driver_entry_invalid"], set())
}

test_driver_entry_invalid_sandbox_capabilities_not_object if {
	every sc in ["duplexCommandStream", true, 1, [], ["duplexCommandStream"]] {
		d := authz.decision with input as with_declared(sc)
		d == duplex_denied(["driver_entry_invalid"], set())
	}
}

test_driver_entry_invalid_plugin_driver_sandbox_capabilities_null if {
	d := authz.decision with input as plugin_driver_entries([{"driverKey": "daytona", "kind": "environment_driver", "sandboxCapabilities": null}])
	d == duplex_denied(["driver_entry_invalid"], set())
}

test_driver_entry_invalid_other_keys_do_not_count if {
	# entries with other driver keys, and non-object elements, are not duplicates
	d := authz.decision with input as with_entries([
		{"driverKey": "other", "kind": "sandbox_provider"},
		"daytona",
		daytona_entry,
		{"driverKey": "Daytona", "kind": "sandbox_provider"},
		{"driverKey": "other", "kind": "sandbox_provider", "sandboxCapabilities": null},
	])
	d == grant({"duplexCommandStream"})
}

# ---------------------------------------------------------------------------------------------
# driver_entry_missing

test_driver_entry_missing_no_entries if {
	d := authz.decision with input as with_entries([])
	d == duplex_denied(["driver_entry_missing"], set())
}

test_driver_entry_missing_other_driver_key if {
	every key in ["other", "Daytona", "daytona ", null, 1] {
		d := authz.decision with input as with_entry({"driverKey": key})
		d == duplex_denied(["driver_entry_missing"], set())
	}
}

test_driver_entry_missing_wrong_kind_on_sandbox_path if {
	every kind in ["environment_driver", "Sandbox_Provider", "sandbox-provider", "", null, 1] {
		d := authz.decision with input as with_entry({"kind": kind})
		d == duplex_denied(["driver_entry_missing"], set())
	}
}

test_driver_entry_missing_kind_absent_on_sandbox_path if {
	d := authz.decision with input as with_entries([{"driverKey": "daytona", "sandboxCapabilities": {"duplexCommandStream": true}}])
	d == duplex_denied(["driver_entry_missing"], set())
}

test_driver_entry_missing_manifest_missing if {
	d := authz.decision with input as f_without(["facts/plugin/manifest"])
	d == duplex_denied(["driver_entry_missing"], set())
}

test_driver_entry_missing_manifest_malformed if {
	every manifest in [null, "x", 1, [], [daytona_entry], {}, {"environmentDrivers": null}, {"environmentDrivers": "daytona"}, {"environmentDrivers": {"daytona": daytona_entry}}, {"environmentDriver": [daytona_entry]}] {
		d := authz.decision with input as object.union(f_without(["facts/plugin/manifest"]), {"facts": {"plugin": {"manifest": manifest}}})
		d == duplex_denied(["driver_entry_missing"], set())
	}
}

test_driver_entry_missing_entry_not_an_object if {
	every entry in [null, "daytona", 1, true, [daytona_entry], ["daytona", "sandbox_provider"]] {
		d := authz.decision with input as with_entries([entry])
		d == duplex_denied(["driver_entry_missing"], set())
	}
}

test_driver_entry_missing_plugin_driver if {
	d := authz.decision with input as plugin_driver({"resolved": {"driverKey": "other"}})
	d == duplex_denied(["driver_entry_missing"], set())
}

test_driver_entry_missing_plugin_driver_manifest_missing if {
	d := authz.decision with input as json.remove(plugin_driver_f, ["facts/plugin/manifest"])
	d == duplex_denied(["driver_entry_missing"], set())
}

# ---------------------------------------------------------------------------------------------
# builtin_provider_unknown

test_builtin_provider_unknown_absent if {
	d := authz.decision with input as json.remove(builtin_f, ["facts/builtinProvider"])
	d == duplex_denied(["builtin_provider_unknown"], set())
}

test_builtin_provider_unknown_not_an_object if {
	every b in [null, "fake", true, 1, [], [{"execute": true}]] {
		d := authz.decision with input as builtin_provider(b)
		d == duplex_denied(["builtin_provider_unknown"], set())
	}
}

test_builtin_provider_unknown_plugin_backed_not_literal_true if {
	# fixture F with sandboxProviderPlugin not the literal true: built-in path, "daytona" unknown
	every flag in ["true", 1, null, "yes", {}] {
		d := authz.decision with input as f({"resolved": {"pluginBacked": flag}})
		d == duplex_denied(["builtin_provider_unknown"], set())
	}
}

# ---------------------------------------------------------------------------------------------
# worker_not_running

test_worker_not_running if {
	d := authz.decision with input as f_without(["facts/worker"])
	d == duplex_denied(["worker_not_running"], set())
}

test_worker_not_running_not_an_object if {
	every w in [null, "running", true, ["duplexChannelOpen"]] {
		d := authz.decision with input as object.union(f_without(["facts/worker"]), {"facts": {"worker": w}})
		d == duplex_denied(["worker_not_running"], set())
	}
}

test_worker_not_running_with_undeclared if {
	# worker_not_running replaces only method_not_verified; capability_not_declared still applies
	d := authz.decision with input as json.remove(with_entries([{"driverKey": "daytona", "kind": "sandbox_provider"}]), ["facts/worker"])
	d == duplex_denied(["worker_not_running", "capability_not_declared"], set())
}

test_worker_not_running_with_undeclared_and_narrowed if {
	d := authz.decision with input as object.union(
		json.remove(with_declared({"duplexCommandStream": false}), ["facts/worker"]),
		{"narrowing": {"configResolutionFailed": true}},
	)
	d == duplex_denied(["worker_not_running", "capability_not_declared", "capability_narrowed"], set())
}

test_worker_not_running_plugin_driver if {
	d := authz.decision with input as json.remove(plugin_driver_f, ["facts/worker"])
	d == duplex_denied(["worker_not_running"], set())
}

test_worker_not_running_every_capability if {
	inp := json.remove(row12, ["facts/worker"])
	d := authz.decision with input as inp
	d == duplex_denied(["worker_not_running"], set())
	every k in capability_keys {
		authz.capability_reasons(k) == ["worker_not_running"] with input as inp
	}
}

test_worker_not_running_runner_ingress if {
	d := authz.decision with input as json.remove(row14, ["facts/worker"])
	d == ingress_denied(["worker_not_running"], set())
}

# ---------------------------------------------------------------------------------------------
# method_not_verified

test_method_not_verified if {
	d := authz.decision with input as with_methods(["environmentExecute", "environmentRunnerIngressEndpoint"])
	d == duplex_denied(["method_not_verified"], {"persistentProcessSessions", "independentControlCommands"})
}

test_method_not_verified_and_not_declared if {
	d := authz.decision with input as json.remove(with_methods([]), ["facts/plugin/manifest/environmentDrivers/0/sandboxCapabilities"])
	d == duplex_denied(["method_not_verified", "capability_not_declared"], set())
}

test_method_not_verified_builtin if {
	d := authz.decision with input as builtin_f
	d.reasons == ["method_not_verified", "capability_not_declared"]
	authz.capability_reasons("reusableLeases") == ["method_not_verified", "capability_not_declared", "capability_narrowed"] with input as builtin_f
}

test_method_not_verified_runner_ingress_on_fixture_f if {
	d := authz.decision with input as f({"operation": "getRunnerIngressEndpoint"})
	d == ingress_denied(["method_not_verified", "capability_not_declared"], {"duplexCommandStream"})
}

# ---------------------------------------------------------------------------------------------
# capability_not_declared

test_capability_not_declared_values if {
	every v in [false, "true", "false", 1, 0, {}, [], [true], {"value": true}] {
		d := authz.decision with input as with_declared({"duplexCommandStream": v})
		d == duplex_denied(["capability_not_declared"], set())
	}
}

test_capability_not_declared_null_is_absent_for_opt_in if {
	d := authz.decision with input as with_declared({"duplexCommandStream": null})
	d == duplex_denied(["capability_not_declared"], set())
}

test_capability_not_declared_key_case_sensitive if {
	d := authz.decision with input as with_declared({"DuplexCommandStream": true, "duplexcommandstream": true})
	d == duplex_denied(["capability_not_declared"], set())
}

test_capability_not_declared_ordinary_false if {
	inp := full_declared(object.union(all_declared, {"persistentProcessSessions": false}))
	authz.capability_reasons("persistentProcessSessions") == ["capability_not_declared"] with input as inp
	d := authz.decision with input as inp
	d == grant([k | some k in capability_keys; k != "persistentProcessSessions"])
}

# ---------------------------------------------------------------------------------------------
# capability_narrowed

test_capability_narrowed_config_resolution_failed if {
	d := authz.decision with input as full({"narrowing": {"configResolutionFailed": true}})
	d == duplex_denied(
		["capability_narrowed"],
		[k | some k in capability_keys; not k in {"persistentProcessSessions", "incrementalSessionOutput", "duplexCommandStream"}],
	)
}

test_capability_narrowed_after_other_reasons if {
	d := authz.decision with input as object.union(
		json.remove(with_methods([]), ["facts/plugin/manifest/environmentDrivers/0/sandboxCapabilities"]),
		{"narrowing": {"configResolutionFailed": true}},
	)
	d == duplex_denied(["method_not_verified", "capability_not_declared", "capability_narrowed"], set())
}

test_capability_narrowed_lease_policy if {
	inp := full({"lease": {"leasePolicy": "ephemeral"}, "narrowing": {"leasePolicyNotReusable": true}})
	authz.capability_reasons("reusableLeases") == ["capability_narrowed"] with input as inp
	d := authz.decision with input as inp
	d == grant([k | some k in capability_keys; k != "reusableLeases"])
}

# ---------------------------------------------------------------------------------------------
# evaluation_failed

test_evaluation_failed_empty_input if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
}

test_evaluation_failed_unknown_operation if {
	every op in ["bogus", "OpenDuplexChannel", "", null, 1, ["openDuplexChannel"]] {
		d := authz.decision with input as full({"operation": op})
		d == evaluation_failed_doc
	}
}

test_evaluation_failed_operation_absent if {
	# the host always writes operation; a document without one is not decided
	d := authz.decision with input as json.remove(row12, ["operation"])
	d == evaluation_failed_doc
}

test_evaluation_failed_driver_missing_open_duplex if {
	d := authz.decision with input as json.remove(row12, ["resolved/driver"])
	d == evaluation_failed_doc
}

test_evaluation_failed_driver_missing_runner_ingress if {
	# docs/contract.md, "Precise rules" Failures: the operation's capability-denied code and message
	d := authz.decision with input as json.remove(full({"operation": "getRunnerIngressEndpoint"}), ["resolved/driver"])
	d == ingress_evaluation_failed_doc
}

test_evaluation_failed_driver_not_a_string if {
	every driver in [null, 1, true, ["sandbox"], {"sandbox": true}] {
		d := authz.decision with input as full({"resolved": {"driver": driver}})
		d == evaluation_failed_doc
	}
}

# ---------------------------------------------------------------------------------------------
# Identity checks: in the contract's order, the first failure alone, the worker not consulted

test_identity_first_failure_no_provider if {
	d := authz.decision with input as json.remove(
		f({"resolved": {"providerKey": "", "pluginId": ""}, "facts": {"builtinProvider": "x"}}),
		["facts/plugin", "facts/worker"],
	)
	d == duplex_denied(["no_provider"], set())
}

test_identity_first_failure_plugin_not_pinned if {
	d := authz.decision with input as f_without(["resolved/pluginId", "facts/plugin", "facts/worker"])
	d == duplex_denied(["plugin_not_pinned"], set())
}

test_identity_first_failure_plugin_not_found if {
	d := authz.decision with input as f({"facts": {"plugin": {"id": "other.plugin", "status": "disabled", "manifest": {}}}})
	d == duplex_denied(["plugin_not_found"], set())
}

test_identity_first_failure_plugin_not_ready if {
	d := authz.decision with input as object.union(
		with_entries([daytona_entry, daytona_entry]),
		{"facts": {"plugin": {"status": "installed"}}},
	)
	d == duplex_denied(["plugin_not_ready"], set())
}

test_identity_first_failure_driver_entry_invalid if {
	# invalid declaration and wrong kind: driver_entry_invalid comes first
	d := authz.decision with input as with_entries([{"driverKey": "daytona", "kind": "environment_driver", "sandboxCapabilities": null}])
	d == duplex_denied(["driver_entry_invalid"], set())
}

test_identity_first_failure_driver_entry_missing_before_worker if {
	d := authz.decision with input as json.remove(with_entry({"kind": "environment_driver"}), ["facts/worker"])
	d == duplex_denied(["driver_entry_missing"], set())
}

test_identity_failure_worker_not_consulted if {
	# a worker that verifies everything, a declaration granting everything: identity still wins
	every inp in [
		full({"facts": {"plugin": {"status": "disabled"}}}),
		full({"facts": {"plugin": {"id": "other.plugin"}}}),
		full({"resolved": {"pluginId": ""}}),
		full({"resolved": {"providerKey": ""}}),
	] {
		d := authz.decision with input as inp
		d.allow == false
		count(d.reasons) == 1
		d.capabilities == caps_none
	}
}

test_identity_failure_alone_for_every_capability if {
	inp := full({"facts": {"plugin": {"status": "disabled"}}, "narrowing": {"configResolutionFailed": true}})
	every k in capability_keys {
		authz.capability_reasons(k) == ["plugin_not_ready"] with input as inp
	}
}

# ---------------------------------------------------------------------------------------------
# Reasons come from the closed table, in table order, and are empty on a grant

test_reasons_closed_and_ordered if {
	inputs := [
		fixture_f, row12, row14, builtin_f,
		with_methods([]),
		f_without(["facts/worker"]),
		f({"resolved": {"driver": "foo"}}),
		f({"resolved": {"driver": "local"}}),
		object.union(json.remove(with_methods([]), ["facts/plugin/manifest/environmentDrivers/0/sandboxCapabilities"]), {"narrowing": {"configResolutionFailed": true}}),
	]
	every inp in inputs {
		d := authz.decision with input as inp
		every r in d.reasons {
			r in tables.reasons
		}
		positions := [i | some r in d.reasons; some i, t in tables.reasons; t == r]
		positions == sort(positions)
		count({r | some r in d.reasons}) == count(d.reasons)
		no_reasons := count(d.reasons) == 0
		d.allow == no_reasons
	}
}

# ---------------------------------------------------------------------------------------------
# Empty input: one test per reason. Whatever path a reason belongs to, an input without any of
# the fields it reads denies with evaluation_failed, no code of another check, no capability.

test_empty_input_driver_not_registered if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "driver_not_registered" in d.reasons
}

test_empty_input_operation_unsupported_by_driver if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "operation_unsupported_by_driver" in d.reasons
}

test_empty_input_capability_unsupported_by_driver if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "capability_unsupported_by_driver" in d.reasons
}

test_empty_input_no_provider if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "no_provider" in d.reasons
}

test_empty_input_plugin_not_pinned if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "plugin_not_pinned" in d.reasons
}

test_empty_input_plugin_not_found if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "plugin_not_found" in d.reasons
}

test_empty_input_plugin_not_ready if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "plugin_not_ready" in d.reasons
}

test_empty_input_driver_entry_invalid if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "driver_entry_invalid" in d.reasons
}

test_empty_input_driver_entry_missing if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "driver_entry_missing" in d.reasons
}

test_empty_input_builtin_provider_unknown if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "builtin_provider_unknown" in d.reasons
}

test_empty_input_worker_not_running if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "worker_not_running" in d.reasons
}

test_empty_input_method_not_verified if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "method_not_verified" in d.reasons
}

test_empty_input_capability_not_declared if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "capability_not_declared" in d.reasons
}

test_empty_input_capability_narrowed if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	not "capability_narrowed" in d.reasons
}

test_empty_input_evaluation_failed if {
	d := authz.decision with input as {}
	d == evaluation_failed_doc
	d.reasons == ["evaluation_failed"]
	d.allow == false
	d.capabilities == caps_none
}

# ---------------------------------------------------------------------------------------------
# The parts of the input a reason reads, left empty: the reason's path still denies (fail closed)

test_empty_part_resolved if {
	d := authz.decision with input as set_path(fixture_f, "/resolved", {})
	d.allow == false
	d.capabilities == caps_none
}

test_empty_part_facts_plugin_backed if {
	d := authz.decision with input as set_path(fixture_f, "/facts", {})
	d == duplex_denied(["plugin_not_found"], set())
}

test_empty_part_facts_plugin_driver if {
	d := authz.decision with input as set_path(plugin_driver_f, "/facts", {})
	d == duplex_denied(["plugin_not_found"], set())
}

test_empty_part_facts_builtin if {
	d := authz.decision with input as set_path(builtin_f, "/facts", {})
	d == duplex_denied(["builtin_provider_unknown"], set())
}

test_empty_part_plugin if {
	d := authz.decision with input as set_path(fixture_f, "/facts/plugin", {})
	d.allow == false
	d.capabilities == caps_none
}

test_empty_part_worker if {
	d := authz.decision with input as set_path(fixture_f, "/facts/worker", {})
	d == duplex_denied(["method_not_verified"], set())
}

test_empty_part_entry if {
	d := authz.decision with input as with_entries([{}])
	d == duplex_denied(["driver_entry_missing"], set())
}

test_empty_part_declaration if {
	d := authz.decision with input as with_declared({})
	d == duplex_denied(["capability_not_declared"], set())
}

test_empty_part_builtin_provider if {
	d := authz.decision with input as builtin_provider({})
	d == duplex_denied(["method_not_verified", "capability_not_declared"], set())
}
