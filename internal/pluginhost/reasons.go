package pluginhost

import "strings"

// Reason codes of a plugin's last error. PluginState.LastError is for the service log: it names
// the executable's path, its digests, process ids and the driver's own words. What the plugin
// host shows to API callers is the reason code alone (LastErrorReason).
const (
	ReasonPinMismatch     = "PIN_MISMATCH"     // the executable's SHA-256 is not the configured pin
	ReasonPinUnreadable   = "PIN_UNREADABLE"   // the executable could not be read to check its pin
	ReasonStartTimeout    = "START_TIMEOUT"    // no go-plugin handshake within the start timeout
	ReasonHandshakeFailed = "HANDSHAKE_FAILED" // the process exited or wrote to stdout before the handshake
	ReasonInvalidManifest = "INVALID_MANIFEST" // the driver described itself with an invalid manifest
	ReasonWorkerExited    = "WORKER_EXITED"    // a running worker exited (it is restarted)
	ReasonUnsafeBinary    = "UNSAFE_BINARY"    // the executable or its directory is writable by group or others
	ReasonIdentity        = "IDENTITY_REFUSED" // the process is not the verified one (socket, peer, executable)
	ReasonKeyConflict     = "KEY_CONFLICT"     // the reported plugin key is another plugin's
	ReasonLimitExceeded   = "LIMIT_EXCEEDED"   // the driver reported more than the host's limits allow
	ReasonBrokerRefused   = "BROKER_REFUSED"   // the driver flooded the go-plugin broker the host does not offer
	ReasonStartFailed     = "START_FAILED"     // any other failure to start or set up a worker
)

// reasonPrefixes map the beginnings of the supervisor's error messages to their reason codes.
// TestLastErrorReasons checks them against the messages of real failing plugins.
var reasonPrefixes = []struct{ prefix, reason string }{
	{"sha256 mismatch for ", ReasonPinMismatch},
	{"sha256 pin check by go-plugin failed", ReasonPinMismatch},
	{"cannot hash plugin binary", ReasonPinUnreadable},
	{"open plugin binary", ReasonPinUnreadable},
	{"stat plugin binary", ReasonPinUnreadable},
	{"copy plugin binary", ReasonPinUnreadable},
	{"plugin binary ", ReasonUnsafeBinary},
	{"plugin directory ", ReasonUnsafeBinary},
	{"driver announced ", ReasonIdentity},
	{"the socket ", ReasonIdentity},
	{"driver pid ", ReasonIdentity},
	{"cannot confirm what driver pid", ReasonIdentity},
	{"the driver reports plugin key ", ReasonKeyConflict},
	{"ended by the host: the driver sent more than", ReasonBrokerRefused},
	{"plugin did not complete the go-plugin handshake within the start timeout", ReasonStartTimeout},
	{"plugin wrote to stdout before the go-plugin handshake", ReasonHandshakeFailed},
	{"plugin ended its stdout before the go-plugin handshake", ReasonHandshakeFailed},
	{"plugin exited before the go-plugin handshake", ReasonHandshakeFailed},
	{"invalid manifest from plugin", ReasonInvalidManifest},
	{"worker generation ", ReasonWorkerExited},
}

// LastErrorReason is the reason code of a PluginState.LastError: "" when there is none.
func LastErrorReason(lastError string) string {
	if lastError == "" {
		return ""
	}
	for _, p := range reasonPrefixes {
		if strings.HasPrefix(lastError, p.prefix) {
			return p.reason
		}
	}
	if strings.Contains(lastError, limitsHint) {
		return ReasonLimitExceeded
	}
	return ReasonStartFailed
}
