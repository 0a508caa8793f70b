package coded

// Codes of a request or facts document that does not have the contract's shape
// (docs/contract.md, "Precise rules", "Request shape" and "Facts file").
const (
	// BadRequest: the request is not a JSON object, one of its objects is not an object, its
	// operation is unknown, or (over HTTP) its body cannot be read. It is answered, never decided.
	BadRequest Code = "BAD_REQUEST"
	// BadFacts: a facts document is not an object, or its plugins, workers or builtinProviders
	// have the wrong shape.
	BadFacts Code = "BAD_FACTS"
)

// Codes of a decision that could not be evaluated. The decision is then the fail-closed deny
// document, and the code tells operators (logs, metrics, the X-Authz-Error header) why.
const (
	EvalNoPolicy        Code = "EVAL_NO_POLICY"        // no policy has been loaded
	EvalUndefined       Code = "EVAL_UNDEFINED"        // the entrypoint produced no result
	EvalMultipleResults Code = "EVAL_MULTIPLE_RESULTS" // the query produced more than one result
	EvalBadResult       Code = "EVAL_BAD_RESULT"       // the result is not a well-formed decision document
	EvalError           Code = "EVAL_ERROR"            // OPA returned an error, or the failure has no code of its own
	EvalCanceled        Code = "EVAL_CANCELED"         // the caller's context was cancelled
	EvalTimeout         Code = "EVAL_TIMEOUT"          // the evaluation ran out of time
	EvalBadInput        Code = "EVAL_BAD_INPUT"        // the input could not be converted for OPA
	PolicyCompile       Code = "POLICY_COMPILE"        // a policy did not parse or compile (load time only)
)

// Codes of the HTTP API's answers that are not decisions: {"code": …, "message": …}.
const (
	RequestTooLarge        Code = "REQUEST_TOO_LARGE"        // 413: the body is over maxBodyBytes
	MethodNotAllowed       Code = "METHOD_NOT_ALLOWED"       // 405: a known path, another method
	NotFound               Code = "NOT_FOUND"                // 404: no such endpoint
	UnsupportedMediaType   Code = "UNSUPPORTED_MEDIA_TYPE"   // 415: a Content-Type that is not JSON
	DecisionLogUnavailable Code = "DECISION_LOG_UNAVAILABLE" // 503: a required decision log could not be written
	Internal               Code = "INTERNAL_ERROR"           // 500: a fault of the service itself
	Overloaded             Code = "SERVICE_OVERLOADED"       // 503: no admission slot came free in time
	Unauthorized           Code = "UNAUTHORIZED"             // 401: no valid token or client certificate
	Forbidden              Code = "FORBIDDEN"                // 403: the token lacks the endpoint's scope
	HostNotAllowed         Code = "HOST_NOT_ALLOWED"         // 403: a Host header the service does not answer to
	WatchLimit             Code = "WATCH_LIMIT"              // 503: watches.max watches are open
	Stopping               Code = "SERVICE_STOPPING"         // 503: the service is stopping and opens no new watch
	RequestTimeout         Code = "REQUEST_TIMEOUT"          // 408: the body came slower than limits.minBodyRate

	// OPAWriteAPIOff: 403 from OPA's own API under `authz run`: a write (PUT, PATCH, DELETE)
	// while plugins.authz.opaWriteAPI is off.
	OPAWriteAPIOff Code = "OPA_WRITE_API_OFF"
)

// Codes of a plugin's last failure, shown as its lastError (GET /v1/plugins). The full message,
// which names paths, digests and process ids, goes to the service log only.
const (
	PinMismatch     Code = "PIN_MISMATCH"     // the executable's SHA-256 is not the configured pin
	PinUnreadable   Code = "PIN_UNREADABLE"   // the executable could not be read to check its pin
	StartTimeout    Code = "START_TIMEOUT"    // no go-plugin handshake within the start timeout
	HandshakeFailed Code = "HANDSHAKE_FAILED" // the process exited or wrote to stdout before the handshake
	InvalidManifest Code = "INVALID_MANIFEST" // the driver described itself with an invalid manifest
	WorkerExited    Code = "WORKER_EXITED"    // a running worker exited (it is restarted)
	UnsafeBinary    Code = "UNSAFE_BINARY"    // the executable or its directory is writable by group or others
	IdentityRefused Code = "IDENTITY_REFUSED" // the process is not the verified one (socket, peer, executable)
	KeyConflict     Code = "KEY_CONFLICT"     // the reported plugin key is another plugin's
	LimitExceeded   Code = "LIMIT_EXCEEDED"   // the driver reported more than the host's limits allow
	BrokerRefused   Code = "BROKER_REFUSED"   // the driver flooded the go-plugin broker the host does not offer
	StartFailed     Code = "START_FAILED"     // any other failure to start or set up a worker

	// WorkerUnresponsive: a running worker did not answer its health check in time, or its
	// main thread ended while other threads run; it was killed and is restarted.
	WorkerUnresponsive Code = "WORKER_UNRESPONSIVE"
)

// Codes of a driver's config check that did not answer "valid" or "not valid" (the service log,
// tracing). The decision denies as for a config that is not valid.
const (
	ConfigCheckFailed      Code = "CONFIG_CHECK_FAILED"      // the driver answered with an error, or an answer beyond the limits
	ConfigCheckTimeout     Code = "CONFIG_CHECK_TIMEOUT"     // the driver did not answer within configCheckTimeout
	ConfigCheckShed        Code = "CONFIG_CHECK_SHED"        // the plugin's checks in progress were at configCheck.maxConcurrent for configCheck.maxWait
	ConfigCheckUnavailable Code = "CONFIG_CHECK_UNAVAILABLE" // the plugin's checks timed out repeatedly: failing fast until the cool-down ends
)

// Codes of a policy source's failures (GET /v1/status, the service log, the start). A bundle
// that fails never replaces the active policy.
const (
	PolicyBundleLoad  Code = "POLICY_BUNDLE_LOAD"  // a bundle could not be read, or its signature did not verify
	PolicyBundleCheck Code = "POLICY_BUNDLE_CHECK" // a bundle did not compile or does not define the entrypoint
	PolicyRemote      Code = "POLICY_REMOTE"       // OPA's plugin manager could not be set up
	// PolicyBundleRollback: a signed bundle was issued (its signature's iat) before the active
	// one, or carries no iat while the active one does.
	PolicyBundleRollback Code = "POLICY_BUNDLE_ROLLBACK"
	// PolicyBundleRoots: a bundle other than the gate's declares roots that reach authz or
	// system (no .manifest roots reach everything), or, with other bundles configured, the
	// gate's bundle declares roots outside them. The bundle is not activated.
	PolicyBundleRoots Code = "POLICY_BUNDLE_ROOTS"
	// PolicyBundleTooLarge: a bundle other than the gate's carries more Rego than the
	// configuration allows a bundle beside the gate's (otherBundleRegoBytes). The bundle is
	// not activated, so its compile never holds up the gate's bundle.
	PolicyBundleTooLarge Code = "POLICY_BUNDLE_TOO_LARGE"
)
