# Decision document, operations and their order of checks
#
# docs/contract.md, "The decision, in order", "Codes and messages" and "The decision document": the shape of the decision document, both operations with their order
# of checks, the codes and message templates with the driver name inserted as given, and the
# snapshot being present on every deny.
package authz_test

import data.authz

# ---------------------------------------------------------------------------------------------
# Document shape

test_decision_has_exactly_the_policy_keys if {
	every inp in [{}, fixture_f, row12, row14, builtin_f, f({"resolved": {"driver": "foo"}}), f({"resolved": {"driver": "ssh"}})] {
		d := authz.decision with input as inp
		object.keys(d) == {"allow", "code", "message", "reasons", "capabilities"}
		is_boolean(d.allow)
		is_string(d.code)
		is_string(d.message)
		is_array(d.reasons)
		object.keys(d.capabilities) == {k | some k in capability_keys}
		every k in capability_keys {
			is_boolean(d.capabilities[k])
		}
	}
}

test_grant_has_empty_code_message_reasons if {
	d := authz.decision with input as fixture_f
	d.allow == true
	d.code == ""
	d.message == ""
	d.reasons == []
}

test_allow_rule_matches_decision if {
	authz.allow with input as fixture_f
	not authz.allow with input as with_methods([])
	not authz.allow with input as {}
}

test_deny_always_has_code_message_and_reason if {
	every inp in [
		{}, with_methods([]), f({"resolved": {"driver": "foo"}}), f({"resolved": {"driver": "local"}}),
		row14, f({"operation": "getRunnerIngressEndpoint"}), f({"operation": "bogus"}),
		json.remove(fixture_f, ["resolved/driver"]),
	] {
		d := authz.decision with input as inp
		d.allow == false
		d.code != ""
		d.message != ""
		count(d.reasons) > 0
	}
}

# ---------------------------------------------------------------------------------------------
# openDuplexChannel: driver -> registered -> driver supports the operation -> capability

test_open_duplex_sandbox_grants if {
	d := authz.decision with input as fixture_f
	d.allow == true
}

test_open_duplex_plugin_driver_grants if {
	d := authz.decision with input as plugin_driver_f
	d == grant({"duplexCommandStream"})
}

test_open_duplex_driver_support_before_capability if {
	# everything verified and declared, but local/ssh do not support the operation
	every driver in ["local", "ssh"] {
		d := authz.decision with input as full({"resolved": {"driver": driver}})
		d == deny("DUPLEX_CHANNEL_UNSUPPORTED", duplex_unsupported_message(driver), ["operation_unsupported_by_driver"], set())
	}
}

test_open_duplex_registration_before_support if {
	d := authz.decision with input as full({"resolved": {"driver": "kubernetes"}})
	d == deny("ENVIRONMENT_DRIVER_NOT_REGISTERED", not_registered_message("kubernetes"), ["driver_not_registered"], set())
}

test_open_duplex_capability_denied_on_sandbox if {
	d := authz.decision with input as with_methods([])
	d.code == "DUPLEX_CHANNEL_CAPABILITY_DENIED"
	d.message == duplex_denied_message
}

# ---------------------------------------------------------------------------------------------
# getRunnerIngressEndpoint: driver -> registered -> capability -> driver supports the operation

test_runner_ingress_sandbox_grants_exact_document if {
	d := authz.decision with input as f({
		"operation": "getRunnerIngressEndpoint",
		"facts": {
			"plugin": {"manifest": {"environmentDrivers": [{"driverKey": "daytona", "kind": "sandbox_provider", "sandboxCapabilities": {"runnerWebSocketIngress": true}}]}},
			"worker": {"supportedMethods": ["environmentRunnerIngressEndpoint"]},
		},
	})
	d == grant({"runnerWebSocketIngress"})
}

test_runner_ingress_plugin_driver_capability_true_is_unsupported if {
	d := authz.decision with input as row14
	d == deny("RUNNER_INGRESS_UNSUPPORTED", ingress_unsupported_message("plugin"), ["operation_unsupported_by_driver"], {"runnerWebSocketIngress"})
}

test_runner_ingress_plugin_driver_capability_false_is_capability_denied if {
	# same as row 14 but the capability is not granted: the capability check comes first
	d1 := authz.decision with input as object.union(row14, {"facts": {"worker": {"supportedMethods": []}}})
	d1 == ingress_denied(["method_not_verified"], set())

	d2 := authz.decision with input as plugin_driver({
		"operation": "getRunnerIngressEndpoint",
		"facts": {"worker": {"supportedMethods": ["environmentRunnerIngressEndpoint"]}},
	})
	d2 == ingress_denied(["capability_not_declared"], set())

	d3 := authz.decision with input as json.remove(row14, ["facts/worker"])
	d3 == ingress_denied(["worker_not_running"], set())

	d4 := authz.decision with input as object.union(row14, {"facts": {"plugin": {"status": "disabled"}}})
	d4 == ingress_denied(["plugin_not_ready"], set())
}

test_runner_ingress_plugin_driver_all_nine if {
	d := authz.decision with input as full({
		"operation": "getRunnerIngressEndpoint",
		"lease": {"metadata": {"driver": "plugin", "driverKey": "daytona"}},
		"resolved": {"driver": "plugin", "driverKey": "daytona"},
	})
	d == deny("RUNNER_INGRESS_UNSUPPORTED", ingress_unsupported_message("plugin"), ["operation_unsupported_by_driver"], capability_keys)
}

test_runner_ingress_local_ssh_capability_first if {
	every driver in ["local", "ssh"] {
		d := authz.decision with input as full({"operation": "getRunnerIngressEndpoint", "resolved": {"driver": driver}})
		d == ingress_denied(["capability_unsupported_by_driver"], set())
	}
}

test_runner_ingress_registration_first if {
	d := authz.decision with input as full({"operation": "getRunnerIngressEndpoint", "resolved": {"driver": "foo"}})
	d == deny("ENVIRONMENT_DRIVER_NOT_REGISTERED", not_registered_message("foo"), ["driver_not_registered"], set())
}

test_runner_ingress_denied_message_on_sandbox if {
	d := authz.decision with input as f({"operation": "getRunnerIngressEndpoint"})
	d.code == "RUNNER_INGRESS_CAPABILITY_DENIED"
	d.message == "Sandbox lease does not grant runner WebSocket ingress."
}

test_runner_ingress_builtin_never if {
	d := authz.decision with input as builtin({"operation": "getRunnerIngressEndpoint"})
	d == ingress_denied(["method_not_verified", "capability_not_declared"], {"persistentProcessSessions", "independentControlCommands"})
}

# ---------------------------------------------------------------------------------------------
# Messages: the driver name inserted as given

test_message_odd_driver_names if {
	every driver in ["Sandbox", "%s", "my%sdriver", "%s%s", "a\"b", "back\\slash", "drïver", "plugin ", "$1", "%d", "{}"] {
		d := authz.decision with input as f({"resolved": {"driver": driver}})
		d.code == "ENVIRONMENT_DRIVER_NOT_REGISTERED"
		d.message == not_registered_message(driver)
	}
}

test_message_sandbox_capitalised if {
	d := authz.decision with input as f({"lease": {"metadata": {"driver": "Sandbox"}}, "resolved": {"driver": "Sandbox"}})
	d.message == "Environment driver \"Sandbox\" is not registered in the environment runtime yet."
}

test_message_percent_s_name if {
	d := authz.decision with input as f({"resolved": {"driver": "a%sb"}})
	d.message == "Environment driver \"a%sb\" is not registered in the environment runtime yet."
}

test_message_percent_s_name_runner_ingress if {
	d := authz.decision with input as f({"operation": "getRunnerIngressEndpoint", "resolved": {"driver": "%s"}})
	d.message == "Environment driver \"%s\" is not registered in the environment runtime yet."
}

test_message_unsupported_names_driver if {
	d := authz.decision with input as f({"resolved": {"driver": "ssh"}})
	d.message == "Environment driver \"ssh\" does not support duplex channels."
}

# ---------------------------------------------------------------------------------------------
# The driver and the facts as resolved by the host; nothing else is read as a capability

test_driver_from_resolved_not_environment if {
	# the lease says sandbox (resolved.driver), the environment's current driver is local
	d := authz.decision with input as f({"environment": {"driver": "local"}})
	d == grant({"duplexCommandStream"})
}

test_lease_fields_never_read_as_capabilities if {
	d := authz.decision with input as object.union(with_methods([]), {"lease": {
		"capabilities": {"duplexCommandStream": true},
		"metadata": {
			"duplexCommandStream": true,
			"capabilities": all_declared,
			"sandboxCapabilities": all_declared,
			"supportedMethods": all_methods,
		},
	}})
	d == duplex_denied(["method_not_verified"], set())
}

test_worker_restart_dropping_a_method if {
	before := authz.decision with input as fixture_f
	after := authz.decision with input as f({"facts": {"worker": {"generation": 2, "supportedMethods": ["environmentExecute"]}}})
	before.allow == true
	after == duplex_denied(["method_not_verified"], {"persistentProcessSessions", "independentControlCommands"})
}

test_unknown_extra_fields_ignored if {
	d := authz.decision with input as f({
		"extra": {"allow": true},
		"allow": true,
		"lease": {"extra": true, "metadata": {"extra": "x"}},
		"resolved": {"extra": "x"},
		"facts": {"extra": true, "plugin": {"extra": 1}, "worker": {"extra": 1}},
		"narrowing": {"extra": true, "duplexCommandStream": true},
	})
	d == grant({"duplexCommandStream"})
}

test_unchecked_request_fields_do_not_matter if {
	every patch in [
		{"lease": {"companyId": "other"}},
		{"lease": {"providerLeaseId": ""}},
		{"command": []},
		{"now_ns": 0},
		{"lease": {"metadata": {"pluginKey": "x"}}},
	] {
		d := authz.decision with input as f(patch)
		d == grant({"duplexCommandStream"})
	}
}

test_snapshot_present_on_registration_and_support_denies if {
	# an unregistered or unsupporting driver supports nothing: all false
	every driver in ["foo", "local", "ssh"] {
		d := authz.decision with input as full({"resolved": {"driver": driver}})
		d.capabilities == caps_none
	}
}
