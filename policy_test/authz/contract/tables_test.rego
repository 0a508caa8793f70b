# The contract suite: the capability table
#
# A test of this suite that fails means the capability table no longer is the one of
# docs/contract.md, "The nine capabilities": this changes the contract. Changing a
# capability's methods, opt-in or narrowing flags in policies/authz/tables/tables.rego is a
# routine edit that needs no release of authz, and the other suites follow the table; these
# tests pin the contract's table, so such an edit fails here, and only here (and in the
# worked examples it changes): change docs/contract.md with it, and these tests.
package authz_test.contract

import data.authz
import data.authz.tables
import data.authz_test.caps
import data.authz_test.caps_none
import data.authz_test.full_methods

test_tables_capability_methods if {
	{k: c.methods | some k, c in tables.capabilities} == {
		"reusableLeases": {"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease"},
		"nativeSyncIn": {"environmentSyncIn"},
		"nativeSyncOut": {"environmentSyncOut"},
		"persistentProcessSessions": {"environmentExecute"},
		"independentControlCommands": {"environmentExecute"},
		"incrementalSessionOutput": {"environmentExecute"},
		"concurrentSyncOperations": {"environmentSyncIn", "environmentSyncOut"},
		"duplexCommandStream": {"duplexChannelOpen"},
		"runnerWebSocketIngress": {"environmentRunnerIngressEndpoint"},
	}
}

test_tables_opt_in if {
	{k | some k, c in tables.capabilities; c.optIn == true} == {
		"incrementalSessionOutput",
		"concurrentSyncOperations",
		"duplexCommandStream",
		"runnerWebSocketIngress",
	}
}

test_tables_narrowed_by if {
	{k: c.narrowedBy | some k, c in tables.capabilities} == {
		"reusableLeases": {"leasePolicyNotReusable"},
		"nativeSyncIn": {"nativeSyncUnavailable"},
		"nativeSyncOut": {"nativeSyncUnavailable"},
		"persistentProcessSessions": {"configResolutionFailed"},
		"independentControlCommands": set(),
		"incrementalSessionOutput": {"configResolutionFailed"},
		"concurrentSyncOperations": set(),
		"duplexCommandStream": {"configResolutionFailed"},
		"runnerWebSocketIngress": set(),
	}
}

test_requirement_groups_of_the_contract if {
	# concurrentSyncOperations needs environmentSyncIn and environmentSyncOut
	only_in := authz.capabilities with input as full_methods(["environmentSyncIn"])
	only_in == caps({"nativeSyncIn"})
	both := authz.capabilities with input as full_methods(["environmentSyncIn", "environmentSyncOut"])
	both == caps({"nativeSyncIn", "nativeSyncOut", "concurrentSyncOperations"})

	# reusableLeases needs all three lease methods
	two := authz.capabilities with input as full_methods(["environmentResumeLease", "environmentReleaseLease"])
	two == caps_none
	three := authz.capabilities with input as full_methods(["environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease"])
	three == caps({"reusableLeases"})
}
