package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
)

// Decisions makes every decision an OpenTelemetry span (SpanDecision) whose parent is the
// caller's W3C traceparent, with children for the input assembly, the driver's config check and
// the evaluation. The zero value traces nothing and costs nothing.
type Decisions struct {
	// Provider records and exports the spans; tracing is off when nil.
	Provider trace.TracerProvider
	// Exclude, when not nil, leaves decisions asked on the paths it reports untraced (OPA's
	// distributed_tracing.exclude_paths).
	Exclude func(path string) bool
}

// DecisionsOf traces decisions with tp, except on the paths exclude reports; tracing is off when
// tp is nil (a nil *TracerProvider held in the Provider interface would not read as off).
func DecisionsOf(tp *sdktrace.TracerProvider, exclude func(path string) bool) Decisions {
	if tp == nil {
		return Decisions{}
	}
	return Decisions{Provider: tp, Exclude: exclude}
}

// Decisions traces the service's decisions with the exported provider and its exclude_paths.
func (e *Export) Decisions() Decisions { return DecisionsOf(e.Provider, e.Exclude) }

// DecisionTracer opens the spans of decisions. A nil *DecisionTracer traces nothing.
type DecisionTracer struct {
	tracer  trace.Tracer
	exclude func(path string) bool
}

// Tracer is the DecisionTracer of d; nil when d has no Provider.
func (d Decisions) Tracer() *DecisionTracer {
	if d.Provider == nil {
		return nil
	}
	return &DecisionTracer{tracer: d.Provider.Tracer(InstrumentationName), exclude: d.Exclude}
}

// traceContext reads the caller's traceparent and tracestate headers.
var traceContext propagation.TextMapPropagator = propagation.TraceContext{}

// StartDecision opens the span of one decision asked by r under the caller's trace context, and
// returns the context the decision runs in. path is the endpoint's path as the decision records
// it, operation and pluginID the request's. Without tracing (t nil) or on a path Exclude reports
// (r's URL path) it returns r's context and a nil span, and allocates nothing.
func (t *DecisionTracer) StartDecision(r *http.Request, path, operation, pluginID string) (context.Context, trace.Span) {
	ctx := r.Context()
	if t == nil || (t.exclude != nil && t.exclude(r.URL.Path)) {
		return ctx, nil
	}
	ctx = traceContext.Extract(ctx, propagation.HeaderCarrier(r.Header))
	return t.tracer.Start(ctx, SpanDecision,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			AttrPath.String(path),
			AttrOperation.String(operation),
			AttrPluginID.String(pluginID),
		))
}

// Outcome is what a decision answered, as its span records it.
type Outcome struct {
	DecisionID string
	Allow      bool
	Code       string
	Revision   string
	// EvalError is the code of the evaluation's failure, "" when the policy was evaluated.
	EvalError coded.Code
	// LogFailed: the required decision log could not record the decision, and the caller was
	// answered a deny with DECISION_LOG_UNAVAILABLE instead of it.
	LogFailed bool
}

// EndDecision records what the caller was answered and ends span (nil: nothing is traced): the
// decision, or the deny that replaced it when the decision log failed.
func EndDecision(span trace.Span, o Outcome) {
	if span == nil {
		return
	}
	allow, code := o.Allow, o.Code
	if o.LogFailed {
		allow, code = false, string(coded.DecisionLogUnavailable)
	}
	span.SetAttributes(
		AttrDecisionID.String(o.DecisionID),
		AttrAllow.Bool(allow),
		AttrCode.String(code),
		AttrRevision.String(o.Revision),
	)
	switch {
	case o.EvalError != "":
		span.SetAttributes(AttrError.String(string(o.EvalError)))
		span.SetStatus(codes.Error, string(o.EvalError))
	case o.LogFailed:
		span.SetStatus(codes.Error, string(coded.DecisionLogUnavailable))
	}
	span.End()
}
