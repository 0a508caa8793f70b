# Decision tables
#
# data.authz.tables against docs/contract.md, "The nine capabilities", "The decision, in order", "Codes and messages" and "Precise rules": the capability table, the registered
# drivers, the operations with their order of checks, codes and messages, the closed reason list
# and the built-in provider methods.
package authz_test

import data.authz.tables

test_tables_capability_keys if {
	object.keys(tables.capabilities) == {k | some k in capability_keys}
}

test_tables_every_capability_well_formed if {
	every _, c in tables.capabilities {
		object.keys(c) == {"methods", "optIn", "narrowedBy"}
		is_set(c.methods)
		count(c.methods) > 0
		every m in c.methods {
			is_string(m)
		}
		is_boolean(c.optIn)
		is_set(c.narrowedBy)
		every flag in c.narrowedBy {
			# a flag the host computes (that the host computes each one of narrowing_flags is
			# checked in Go, internal/decision TestNarrowingFlagsAgree)
			flag in tables.narrowing_flags
		}
	}
}

test_tables_drivers if {
	object.keys(tables.drivers) == {"local", "ssh", "sandbox", "plugin"}
	every _, d in tables.drivers {
		object.keys(d) == {"operations", "capabilities", "identity"}
		is_set(d.operations)
		is_boolean(d.capabilities)
		d.identity in {"none", "sandbox_provider", "plugin_driver"}
	}
}

test_tables_driver_operations if {
	{name: d.operations | some name, d in tables.drivers} == {
		"local": set(),
		"ssh": set(),
		"sandbox": {"openDuplexChannel", "getRunnerIngressEndpoint"},
		"plugin": {"openDuplexChannel"},
	}
}

test_tables_driver_capabilities if {
	{name: d.capabilities | some name, d in tables.drivers} == {
		"local": false,
		"ssh": false,
		"sandbox": true,
		"plugin": true,
	}
}

test_tables_capability_added_in_the_table_reaches_the_document if {
	# a capability added to the table is in every document, supported by sandbox and plugin
	caps := object.union(tables.capabilities, {"gpuPassthrough": {"methods": {"duplexChannelOpen"}, "optIn": false, "narrowedBy": set()}})
	d := data.authz.decision with input as fixture_f with data.authz.tables.capabilities as caps
	d.allow == true
	d.capabilities.gpuPassthrough == true
	e := data.authz.decision with input as {} with data.authz.tables.capabilities as caps
	e.capabilities.gpuPassthrough == false
	count(e.capabilities) == 10
}

test_tables_driver_identity if {
	{name: d.identity | some name, d in tables.drivers} == {
		"local": "none",
		"ssh": "none",
		"sandbox": "sandbox_provider",
		"plugin": "plugin_driver",
	}
}

test_tables_operations if {
	object.keys(tables.operations) == {"openDuplexChannel", "getRunnerIngressEndpoint"}
	tables.operations.openDuplexChannel.capability == "duplexCommandStream"
	tables.operations.getRunnerIngressEndpoint.capability == "runnerWebSocketIngress"
}

test_tables_operation_check_order if {
	tables.operations.openDuplexChannel.checks == ["driver_registered", "operation_supported", "capability_granted"]
	tables.operations.getRunnerIngressEndpoint.checks == ["driver_registered", "capability_granted", "operation_supported"]
	every _, op in tables.operations {
		object.keys(op.denials) == {c | some c in op.checks}
	}
}

test_tables_codes_and_messages if {
	{name: op.denials | some name, op in tables.operations} == {
		"openDuplexChannel": {
			"driver_registered": {
				"code": "ENVIRONMENT_DRIVER_NOT_REGISTERED",
				"message": "Environment driver \"%s\" is not registered in the environment runtime yet.",
			},
			"operation_supported": {
				"code": "DUPLEX_CHANNEL_UNSUPPORTED",
				"message": "Environment driver \"%s\" does not support duplex channels.",
			},
			"capability_granted": {
				"code": "DUPLEX_CHANNEL_CAPABILITY_DENIED",
				"message": "Sandbox lease does not grant the duplex command stream capability.",
			},
		},
		"getRunnerIngressEndpoint": {
			"driver_registered": {
				"code": "ENVIRONMENT_DRIVER_NOT_REGISTERED",
				"message": "Environment driver \"%s\" is not registered in the environment runtime yet.",
			},
			"operation_supported": {
				"code": "RUNNER_INGRESS_UNSUPPORTED",
				"message": "Environment driver \"%s\" does not support runner ingress.",
			},
			"capability_granted": {
				"code": "RUNNER_INGRESS_CAPABILITY_DENIED",
				"message": "Sandbox lease does not grant runner WebSocket ingress.",
			},
		},
	}
}

test_tables_templates_have_one_placeholder_at_most if {
	every _, op in tables.operations {
		every _, denial in op.denials {
			count(indexof_n(denial.message, "%s")) <= 1
		}
	}
}

test_tables_reasons_closed_list_in_order if {
	tables.reasons == [
		"driver_not_registered",
		"operation_unsupported_by_driver",
		"capability_unsupported_by_driver",
		"no_provider",
		"plugin_not_pinned",
		"plugin_not_found",
		"plugin_not_ready",
		"driver_entry_invalid",
		"driver_entry_missing",
		"builtin_provider_unknown",
		"worker_not_running",
		"method_not_verified",
		"capability_not_declared",
		"capability_narrowed",
		"evaluation_failed",
	]
}

test_tables_builtin_provider_methods if {
	tables.builtinProviderMethods == {
		"execute": ["environmentExecute"],
		"supportsReusableLeases": ["environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease"],
	}
	every _, methods in tables.builtinProviderMethods {
		not "duplexChannelOpen" in methods
	}
}

test_tables_changing_data_changes_behaviour if {
	# a policy author can register a driver without touching Go
	d := data.authz.decision with input as f({"resolved": {"driver": "k8s"}})
		with data.authz.tables.drivers as object.union(tables.drivers, {"k8s": {"operations": set(), "capabilities": false, "identity": "none"}})
	d == deny("DUPLEX_CHANNEL_UNSUPPORTED", duplex_unsupported_message("k8s"), ["operation_unsupported_by_driver"], set())
}

test_tables_changing_opt_in if {
	# making duplexCommandStream ordinary: an entry without a declaration then grants it
	d := data.authz.decision with input as with_entries([{"driverKey": "daytona", "kind": "sandbox_provider"}])
		with data.authz.tables.capabilities as object.union(tables.capabilities, {"duplexCommandStream": {"optIn": false}})
	d == grant({"duplexCommandStream"})
}
