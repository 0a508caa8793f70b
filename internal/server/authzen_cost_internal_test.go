package server

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/snapshot"
)

// TestAuthZENDecodeCostWithinTheMemoryBudget: an AuthZEN evaluation of the costliest shape (an
// array of one-member objects in the subject's properties) is decoded and mapped onto the
// service's request allocating at most snapshot.DecodedBytesPerBodyByte bytes per byte of its
// body, what the memory bound counts for a body being decoded: the mapped request holds the
// decoded values rather than a second decoding of them.
func TestAuthZENDecodeCostWithinTheMemoryBudget(t *testing.T) {
	n := (1 << 20) / len(`{"":0},`)
	body := []byte(`{"subject": {"type": "lease", "id": "l", "properties": {"metadata": {"padding": [` +
		strings.TrimSuffix(strings.Repeat(`{"":0},`, n), ",") +
		`]}}}, "resource": {"type": "environment", "id": "e", "properties": {"driver": "sandbox"}}, "action": {"name": "openDuplexChannel"}}`)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var e authzenEvaluation
	require.NoError(t, decodeAuthZEN(body, authzenEvaluationShape, &e))
	req, err := e.request()
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	runtime.KeepAlive(req)
	perByte := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(body))
	t.Logf("%.1f bytes allocated per byte of a %d-byte AuthZEN evaluation", perByte, len(body))
	require.LessOrEqual(t, perByte, float64(snapshot.DecodedBytesPerBodyByte))
}
