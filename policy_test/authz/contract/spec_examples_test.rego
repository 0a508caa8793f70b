# METADATA
# title: The contract suite
# description: |
#   A test of this suite that fails means the policy no longer decides as docs/contract.md
#   says: this changes the contract. The other suites (data.authz_test) test the policy's
#   mechanics and follow the tables; this one pins the contract's capability table
#   (tables_test.rego) and its worked examples: rows 1 to 14 of docs/contract.md, "Worked examples", as
#   input documents (fixture F with the row's change, as the host assembles it), asserting
#   allow, code, message, reasons, the snapshot and the "also" column. A routine edit of the
#   tables (a capability's methods, say) fails here, and only here, when it changes what the
#   contract's examples decide: change docs/contract.md with it, or do not make it.
package authz_test.contract

import data.authz
import data.authz_test.builtin_f
import data.authz_test.capability_keys
import data.authz_test.deny
import data.authz_test.duplex_denied
import data.authz_test.duplex_unsupported_message
import data.authz_test.f
import data.authz_test.f_without
import data.authz_test.fixture_f
import data.authz_test.grant
import data.authz_test.ingress_unsupported_message
import data.authz_test.not_registered_message
import data.authz_test.row12
import data.authz_test.row14
import data.authz_test.with_declared
import data.authz_test.with_entries
import data.authz_test.with_entry
import data.authz_test.with_methods

test_row_01_fixture_f_grants if {
	d := authz.decision with input as fixture_f
	d == grant({"duplexCommandStream"})

	# also: duplexCommandStream true, persistentProcessSessions false
	d.capabilities.duplexCommandStream == true
	d.capabilities.persistentProcessSessions == false
}

test_row_02_no_worker_methods if {
	d := authz.decision with input as with_methods([])
	d == duplex_denied(["method_not_verified"], set())
}

test_row_03_entry_without_sandbox_capabilities_opt_in if {
	d := authz.decision with input as with_entries([{"driverKey": "daytona", "kind": "sandbox_provider"}])
	d == duplex_denied(["capability_not_declared"], set())
}

test_row_04_local_driver_unsupported if {
	d := authz.decision with input as f({
		"lease": {"metadata": {"driver": "local"}},
		"resolved": {"driver": "local"},
	})
	d == deny("DUPLEX_CHANNEL_UNSUPPORTED", duplex_unsupported_message("local"), ["operation_unsupported_by_driver"], set())

	# also: the message names "local"
	d.message == "Environment driver \"local\" does not support duplex channels."
}

test_row_05_unregistered_driver if {
	d := authz.decision with input as f({
		"lease": {"metadata": {"driver": "foo"}},
		"resolved": {"driver": "foo"},
	})
	d == deny("ENVIRONMENT_DRIVER_NOT_REGISTERED", not_registered_message("foo"), ["driver_not_registered"], set())
	d.message == "Environment driver \"foo\" is not registered in the environment runtime yet."
}

test_row_06_plugin_disabled if {
	d := authz.decision with input as f({"facts": {"plugin": {"status": "disabled"}}})
	d == duplex_denied(["plugin_not_ready"], set())
}

test_row_07_entry_kind_environment_driver if {
	d := authz.decision with input as with_entry({"kind": "environment_driver"})
	d == duplex_denied(["driver_entry_missing"], set())
}

test_row_08_config_invalid if {
	# configValid false: the host sets narrowing.configResolutionFailed (worker running, plugin ready)
	d := authz.decision with input as f({"narrowing": {"configResolutionFailed": true}})
	d == duplex_denied(["capability_narrowed"], set())

	# also: persistentProcessSessions false too
	d.capabilities.persistentProcessSessions == false
}

test_row_08_config_invalid_removes_persistent_sessions_even_when_verified if {
	d := authz.decision with input as f({
		"facts": {"worker": {"supportedMethods": ["duplexChannelOpen", "environmentExecute"]}},
		"narrowing": {"configResolutionFailed": true},
	})
	d == duplex_denied(["capability_narrowed"], {"independentControlCommands"})
	d.capabilities.persistentProcessSessions == false
	authz.capability_reasons("persistentProcessSessions") == ["capability_narrowed"] with input as f({
		"facts": {"worker": {"supportedMethods": ["duplexChannelOpen", "environmentExecute"]}},
		"narrowing": {"configResolutionFailed": true},
	})
}

test_row_09_backend_job if {
	d := authz.decision with input as f({
		"lease": {"metadata": {"backend": "job"}},
		"narrowing": {"nativeSyncUnavailable": true},
	})
	d == grant({"duplexCommandStream"})

	# also: nativeSyncIn false
	d.capabilities.nativeSyncIn == false
}

test_row_09_backend_job_removes_verified_native_sync if {
	d := authz.decision with input as f({
		"lease": {"metadata": {"backend": "job"}},
		"facts": {"worker": {"supportedMethods": ["duplexChannelOpen", "environmentSyncIn", "environmentSyncOut"]}},
		"narrowing": {"nativeSyncUnavailable": true},
	})
	d == grant({"duplexCommandStream"})
	authz.capability_reasons("nativeSyncIn") == ["capability_narrowed"] with input as f({
		"lease": {"metadata": {"backend": "job"}},
		"facts": {"worker": {"supportedMethods": ["duplexChannelOpen", "environmentSyncIn", "environmentSyncOut"]}},
		"narrowing": {"nativeSyncUnavailable": true},
	})
}

test_row_10_declared_string_true if {
	d := authz.decision with input as with_declared({"duplexCommandStream": "true"})
	d == duplex_denied(["capability_not_declared"], set())
}

test_row_11_no_worker if {
	d := authz.decision with input as f_without(["facts/worker"])
	d == duplex_denied(["worker_not_running"], set())
}

test_row_12_all_nine if {
	d := authz.decision with input as row12
	d == grant(capability_keys)

	# also: all nine true
	every k in capability_keys {
		d.capabilities[k] == true
	}
}

test_row_13_builtin_fake if {
	d := authz.decision with input as builtin_f
	d == duplex_denied(
		["method_not_verified", "capability_not_declared"],
		{"persistentProcessSessions", "independentControlCommands"},
	)

	# also: persistentProcessSessions and independentControlCommands true
	d.capabilities.persistentProcessSessions == true
	d.capabilities.independentControlCommands == true
}

test_row_14_runner_ingress_on_plugin_driver if {
	d := authz.decision with input as row14
	d == deny(
		"RUNNER_INGRESS_UNSUPPORTED",
		ingress_unsupported_message("plugin"),
		["operation_unsupported_by_driver"],
		{"runnerWebSocketIngress"},
	)

	# also: runnerWebSocketIngress true in the snapshot
	d.capabilities.runnerWebSocketIngress == true
	d.message == "Environment driver \"plugin\" does not support runner ingress."
}
