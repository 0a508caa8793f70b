package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
)

// TestDecisionCacheMetricsAndLog: a repeated decision is a cache hit, and still gets its own
// decision id and decision-log line.
func TestDecisionCacheMetricsAndLog(t *testing.T) {
	var logBuf lockedBuffer
	// an engine of its own: the shared test engine's cache counts every other test's decisions
	eng := decisiontest.EmbeddedEngine(t, decision.Options{})
	url := startHTTP(t, newServer(t, withDecider(eng), withDecisionLog(&logBuf)))
	ids := map[string]bool{}
	for range 3 {
		a := post(t, url+"/v1/authorize", fixture(t, nil))
		require.Equal(t, http.StatusOK, a.status)
		ids[a.json(t)["decision_id"].(string)] = true
	}
	assert.Len(t, ids, 3, "every decision, a hit included, gets a fresh decision id")
	text := string(get(t, url+"/metrics").body)
	assert.Contains(t, text, "authz_decision_cache_hits_total 2")
	assert.Contains(t, text, "authz_decision_cache_misses_total 1")
	assert.Contains(t, text, "authz_decision_cache_evictions_total 0")
	lines := logBuf.lines(t)
	require.Len(t, lines, 3, "one decision-log line per decision")
	for _, l := range lines {
		assert.True(t, ids[l["decision_id"].(string)])
	}
}
