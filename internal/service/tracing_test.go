package service_test

import (
	"bytes"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/authz-dev/authz/internal/service"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestRunExportsDecisionSpans runs the service with opa.distributed_tracing pointing at a
// loopback OTLP/HTTP receiver: the decision's spans arrive there, in the caller's trace.
func TestRunExportsDecisionSpans(t *testing.T) {
	recv := testutil.StartOTLPReceiver(t)
	addr := recv.Addr
	cfg := service.DefaultConfig()
	cfg.Facts = filepath.Join("..", "server", "testdata", "facts.json")
	cfg.Policy.OPA = map[string]any{"distributed_tracing": map[string]any{
		"type": "http", "address": addr, "service_name": "authz-test",
		"batch_span_processor_options": map[string]any{"batch_timeout_ms": 50},
	}}
	log := &testutil.SyncBuffer{}
	base, stop := startRun(t, cfg, log)
	c := &http.Client{Timeout: 10 * time.Second}
	require.Eventually(t, func() bool {
		resp, err := c.Get(base + "/health/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "never ready; log:\n%s", log)

	const traceID, parentID = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	body, err := os.ReadFile(filepath.Join("..", "specexamples", "request.json"))
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/authorize", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	var decision *tracepb.Span
	require.Eventually(t, func() bool {
		spans, _, _ := recv.Received()
		for _, s := range spans {
			if s.GetName() == "authz.decision" {
				decision = s
			}
		}
		return decision != nil && len(spans) >= 4
	}, 20*time.Second, 20*time.Millisecond, "no decision span exported; log:\n%s", log)
	assert.Equal(t, traceID, hex.EncodeToString(decision.GetTraceId()), "the caller's trace id")
	assert.Equal(t, parentID, hex.EncodeToString(decision.GetParentSpanId()), "the caller's span is the parent")

	spans, services, errs := recv.Received()
	assert.Empty(t, errs, "every export was OTLP/HTTP protobuf on /v1/traces")
	assert.Contains(t, services, "authz-test")
	children := map[string]bool{}
	for _, s := range spans {
		assert.Equal(t, traceID, hex.EncodeToString(s.GetTraceId()), s.GetName())
		children[s.GetName()] = true
	}
	for _, n := range []string{"authz.input", "authz.config_check", "authz.evaluate"} {
		assert.True(t, children[n], "span %s exported", n)
	}
	c.CloseIdleConnections()
	require.NoError(t, stop())
	assert.Contains(t, log.String(), "decisions are traced")
}

// TestRunRefusesTracingConfiguration: a distributed_tracing section authz cannot honour stops the
// start with a configuration error that names the field.
func TestRunRefusesTracingConfiguration(t *testing.T) {
	cfg := service.DefaultConfig()
	cfg.Facts = filepath.Join("..", "server", "testdata", "facts.json")
	cfg.Policy.OPA = map[string]any{"distributed_tracing": map[string]any{"type": "zipkin"}}
	err := service.Run(t.Context(), cfg, service.Options{LogOutput: io.Discard, Listener: loopback(t)})
	var ce *service.ConfigError
	require.ErrorAs(t, err, &ce)
	assert.Contains(t, err.Error(), "opa.distributed_tracing.type")
}
