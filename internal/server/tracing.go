package server

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/tracing"
)

// Tracing makes every decision an OpenTelemetry span (authz.decision) whose parent is the
// caller's W3C traceparent, with children for the input assembly, the driver's config check and
// the evaluation (internal/tracing). The zero value traces nothing and costs nothing.
type Tracing struct {
	// Provider records and exports the spans; tracing is off when nil.
	Provider trace.TracerProvider
	// Exclude, when not nil, leaves decisions asked on the paths it reports untraced (OPA's
	// distributed_tracing.exclude_paths).
	Exclude func(path string) bool
}

// traceContext reads the caller's traceparent and tracestate headers.
var traceContext propagation.TextMapPropagator = propagation.TraceContext{}

func newTracer(t Tracing) trace.Tracer {
	if t.Provider == nil {
		return nil
	}
	return t.Provider.Tracer(tracing.InstrumentationName)
}

// startDecisionSpan opens the span of one decision under the caller's trace context, and
// returns the context the decision runs in. Without tracing it returns the request's context
// and a nil span, and allocates nothing.
func (s *Server) startDecisionSpan(r *http.Request, path string, req *snapshot.Request) (context.Context, trace.Span) {
	ctx := r.Context()
	if s.tracer == nil || (s.traceExclude != nil && s.traceExclude(r.URL.Path)) {
		return ctx, nil
	}
	ctx = traceContext.Extract(ctx, propagation.HeaderCarrier(r.Header))
	pluginID, _ := req.Metadata["pluginId"].(string)
	return s.tracer.Start(ctx, tracing.SpanDecision,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			tracing.AttrPath.String(path),
			tracing.AttrOperation.String(req.Operation),
			tracing.AttrPluginID.String(pluginID),
		))
}

// endDecisionSpan records what the caller was answered and ends the span: the decision, or,
// when the required decision log could not record it (answered is false), the deny that
// replaced it.
func endDecisionSpan(span trace.Span, doc decision.Document, evalCode coded.Code, answered bool) {
	if span == nil {
		return
	}
	allow, code := doc.Allow, doc.Code
	if !answered {
		allow, code = false, string(coded.DecisionLogUnavailable)
	}
	span.SetAttributes(
		tracing.AttrDecisionID.String(doc.DecisionID),
		tracing.AttrAllow.Bool(allow),
		tracing.AttrCode.String(code),
		tracing.AttrRevision.String(doc.Revision),
	)
	switch {
	case evalCode != "":
		span.SetAttributes(tracing.AttrError.String(string(evalCode)))
		span.SetStatus(codes.Error, string(evalCode))
	case !answered:
		span.SetStatus(codes.Error, string(coded.DecisionLogUnavailable))
	}
	span.End()
}
