package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

// An endpoint is reached only by its path as written: a percent-encoded separator or letter
// names no endpoint, whatever it decodes to.
func TestEncodedPathsAreNotRouted(t *testing.T) {
	url := startHTTP(t, newServer(t))
	for _, path := range []string{
		"/v1%2Fplugins", "/v1%2ffacts", "/%6detrics", "/health%2Fready", "/v1/%66acts",
		"/%2Fv1/plugins", "/v1/plugins%2F", "/v1/authorize%00",
	} {
		t.Run(path, func(t *testing.T) {
			a := get(t, url+path)
			requireAPIError(t, a, http.StatusNotFound, server.CodeNotFound)
			assert.NotContains(t, string(a.body), "plugins\":[")
		})
	}
	// The plain paths still answer.
	for _, path := range []string{"/v1/plugins", "/v1/facts", "/metrics", "/health/ready"} {
		assert.Equal(t, http.StatusOK, get(t, url+path).status, path)
	}
	assert.Contains(t, string(get(t, url+"/metrics").body), `authz_http_requests_total{route="other",status="404"} 8`)
}

// A decision answered 503 because its log line could not be written is counted as the deny the
// client got, never as the grant it replaced.
func TestDecisionsTotalCountsWhatWasAnswered(t *testing.T) {
	s := newServer(t, withDecisionLog(brokenWriter{}), withConfig(func(c *server.Config) {
		c.DecisionLog.Path = "-"
		c.DecisionLog.Required = true
	}))
	url := startHTTP(t, s)
	require.Equal(t, http.StatusServiceUnavailable, post(t, url+"/v1/authorize", fixture(t, nil)).status)
	text := string(get(t, url+"/metrics").body)
	assert.NotContains(t, text, `authz_decisions_total{allow="true"`)
	assert.Contains(t, text, `authz_decisions_total{allow="false",code="DECISION_LOG_UNAVAILABLE",operation="openDuplexChannel"} 1`)
	assert.Contains(t, text, `authz_http_requests_total{route="/v1/authorize",status="503"} 1`)
}
