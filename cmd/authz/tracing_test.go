package main

import (
	"bytes"
	"encoding/hex"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestRunInsideOPATracesTheGate: OPA's own distributed_tracing section covers the gate of
// `authz run`: its decision spans reach OPA's collector in the caller's trace.
func TestRunInsideOPATracesTheGate(t *testing.T) {
	recv := testutil.StartOTLPReceiver(t)
	addr := recv.Addr
	dir := t.TempDir()
	factsPath := testutil.WriteFile(t, dir, "facts.json", specFacts)
	bundlePath := writePolicyBundle(t, dir, "rev-traced")
	cfgPath := testutil.WriteFile(t, dir, "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+factsPath+
		"\ndistributed_tracing:\n  type: http\n  address: "+addr+"\n  batch_span_processor_options:\n    batch_timeout_ms: 50\n")
	opaAddr := freeLoopbackAddr(t)
	ar := startRun(t, "--server", "--addr", opaAddr, "--config-file", cfgPath, "--bundle", bundlePath)
	gate := "http://" + waitListening(t, ar.Stderr)
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitOK(t, c, "http://"+opaAddr+"/health?plugins", 60*time.Second, ar.Stderr)

	const traceID, parentID = "3d2b8b3a1a0e4f5c9d8e7f6a5b4c3d2e", "1a2b3c4d5e6f7a8b"
	reqJSON, _ := specexamples.NewFixture().JSON()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, gate+"/v1/authorize", bytes.NewReader(reqJSON))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	names := map[string]bool{}
	require.Eventually(t, func() bool {
		spans, _, _ := recv.Received()
		for _, s := range spans {
			if hex.EncodeToString(s.GetTraceId()) != traceID {
				continue
			}
			names[s.GetName()] = true
			if s.GetName() == "authz.decision" {
				assert.Equal(t, parentID, hex.EncodeToString(s.GetParentSpanId()))
			}
		}
		return names["authz.decision"] && names["authz.evaluate"] && names["authz.input"]
	}, 30*time.Second, 50*time.Millisecond, "spans of the caller's trace: %v; stderr:\n%s", names, ar.Stderr)
	c.CloseIdleConnections()
	ar.Terminate(t)
}
