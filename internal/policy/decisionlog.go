package policy

import (
	"context"
	"errors"
	"time"

	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	opaserver "github.com/open-policy-agent/opa/v1/server"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Decision is one decision, as OPA's decision-log plugin records it: the API's record
// (api.Decision) and the active bundles.
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

// DecisionOf is the decision log's record of rec, without bundles.
func DecisionOf(rec api.Decision) Decision {
	return Decision{ID: rec.ID, Path: rec.Path, Timestamp: rec.Timestamp, Input: rec.Input, Result: rec.Result,
		Revision: rec.Revision, RemoteAddr: rec.RemoteAddr, Error: rec.Error}
}

// DecisionLogs reports whether the opa section configures decision_logs.
func (s *Source) DecisionLogs() bool { return s.remote != nil && s.remote.logs != nil }

// LogDecision hands d to OPA's decision-log plugin when decision_logs is configured: it drops
// and masks the event with the system.log.drop and system.log.mask policies of the bundles,
// prints it (console) and uploads it in batches (service). It never blocks on the upload; an
// event the plugin's buffer cannot hold is dropped by the plugin (see OPA's buffer settings).
func (s *Source) LogDecision(ctx context.Context, rec api.Decision) error {
	if !s.DecisionLogs() {
		return nil
	}
	d := DecisionOf(rec)
	d.Bundles = map[string]opaserver.BundleInfo{}
	for n, b := range s.Status().Bundles {
		if b.ActiveRevision != "" {
			d.Bundles[n] = opaserver.BundleInfo{Revision: b.ActiveRevision}
		}
	}
	return LogToOPA(ctx, s.remote.logs, d)
}

// LogToOPA hands d to lp, OPA's decision-log plugin, as OPA records its own decisions: with
// the decision's trace and span ids when it is traced, so that an entry leads to its trace.
// `authz serve` (Source.LogDecision) and `authz run` (the gate inside OPA) both log through it.
//
// OPA's plugin applies the system.log.mask rules to the values it is handed in place (it removes
// and upserts members of their maps and slices). The input holds the facts documents every
// decision shares and the result may be the decision cache's, so the plugin gets copies of both:
// a mask changes what is logged, never what is decided next.
func LogToOPA(ctx context.Context, lp *logs.Plugin, d Decision) error {
	input, result := snapshot.CopyDocument(d.Input), snapshot.CopyDocument(d.Result)
	info := &opaserver.Info{
		DecisionID: d.ID,
		Path:       d.Path,
		Timestamp:  d.Timestamp,
		Input:      &input,
		Results:    &result,
		Revision:   d.Revision,
		RemoteAddr: d.RemoteAddr,
		Metrics:    metrics.New(),
		Bundles:    d.Bundles,
	}
	if info.Bundles == nil {
		info.Bundles = map[string]opaserver.BundleInfo{}
	}
	if d.Error != "" {
		info.Error = errors.New(d.Error)
	}
	// The decision's span, when it is traced: the entry leads to its trace, as OPA's own do.
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		info.TraceID, info.SpanID = sc.TraceID().String(), sc.SpanID().String()
	}
	return lp.Log(ctx, info)
}
