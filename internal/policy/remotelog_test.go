package policy

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
)

func opsCount(t *testing.T, src *Source, labels ...string) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, src.ops.WithLabelValues(labels...).Write(&m))
	return m.GetCounter().GetValue()
}

// closedURL is the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return "http://" + addr
}

// TestUnreachableBundleServerIsARateLimitedWarn: a bundle server nobody answers on is a WARN,
// once a minute per bundle, never an ERROR, however often OPA retries; each failure is counted.
func TestUnreachableBundleServerIsARateLimitedWarn(t *testing.T) {
	t.Parallel()
	cfg := Config{OPA: map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": closedURL(t)}},
		"bundles": map[string]any{"authz": map[string]any{"service": "bundles", "resource": "/b.tar.gz",
			"polling": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 1}}},
	}}
	_, src, out := startLogged(t, cfg, hclog.Debug)
	policytest.WaitFor(t, "three failed downloads", 20*time.Second, func() bool {
		return opsCount(t, src, "authz", opDownload, outcomeFailed, "unreachable") >= 3
	})
	log := out.String()
	assert.NotContains(t, log, "[ERROR]", "an unreachable bundle server is not an error of the service")
	assert.Equal(t, 1, strings.Count(log, "[WARN]  policy: bundle download failed"), "one WARN a minute:\n%s", log)
	assert.Contains(t, src.Status().Bundles["authz"].Message, "connection refused")
}

// TestGracefulStopLogsNoError: stopping the source while OPA long-polls the bundle server
// logs no ERROR (the cancelled download is not a refused bundle).
func TestGracefulStopLogsNoError(t *testing.T) {
	t.Parallel()
	srv := policytest.NewBundleServer(t)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "v1"}))
	eng, src, out := startLogged(t, remoteConfig(srv, "", true, ""), hclog.Info)
	policytest.WaitFor(t, "v1", 20*time.Second, func() bool { return eng.Revision() == "v1" })
	policytest.WaitFor(t, "a long poll held", 20*time.Second, func() bool { return srv.Waiting() > 0 })
	src.Close(t.Context())
	assert.NotContains(t, out.String(), "[ERROR]")
}

// TestNoETagServerLogsOnlyNewActivations: from a server without ETag every poll downloads and
// activates the same bundle in OPA's store; OPA's "Bundle loaded and activated successfully."
// is logged (INFO) only for the first, and last_successful_activation stays the time of that
// one, as activated_at does.
func TestNoETagServerLogsOnlyNewActivations(t *testing.T) {
	t.Parallel()
	body := policytest.MakeBundle(t, policytest.BundleSpec{Revision: "same"})
	var served atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	cfg := Config{OPA: map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": srv.URL}},
		"bundles": map[string]any{"authz": map[string]any{"service": "bundles", "resource": "b.tar.gz",
			"polling": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 1}}},
	}}
	eng, src, out := startLogged(t, cfg, hclog.Info)
	policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eng.Revision() == "same" })
	policytest.WaitFor(t, "the first status", 10*time.Second, func() bool { return src.Status().Bundles["authz"] != nil })
	first := src.Status()
	n := served.Load()
	policytest.WaitFor(t, "the status of two more downloads", 20*time.Second, func() bool {
		return served.Load() >= n+2 && opsCount(t, src, "authz", opDownload, outcomeOK, reasonNone) >= 3
	})
	assert.Equal(t, 1, strings.Count(out.String(), "Bundle loaded and activated successfully."), "%s", out.String())
	assert.InDelta(t, 1, opsCount(t, src, "authz", opActivate, outcomeOK, reasonNone), 0, "one activation brought something new")
	assert.GreaterOrEqual(t, opsCount(t, src, "authz", opActivate, outcomeUnchanged, reasonNone), 2.0)
	st := src.Status()
	assert.Equal(t, first.ActivatedAt, st.ActivatedAt)
	assert.Equal(t, first.Bundles["authz"].LastSuccessfulActivation, st.Bundles["authz"].LastSuccessfulActivation,
		"nothing new was activated since")
	assert.True(t, st.Bundles["authz"].LastSuccessfulDownload.After(first.Bundles["authz"].LastSuccessfulDownload))
}
