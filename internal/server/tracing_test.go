package server_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/tracing"
)

const (
	callerTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpanID  = "00f067aa0ba902b7"
)

// tracedServer serves the test facts with spans recorded in memory.
func tracedServer(t testing.TB, tr tracing.Decisions, opts ...option) (string, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	tr.Provider = tp
	o := serverOpts{cfg: testConfig(), decider: testEngine(t), facts: staticFacts(t, "facts.json")}
	for _, f := range opts {
		f(&o)
	}
	s, err := server.New(o.cfg, o.decider, o.facts, server.Options{Tracing: tr, DecisionLog: o.log})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return startHTTP(t, s), rec
}

// postTraced posts body to url with the given W3C trace context headers ("" leaves one out).
func postTraced(t testing.TB, url, body, traceparent, tracestate string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testClient.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	if tracestate != "" {
		req.Header.Set("tracestate", tracestate)
	}
	resp, err := testClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return answer{status: resp.StatusCode, header: resp.Header, body: b}
}

func spansByName(t testing.TB, spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		require.NotContains(t, out, s.Name(), "one %s span per decision", s.Name())
		out[s.Name()] = s
	}
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

func TestDecisionSpanTree(t *testing.T) {
	tests := []struct {
		name, path string
		body       func(t testing.TB) string
	}{
		{"authorize", "/v1/authorize", func(t testing.TB) string { return fixture(t, nil) }},
		{"capabilities", "/v1/capabilities", func(t testing.TB) string { return fixture(t, nil) }},
		{"data API", "/v1/data/authz/decision", func(t testing.TB) string { return `{"input":` + fixture(t, nil) + `}` }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			url, rec := tracedServer(t, tracing.Decisions{})
			a := postTraced(t, url+tt.path, tt.body(t), "00-"+callerTraceID+"-"+callerSpanID+"-01", "vendor=opaque")
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			doc := a.json(t)
			if r, ok := doc["result"].(map[string]any); ok { // the Data API wraps the document
				doc = r
			}

			spans := spansByName(t, rec.Ended())
			require.Len(t, spans, 4, "the decision, its input, config check and evaluation")
			root := spans[tracing.SpanDecision]
			require.NotNil(t, root)
			assert.Equal(t, callerTraceID, root.SpanContext().TraceID().String(), "the caller's trace")
			assert.Equal(t, callerSpanID, root.Parent().SpanID().String(), "the caller's span is the parent")
			assert.True(t, root.Parent().IsRemote())
			assert.Equal(t, "vendor=opaque", root.SpanContext().TraceState().String(), "tracestate is carried on")
			assert.Equal(t, trace.SpanKindServer, root.SpanKind())

			ra := attrs(root)
			assert.Equal(t, "openDuplexChannel", ra[tracing.AttrOperation].AsString())
			assert.Equal(t, tt.path, ra[tracing.AttrPath].AsString())
			assert.Equal(t, "test.plugin", ra[tracing.AttrPluginID].AsString())
			assert.Equal(t, doc["decision_id"], ra[tracing.AttrDecisionID].AsString())
			assert.Equal(t, doc["revision"], ra[tracing.AttrRevision].AsString())
			require.Contains(t, ra, tracing.AttrAllow)
			assert.True(t, ra[tracing.AttrAllow].AsBool())
			if code, ok := doc["code"]; ok {
				assert.Equal(t, code, ra[tracing.AttrCode].AsString())
			}
			assert.Equal(t, codes.Unset, root.Status().Code)

			in, check, eval := spans[tracing.SpanInput], spans[tracing.SpanConfigCheck], spans[tracing.SpanEvaluate]
			require.NotNil(t, in)
			require.NotNil(t, check)
			require.NotNil(t, eval)
			for _, s := range []sdktrace.ReadOnlySpan{in, check, eval} {
				assert.Equal(t, callerTraceID, s.SpanContext().TraceID().String(), s.Name())
			}
			assert.Equal(t, root.SpanContext().SpanID(), in.Parent().SpanID(), "input assembly is a child of the decision")
			assert.Equal(t, root.SpanContext().SpanID(), eval.Parent().SpanID(), "evaluation is a child of the decision")
			assert.Equal(t, in.SpanContext().SpanID(), check.Parent().SpanID(), "the config check runs inside the input assembly")
			ca := attrs(check)
			assert.Equal(t, "test.plugin", ca[tracing.AttrPluginID].AsString())
			assert.Equal(t, "daytona", ca[tracing.AttrDriverKey].AsString())
			assert.True(t, ca[tracing.AttrConfigValid].AsBool())
			// Children end before their parent.
			assert.False(t, eval.EndTime().After(root.EndTime()))
			assert.False(t, check.EndTime().After(in.EndTime()))
		})
	}
}

func TestDecisionSpanWithoutTraceparentStartsATrace(t *testing.T) {
	url, rec := tracedServer(t, tracing.Decisions{})
	a := postTraced(t, url+"/v1/authorize", fixture(t, nil), "", "")
	require.Equal(t, http.StatusOK, a.status)
	root := spansByName(t, rec.Ended())[tracing.SpanDecision]
	require.NotNil(t, root)
	assert.False(t, root.Parent().IsValid(), "a new root span")
	assert.True(t, root.SpanContext().IsValid())
}

func TestDecisionSpanMalformedTraceparentIsIgnored(t *testing.T) {
	url, rec := tracedServer(t, tracing.Decisions{})
	a := postTraced(t, url+"/v1/authorize", fixture(t, nil), "00-not-a-trace-01", "")
	require.Equal(t, http.StatusOK, a.status, "a bad traceparent never changes the decision")
	root := spansByName(t, rec.Ended())[tracing.SpanDecision]
	require.NotNil(t, root)
	assert.False(t, root.Parent().IsValid())
}

func TestDecisionSpanFollowsTheCallersSamplingFlag(t *testing.T) {
	// A ParentBased sampler, as the tracing configuration builds: an unsampled caller is not
	// recorded, and no child span is opened under it.
	rec2 := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSpanProcessor(rec2))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	s, err := server.New(testConfig(), testEngine(t), staticFacts(t, "facts.json"), server.Options{Tracing: tracing.Decisions{Provider: tp}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	url2 := startHTTP(t, s)

	a := postTraced(t, url2+"/v1/authorize", fixture(t, nil), "00-"+callerTraceID+"-"+callerSpanID+"-00", "")
	require.Equal(t, http.StatusOK, a.status)
	assert.Empty(t, rec2.Ended(), "an unsampled trace records nothing")
}

func TestDecisionSpanExcludedPath(t *testing.T) {
	url, rec := tracedServer(t, tracing.Decisions{Exclude: func(p string) bool { return p == "/v1/capabilities" }})
	a := postTraced(t, url+"/v1/capabilities", fixture(t, nil), "00-"+callerTraceID+"-"+callerSpanID+"-01", "")
	require.Equal(t, http.StatusOK, a.status)
	assert.Empty(t, rec.Ended(), "exclude_paths leaves the path untraced")
	a = postTraced(t, url+"/v1/authorize", fixture(t, nil), "00-"+callerTraceID+"-"+callerSpanID+"-01", "")
	require.Equal(t, http.StatusOK, a.status)
	assert.Len(t, rec.Ended(), 4, "other paths are traced")
}

func TestDecisionSpanRecordsFailures(t *testing.T) {
	t.Run("evaluation failed", func(t *testing.T) {
		url, rec := tracedServer(t, tracing.Decisions{}, withDecider(failingDecider{err: coded.Errorf(coded.EvalTimeout, "evaluation took too long")}))
		a := postTraced(t, url+"/v1/authorize", fixture(t, nil), "00-"+callerTraceID+"-"+callerSpanID+"-01", "")
		require.Equal(t, http.StatusInternalServerError, a.status)
		root := spansByName(t, rec.Ended())[tracing.SpanDecision]
		require.NotNil(t, root)
		ra := attrs(root)
		assert.False(t, ra[tracing.AttrAllow].AsBool())
		assert.Equal(t, "EVAL_TIMEOUT", ra[tracing.AttrError].AsString())
		assert.Equal(t, codes.Error, root.Status().Code)
		assert.Equal(t, "EVAL_TIMEOUT", root.Status().Description)
	})
	t.Run("decision log unavailable", func(t *testing.T) {
		url, rec := tracedServer(t, tracing.Decisions{}, withDecisionLog(brokenWriter{}),
			withConfig(func(c *server.Config) { c.DecisionLog.Path, c.DecisionLog.Required = "-", true }))
		a := postTraced(t, url+"/v1/authorize", fixture(t, nil), "00-"+callerTraceID+"-"+callerSpanID+"-01", "")
		require.Equal(t, http.StatusServiceUnavailable, a.status)
		root := spansByName(t, rec.Ended())[tracing.SpanDecision]
		require.NotNil(t, root)
		ra := attrs(root)
		assert.False(t, ra[tracing.AttrAllow].AsBool(), "the span records the deny the caller was answered")
		assert.Equal(t, "DECISION_LOG_UNAVAILABLE", ra[tracing.AttrCode].AsString())
		assert.Equal(t, codes.Error, root.Status().Code)
	})
}

// BenchmarkAuthorizeTraced is BenchmarkAuthorize with every decision recorded (in memory).
func BenchmarkAuthorizeTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s, err := server.New(testConfig(), testEngine(b), staticFacts(b, "facts.json"), server.Options{Tracing: tracing.Decisions{Provider: tp}})
	require.NoError(b, err)
	h := s.Handler()
	body := fixture(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/v1/authorize", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+callerTraceID+"-"+callerSpanID+"-01")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d body %s", rec.Code, rec.Body)
		}
	}
}

// TestOPADecisionLogCarriesTheTrace: with decision_logs in the opa section, the decision's entry
// in OPA's decision log carries the trace id and the span id of its authz.decision span.
func TestOPADecisionLogCarriesTheTrace(t *testing.T) {
	eng := decision.New(decision.Options{})
	src, coll := opaLogged(t, "traced-1", policytest.EmbeddedModules(t), eng, false, nil)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	s, err := server.New(testConfig(), eng, staticFacts(t, "facts.json"), server.Options{Policy: src, DecisionLog: io.Discard, Tracing: tracing.Decisions{Provider: tp}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	url := startHTTP(t, s)

	a := postTraced(t, url+"/v1/authorize", fixture(t, nil), "00-"+callerTraceID+"-"+callerSpanID+"-01", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	id := a.json(t)["decision_id"].(string)
	root := spansByName(t, rec.Ended())[tracing.SpanDecision]
	require.NotNil(t, root)

	var ev map[string]any
	policytest.WaitFor(t, "the decision to be uploaded", 20*time.Second, func() bool { ev = coll.find(id); return ev != nil })
	assert.Equal(t, callerTraceID, ev["trace_id"])
	assert.Equal(t, root.SpanContext().SpanID().String(), ev["span_id"])
}
