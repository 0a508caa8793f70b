// Package policystate holds the policy's state as the service shows it and the records and bounds
// it shares with the HTTP server: the status GET /v1/status answers, the origin kinds, the
// decision handed to OPA's decision-log plugin, and the memory bounds of reading a bundle and of
// OPA's decision-log buffer. internal/policy fills and uses them, the HTTP server renders them;
// they live apart from both so that the server does not depend on the policy source.
//
// It imports no package of authz.
package policystate

import (
	"time"

	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	opaserver "github.com/open-policy-agent/opa/v1/server"
)

// Status is the state of the policy: GET /v1/status. Bundles holds, per bundle, OPA's bundle
// status (the shape of OPA's status API); an error of authz's own check of a bundle (entrypoint
// missing) shows there too, with code POLICY_BUNDLE_CHECK.
type Status struct {
	// Revision is the active policy's revision: the manifest revision of its bundle (the
	// revisions of several bundles joined as NAME=REVISION,...), or for the embedded policy
	// and bundles without one a digest of their content ("sha256:…"). "" while none is active.
	Revision string `json:"revision"`
	// Origin says where the active policy came from: "embedded", "file:PATH" or
	// "remote:NAME[,NAME…]".
	Origin string `json:"origin"`
	// ActivatedAt is when the active policy was activated (zero while none is).
	ActivatedAt time.Time `json:"activated_at"`
	// Bundles is the status of each configured bundle, by name.
	Bundles map[string]*bundleplugin.Status `json:"bundles"`
	// LastError is the last failure to activate a policy (any bundle), "" when there was none
	// since the last activation.
	LastError string `json:"last_error,omitempty"`
}

// Origin kinds, the first word of Status.Origin.
const (
	OriginEmbedded = "embedded"
	OriginFile     = "file"
	OriginRemote   = "remote"
)

// Decision is one decision, as OPA's decision-log plugin records it.
type Decision struct {
	ID         string
	Path       string // the decision's path below data, e.g. "authz/decision"
	Timestamp  time.Time
	Input      any
	Result     any
	Revision   string
	RemoteAddr string
	// Error is the evaluation failure's code when the decision could not be evaluated.
	Error string
	// Bundles are the active bundles and their revisions (filled in by the source that logs).
	Bundles map[string]opaserver.BundleInfo
}

// Memory bounds of the policy source, with OPA's configuration left at authz's defaults.
const (
	// DefaultBundleEntryBytes bounds one file of a bundle, decompressed (OPA's
	// size_limit_bytes of remote bundles, when the opa section does not set it).
	DefaultBundleEntryBytes = 8 << 20
	// DefaultBundleTotalBytes bounds a whole bundle, decompressed: its files, and for a
	// tarball its tar headers and padding.
	DefaultBundleTotalBytes = 8 << 20
	// BundleReadBytes is the most a bundle being read holds before its signature is checked,
	// with the default bounds: its decompressed files, and the buffer OPA's downloader sizes
	// from an entry's header (within the bound of one file) before the entry arrives.
	BundleReadBytes = DefaultBundleTotalBytes + DefaultBundleEntryBytes
	// DefaultDecisionLogBufferBytes is OPA's decision_logs.reporting.buffer_size_limit_bytes
	// when the opa section sets neither it nor another bound of the buffer (buffer_type
	// "event", max_decisions_per_second). OPA's default is no limit: while the collector is
	// unreachable the buffer of (compressed) decisions grows until the process runs out of
	// memory. At the limit OPA drops the oldest decisions and counts them
	// (decision_logs_dropped_buffer_size_limit_bytes_exceeded).
	DefaultDecisionLogBufferBytes = 16 << 20
)
