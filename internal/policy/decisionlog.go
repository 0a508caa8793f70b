package policy

import (
	"context"
	"errors"
	"time"

	"github.com/open-policy-agent/opa/v1/metrics"
	opaserver "github.com/open-policy-agent/opa/v1/server"
	"go.opentelemetry.io/otel/trace"
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
}

// DecisionLogs reports whether the opa section configures decision_logs.
func (s *Source) DecisionLogs() bool { return s.remote != nil && s.remote.logs != nil }

// LogDecision hands d to OPA's decision-log plugin when decision_logs is configured: it drops
// and masks the event with the system.log.drop and system.log.mask policies of the bundles,
// prints it (console) and uploads it in batches (service). It never blocks on the upload; an
// event the plugin's buffer cannot hold is dropped by the plugin (see OPA's buffer settings).
func (s *Source) LogDecision(ctx context.Context, d Decision) error {
	if !s.DecisionLogs() {
		return nil
	}
	info := &opaserver.Info{
		DecisionID: d.ID,
		Path:       d.Path,
		Timestamp:  d.Timestamp,
		Input:      &d.Input,
		Results:    &d.Result,
		Revision:   d.Revision,
		RemoteAddr: d.RemoteAddr,
		Metrics:    metrics.New(),
		Bundles:    map[string]opaserver.BundleInfo{},
	}
	for n, b := range s.Status().Bundles {
		if b.ActiveRevision != "" {
			info.Bundles[n] = opaserver.BundleInfo{Revision: b.ActiveRevision}
		}
	}
	if d.Error != "" {
		info.Error = errors.New(d.Error)
	}
	// The decision's span, when it is traced: the entry leads to its trace, as OPA's own do.
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		info.TraceID, info.SpanID = sc.TraceID().String(), sc.SpanID().String()
	}
	return s.remote.logs.Log(ctx, info)
}
