// Package tracing holds what the decision path needs of OpenTelemetry: the names of its spans
// and attributes, the span of each decision under the caller's trace context (Decisions:
// StartDecision, EndDecision), and Start, which opens a child span only under a recording
// parent. Without a tracer provider (tracing not configured) nothing is recorded, allocated or
// exported: the decision path costs what it cost before tracing existed. It also reads the
// distributed_tracing section of the configuration (ParseConfig), builds its OTLP tracer
// provider (NewProvider) and the export a service owns and flushes at shutdown (StartExport).
//
// The tree of one decision:
//
//	authz.decision            (StartDecision; its parent is the caller's traceparent)
//	├── authz.input           (internal/snapshot.Build: the input document)
//	│   └── authz.config_check (the driver's ConfigValid, when the decision consults it)
//	└── authz.evaluate        (internal/decision: the policy, or the decision cache)
package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
)

// InstrumentationName names the tracer of authz's spans (the instrumentation scope).
const InstrumentationName = "github.com/authz-dev/authz"

// Span names.
const (
	SpanDecision    = "authz.decision"
	SpanInput       = "authz.input"
	SpanConfigCheck = "authz.config_check"
	SpanEvaluate    = "authz.evaluate"
)

// Attribute keys.
const (
	AttrOperation   = attribute.Key("authz.operation")
	AttrPath        = attribute.Key("authz.path")
	AttrDecisionID  = attribute.Key("authz.decision_id")
	AttrAllow       = attribute.Key("authz.allow")
	AttrCode        = attribute.Key("authz.code")
	AttrRevision    = attribute.Key("authz.revision")
	AttrPluginID    = attribute.Key("authz.plugin_id")
	AttrError       = attribute.Key("authz.error")
	AttrDriverKey   = attribute.Key("authz.driver_key")
	AttrConfigValid = attribute.Key("authz.config_valid")
)

// Start opens the span name as a child of the span in ctx, with that span's tracer provider.
// When ctx holds no recording span (tracing off, or a trace not sampled) it returns ctx and the
// span of ctx unchanged: nothing is allocated, and End on the returned span does nothing.
func Start(ctx context.Context, name string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, parent
	}
	return parent.TracerProvider().Tracer(InstrumentationName).Start(ctx, name)
}

// End ends span, marking it failed with err's code when err is not nil.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		code := coded.CodeOf(err)
		if code == "" {
			code = coded.EvalError
		}
		span.SetAttributes(AttrError.String(string(code)))
		span.SetStatus(codes.Error, string(code))
	}
	span.End()
}

// EndConfigCheck ends the span of a driver's config check with its outcome. A failure is
// recorded by its code only, as End records it: the error's text comes from the driver, and a
// span is no place for what a driver chose to say.
func EndConfigCheck(span trace.Span, pluginID, driverKey string, valid bool, err error) {
	if span.IsRecording() {
		span.SetAttributes(AttrPluginID.String(pluginID), AttrDriverKey.String(driverKey), AttrConfigValid.Bool(err == nil && valid))
	}
	End(span, err)
}
