# METADATA
# title: Decision tables
# description: |
#   The data the decision reads: registered drivers, which operations and capabilities each driver
#   class supports, the operations with their order of checks, codes and messages, and the nine
#   capabilities with the worker methods they require, whether they are opt-in, and the narrowing
#   flags that remove them.
#
#   The capability table is the one list of capabilities in the policy: the drivers' capability
#   sets and every document the policy returns are derived from its keys. What can change without
#   a release of authz: the methods, opt-in flag and narrowing flags of a capability; the drivers,
#   their operations and which capabilities each supports; the order of checks, codes and messages
#   of an operation; the built-in provider methods. What needs a release: adding or removing a
#   capability (the host reads and serves exactly the capabilities of its Go list,
#   decision.CapabilityKeys, and answers any other set with a fail-closed deny, reason
#   evaluation_failed), adding an operation (the host refuses requests for other operations) and
#   a narrowing flag (the host computes input.narrowing).
package authz.tables

# METADATA
# title: Capability table
# description: |
#   Per capability (docs/contract.md, "The nine capabilities"): `methods` is the set of worker methods it requires
#   (every one of them must be among the worker's live methods: each is a requirement group of one
#   method); `optIn` capabilities are false unless declared `true`; `narrowedBy` is the set of flags
#   of `input.narrowing` that remove the capability when `true`, each one of narrowing_flags.
#
#   Each entry has exactly these three keys, `methods` and `narrowedBy` written as sets: the policy
#   grants a capability when the facts contain its entry (object.subset), so an entry with another
#   key or a list instead of a set is never granted.
capabilities := {
	"reusableLeases": {
		"methods": {"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease"},
		"optIn": false,
		"narrowedBy": {"leasePolicyNotReusable"},
	},
	"nativeSyncIn": {
		"methods": {"environmentSyncIn"},
		"optIn": false,
		"narrowedBy": {"nativeSyncUnavailable"},
	},
	"nativeSyncOut": {
		"methods": {"environmentSyncOut"},
		"optIn": false,
		"narrowedBy": {"nativeSyncUnavailable"},
	},
	"persistentProcessSessions": {
		"methods": {"environmentExecute"},
		"optIn": false,
		"narrowedBy": {"configResolutionFailed"},
	},
	"independentControlCommands": {
		"methods": {"environmentExecute"},
		"optIn": false,
		"narrowedBy": set(),
	},
	"incrementalSessionOutput": {
		"methods": {"environmentExecute"},
		"optIn": true,
		"narrowedBy": {"configResolutionFailed"},
	},
	"concurrentSyncOperations": {
		"methods": {"environmentSyncIn", "environmentSyncOut"},
		"optIn": true,
		"narrowedBy": set(),
	},
	"duplexCommandStream": {
		"methods": {"duplexChannelOpen"},
		"optIn": true,
		"narrowedBy": {"configResolutionFailed"},
	},
	"runnerWebSocketIngress": {
		"methods": {"environmentRunnerIngressEndpoint"},
		"optIn": true,
		"narrowedBy": set(),
	},
}

# METADATA
# title: Narrowing flags
# description: |
#   The flags of `input.narrowing`, the ones the host computes (docs/input-document.md); a
#   capability's `narrowedBy` names some of them. Adding one needs a release of authz (the host
#   computes it): a test of internal/decision fails when this set and the host's list differ.
narrowing_flags := {"leasePolicyNotReusable", "nativeSyncUnavailable", "configResolutionFailed"}

# METADATA
# title: Registered drivers
# description: |
#   The environment drivers the runtime knows (docs/contract.md, "The decision, in order", step 2), with the operations each
#   supports and whether its class can have capabilities at all (`capabilities`: true means every
#   capability of the capability table, false none). `identity` names how a lease on the
#   driver is tied to the facts: `sandbox_provider` (a built-in or plugin-backed provider),
#   `plugin_driver` (a plugin's environment driver), or `none`.
drivers := {
	"local": {
		"operations": set(),
		"capabilities": false,
		"identity": "none",
	},
	"ssh": {
		"operations": set(),
		"capabilities": false,
		"identity": "none",
	},
	"sandbox": {
		"operations": {"openDuplexChannel", "getRunnerIngressEndpoint"},
		"capabilities": true,
		"identity": "sandbox_provider",
	},
	"plugin": {
		"operations": {"openDuplexChannel"},
		"capabilities": true,
		"identity": "plugin_driver",
	},
}

# METADATA
# title: Operations
# description: |
#   The operations a request can ask for (docs/contract.md, "The decision, in order"): the capability each needs, the order of
#   its checks (the first failing check decides), and the code and message of each check's deny.
#   `%s` in a message is replaced by the driver name as given.
operations := {
	"openDuplexChannel": {
		"capability": "duplexCommandStream",
		"checks": ["driver_registered", "operation_supported", "capability_granted"],
		"denials": {
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
	},
	"getRunnerIngressEndpoint": {
		"capability": "runnerWebSocketIngress",
		"checks": ["driver_registered", "capability_granted", "operation_supported"],
		"denials": {
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
	},
}

# METADATA
# title: Reason order
# description: The closed list of reason codes (docs/contract.md, "Precise rules"), in the order they are listed.
reasons := [
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

# METADATA
# title: Built-in provider methods
# description: |
#   The worker methods a built-in provider verifies (docs/contract.md, "Resolving the snapshot"): for each flag of the
#   provider's record that is exactly true, the listed methods. A built-in provider never verifies
#   duplexChannelOpen.
builtinProviderMethods := {
	"execute": ["environmentExecute"],
	"supportsReusableLeases": ["environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease"],
}
