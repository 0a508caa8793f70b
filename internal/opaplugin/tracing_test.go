package opaplugin

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
	"github.com/authz-dev/authz/internal/tracing"
)

// TestGateTracesWithOPATracerProvider: under OPA's tracer provider (the one OPA builds from its
// distributed_tracing section), every gate decision is a span in the caller's trace with the
// input, config check and evaluation beneath it, and OPA's decision log entry carries its
// trace and span ids.
func TestGateTracesWithOPATracerProvider(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	console := newConsoleRecorder()
	m := newManager(t, policyBundle(t, "rev-3"), plugins.WithTracerProvider(tp), plugins.ConsoleLogger(console))
	lcfg, err := logs.NewConfigBuilder().WithBytes([]byte(`{"console": true}`)).Parse()
	require.NoError(t, err)
	lp := logs.New(lcfg, m)
	m.Register(logs.Name, lp)
	require.NoError(t, lp.Start(t.Context()))

	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`, io.Discard)
	waitState(t, m, plugins.StateOK)
	reqJSON, _ := specexamples.NewFixture().JSON()
	const traceID, parentID = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.Addr().String()+"/v1/authorize", bytes.NewReader(reqJSON))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		byName[s.Name()] = s
	}
	root := byName[tracing.SpanDecision]
	require.NotNil(t, root, "spans: %v", byName)
	assert.Equal(t, traceID, root.SpanContext().TraceID().String())
	assert.Equal(t, parentID, root.Parent().SpanID().String())
	for _, n := range []string{tracing.SpanInput, tracing.SpanConfigCheck, tracing.SpanEvaluate} {
		require.Contains(t, byName, n)
		assert.Equal(t, traceID, byName[n].SpanContext().TraceID().String(), n)
	}
	assert.Equal(t, root.SpanContext().SpanID(), byName[tracing.SpanEvaluate].Parent().SpanID())
	var revision string
	for _, kv := range root.Attributes() {
		if kv.Key == tracing.AttrRevision {
			revision = kv.Value.AsString()
		}
	}
	assert.Equal(t, "rev-3", revision)

	events := console.Events()
	require.Len(t, events, 1)
	ev := testutil.JSONObject(t, events[0])
	assert.Equal(t, traceID, ev["trace_id"], "OPA's decision log leads to the trace")
	assert.Equal(t, root.SpanContext().SpanID().String(), ev["span_id"])
}

// TestGateUntracedWithoutOPATracing: without distributed_tracing OPA has no tracer provider,
// and the gate traces nothing (a nil provider must not read as one).
func TestGateUntracedWithoutOPATracing(t *testing.T) {
	m := newManager(t, nil)
	assert.Nil(t, gateTracing(m).Provider)
}
