// Package policystate holds the memory bounds of the policy source that the HTTP server counts
// in its memory model: reading a bundle and OPA's decision-log buffer. internal/policy uses
// them; they live apart so that the server does not depend on the policy source. (The policy's
// state as the API shows it is internal/api's Status.)
//
// It imports no package of authz.
package policystate

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
