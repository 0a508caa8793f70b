package tracing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/tracing"
)

const (
	callerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID  = "00f067aa0ba902b7"
)

func recordedDecisions(t *testing.T, exclude func(string) bool) (*tracing.DecisionTracer, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	dt := tracing.DecisionsOf(tp, exclude).Tracer()
	require.NotNil(t, dt)
	return dt, rec
}

func decisionRequest(path, traceparent string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, nil)
	if traceparent != "" {
		r.Header.Set("traceparent", traceparent)
		r.Header.Set("tracestate", "vendor=opaque")
	}
	return r
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestDecisionsOffCostNothing(t *testing.T) {
	assert.Nil(t, tracing.Decisions{}.Tracer(), "no provider, no tracer")
	assert.Equal(t, tracing.Decisions{}, tracing.DecisionsOf(nil, func(string) bool { return true }),
		"a nil provider is off, not a provider that panics")
	var off *tracing.DecisionTracer
	r := decisionRequest("/v1/authorize", "00-"+callerTraceID+"-"+callerSpanID+"-01")
	allocs := testing.AllocsPerRun(100, func() {
		ctx, span := off.StartDecision(r, "/v1/authorize", "openDuplexChannel", "p")
		if ctx != r.Context() || span != nil {
			t.Fatal("an untraced decision runs in the request's context, without a span")
		}
		tracing.EndDecision(span, tracing.Outcome{DecisionID: "d", Allow: true})
	})
	assert.Zero(t, allocs, "no allocation when tracing is off")
}

func TestStartDecisionUnderTheCallersTrace(t *testing.T) {
	dt, rec := recordedDecisions(t, nil)
	r := decisionRequest("/v1/data/authz/decision", "00-"+callerTraceID+"-"+callerSpanID+"-01")
	ctx, span := dt.StartDecision(r, "/v1/data/authz/decision", "openDuplexChannel", "test.plugin")
	require.NotNil(t, span)
	assert.Equal(t, span.SpanContext(), trace.SpanContextFromContext(ctx), "the decision runs in its span")
	tracing.EndDecision(span, tracing.Outcome{DecisionID: "id-1", Allow: true, Code: "OK", Revision: "rev-1"})

	spans := rec.Ended()
	require.Len(t, spans, 1)
	s := spans[0]
	assert.Equal(t, tracing.SpanDecision, s.Name())
	assert.Equal(t, trace.SpanKindServer, s.SpanKind())
	assert.Equal(t, callerTraceID, s.SpanContext().TraceID().String())
	assert.Equal(t, callerSpanID, s.Parent().SpanID().String())
	assert.True(t, s.Parent().IsRemote())
	assert.Equal(t, "vendor=opaque", s.SpanContext().TraceState().String())
	a := spanAttrs(s)
	assert.Equal(t, "/v1/data/authz/decision", a[tracing.AttrPath].AsString())
	assert.Equal(t, "openDuplexChannel", a[tracing.AttrOperation].AsString())
	assert.Equal(t, "test.plugin", a[tracing.AttrPluginID].AsString())
	assert.Equal(t, "id-1", a[tracing.AttrDecisionID].AsString())
	assert.True(t, a[tracing.AttrAllow].AsBool())
	assert.Equal(t, "OK", a[tracing.AttrCode].AsString())
	assert.Equal(t, "rev-1", a[tracing.AttrRevision].AsString())
	assert.NotContains(t, a, tracing.AttrError)
	assert.Equal(t, codes.Unset, s.Status().Code)
}

func TestStartDecisionExcludedPath(t *testing.T) {
	dt, rec := recordedDecisions(t, func(p string) bool { return p == "/v1/capabilities" })
	r := decisionRequest("/v1/capabilities", "00-"+callerTraceID+"-"+callerSpanID+"-01")
	ctx, span := dt.StartDecision(r, "/v1/capabilities", "openDuplexChannel", "p")
	assert.Nil(t, span)
	assert.Equal(t, r.Context(), ctx)
	tracing.EndDecision(span, tracing.Outcome{})
	_, span = dt.StartDecision(decisionRequest("/v1/authorize", ""), "/v1/authorize", "openDuplexChannel", "p")
	require.NotNil(t, span)
	tracing.EndDecision(span, tracing.Outcome{})
	require.Len(t, rec.Ended(), 1, "other paths are traced")
	assert.False(t, rec.Ended()[0].Parent().IsValid(), "without a traceparent the decision starts a trace")
}

func TestEndDecisionRecordsFailures(t *testing.T) {
	t.Run("evaluation failed", func(t *testing.T) {
		dt, rec := recordedDecisions(t, nil)
		_, span := dt.StartDecision(decisionRequest("/v1/authorize", ""), "/v1/authorize", "op", "p")
		tracing.EndDecision(span, tracing.Outcome{DecisionID: "d", Code: string(coded.EvalTimeout), EvalError: coded.EvalTimeout})
		require.Len(t, rec.Ended(), 1)
		s := rec.Ended()[0]
		a := spanAttrs(s)
		assert.False(t, a[tracing.AttrAllow].AsBool())
		assert.Equal(t, string(coded.EvalTimeout), a[tracing.AttrError].AsString())
		assert.Equal(t, codes.Error, s.Status().Code)
		assert.Equal(t, string(coded.EvalTimeout), s.Status().Description)
	})
	t.Run("decision log unavailable", func(t *testing.T) {
		dt, rec := recordedDecisions(t, nil)
		_, span := dt.StartDecision(decisionRequest("/v1/authorize", ""), "/v1/authorize", "op", "p")
		tracing.EndDecision(span, tracing.Outcome{DecisionID: "d", Allow: true, Code: "OK", LogFailed: true})
		require.Len(t, rec.Ended(), 1)
		s := rec.Ended()[0]
		a := spanAttrs(s)
		assert.False(t, a[tracing.AttrAllow].AsBool(), "the span records the deny the caller was answered")
		assert.Equal(t, string(coded.DecisionLogUnavailable), a[tracing.AttrCode].AsString())
		assert.NotContains(t, a, tracing.AttrError, "the policy was evaluated")
		assert.Equal(t, codes.Error, s.Status().Code)
		assert.Equal(t, string(coded.DecisionLogUnavailable), s.Status().Description)
	})
}
