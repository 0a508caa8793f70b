package policy

import (
	"strings"
	"time"

	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/authz-dev/authz/internal/coded"
)

// Operations and outcomes of authz_bundle_operations_total. Every label takes a value from a
// fixed set (the bundle from the configuration), so the series are bounded.
const (
	opDownload = "download"
	opActivate = "activate"

	outcomeOK        = "ok"
	outcomeUnchanged = "unchanged" // the server answered 304 Not Modified
	outcomeFailed    = "failed"
	outcomeRefused   = "refused"

	reasonNone = "none"
)

func newBundleOps() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "authz_bundle_operations_total",
		Help: "Remote bundle downloads and activations, by bundle (as configured), operation (download, activate), outcome (download: ok, unchanged, failed; activate: ok, unchanged, refused) and reason (none; download: stalled, too_large, signature, http_status, unreachable, other; activate: roots, size, rollback, check, load, other).",
	}, []string{"bundle", "operation", "outcome", "reason"})
}

// Describe implements prometheus.Collector: authz_bundle_operations_total.
func (s *Source) Describe(ch chan<- *prometheus.Desc) { s.ops.Describe(ch) }

// Collect implements prometheus.Collector.
func (s *Source) Collect(ch chan<- prometheus.Metric) { s.ops.Collect(ch) }

// countLocked counts what OPA's status of bundle n says happened since the status seen
// before (seen: the LastRequest of that one); fresh is whether an activation brought
// something new; s.mu is held.
func (s *Source) countLocked(n string, st *bundleplugin.Status, seen time.Time, fresh bool) {
	if st.LastRequest.IsZero() || !st.LastRequest.After(seen) {
		return
	}
	switch {
	case !st.LastSuccessfulRequest.Equal(st.LastRequest):
		s.ops.WithLabelValues(n, opDownload, outcomeFailed, downloadReason(st.Message)).Inc()
	case !st.LastSuccessfulDownload.Equal(st.LastRequest):
		s.ops.WithLabelValues(n, opDownload, outcomeUnchanged, reasonNone).Inc()
	default:
		s.ops.WithLabelValues(n, opDownload, outcomeOK, reasonNone).Inc()
		if c := s.checks[n]; c.code != "" {
			s.ops.WithLabelValues(n, opActivate, outcomeRefused, activateReason(c.code)).Inc()
		} else if st.Code != "" {
			s.ops.WithLabelValues(n, opActivate, outcomeRefused, "other").Inc()
		} else if fresh {
			s.ops.WithLabelValues(n, opActivate, outcomeOK, reasonNone).Inc()
		} else { // the same content again (a server without ETag)
			s.ops.WithLabelValues(n, opActivate, outcomeUnchanged, reasonNone).Inc()
		}
	}
}

// downloadReason classifies the message of a failed download.
func downloadReason(msg string) string {
	switch {
	case strings.Contains(msg, errDownloadStalled.Error()):
		return "stalled"
	case strings.Contains(msg, errBundleBound.Error()) || strings.Contains(msg, errRegoBound.Error()):
		return "too_large"
	case strings.Contains(msg, "signature") || strings.Contains(msg, "verif"):
		return "signature"
	case strings.Contains(msg, "server replied with"):
		return "http_status"
	case strings.Contains(msg, "connection refused") || strings.Contains(msg, "no such host") || strings.Contains(msg, "timeout") ||
		strings.Contains(msg, "EOF") || strings.Contains(msg, "connection reset") || strings.Contains(msg, "dial "):
		return "unreachable"
	}
	return "other"
}

// activateReason is the reason label of authz's refusal code.
func activateReason(code string) string {
	switch coded.Code(code) {
	case coded.PolicyBundleRoots:
		return "roots"
	case coded.PolicyBundleTooLarge:
		return "size"
	case coded.PolicyBundleRollback:
		return "rollback"
	case coded.PolicyBundleCheck:
		return "check"
	case coded.PolicyBundleLoad:
		return "load"
	}
	return "other"
}
