package server_test

import (
	"net/http"
	"runtime"
	"testing"
	"time"

	opaversion "github.com/open-policy-agent/opa/v1/version"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
)

// fixedStatus is a policy source whose status is given.
type fixedStatus struct{ st api.Status }

func (f fixedStatus) Status() api.Status { return f.st }

func TestStatusShowsRevisionOriginAndBundleErrors(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := api.Status{Revision: "rev-7", Origin: "remote:authz", ActivatedAt: at, LastError: "POLICY_BUNDLE_CHECK: no entrypoint",
		Bundles: map[string]*api.BundleStatus{"authz": {Name: "authz", ActiveRevision: "rev-7", Code: "bundle_error", Message: "signature verification failed"}}}
	s, err := server.New(testConfig(), testEngine(t), staticFacts(t, "facts.json"), server.Options{Policy: fixedStatus{st}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	url := startHTTP(t, s)

	a := get(t, url+"/v1/status")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	m := a.json(t)
	assert.Equal(t, "rev-7", m["revision"])
	assert.Equal(t, "remote:authz", m["origin"])
	assert.Equal(t, "2026-01-02T03:04:05Z", m["activated_at"])
	assert.Equal(t, "POLICY_BUNDLE_CHECK: no entrypoint", m["last_error"])
	b := m["bundles"].(map[string]any)["authz"].(map[string]any)
	assert.Equal(t, "rev-7", b["active_revision"])
	assert.Equal(t, "bundle_error", b["code"])
	assert.Equal(t, "signature verification failed", b["message"])

	metrics := get(t, url+"/metrics")
	assert.Contains(t, string(metrics.body), `authz_policy_revision_info{origin="remote:authz",revision="`+testEngine(t).Revision()+`"} 1`)

	assert.Equal(t, http.StatusMethodNotAllowed, post(t, url+"/v1/status", "{}").status)
}

func TestReadyOnlyOncePolicyIsActive(t *testing.T) {
	eng := decision.New(decision.Options{})
	src, err := policy.New(policy.Config{}, eng, policy.Options{})
	require.NoError(t, err)
	s, err := server.New(testConfig(), eng, staticFacts(t, "facts.json"), server.Options{Policy: src})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	url := startHTTP(t, s)

	assert.Equal(t, http.StatusServiceUnavailable, get(t, url+"/health/ready").status, "no policy is active yet")
	assert.Empty(t, get(t, url+"/v1/status").json(t)["revision"])

	require.NoError(t, src.Start(t.Context()))
	defer src.Close(t.Context())
	assert.Equal(t, http.StatusOK, get(t, url+"/health/ready").status)
	m := get(t, url+"/v1/status").json(t)
	assert.Equal(t, eng.Revision(), m["revision"])
	assert.Equal(t, policy.OriginEmbedded, m["origin"])
}

// The build the binary came from is in GET /v1/status ("build") and in authz_build_info, so an
// operator can tell which version every replica runs.
func TestStatusAndMetricsShowTheBuild(t *testing.T) {
	t.Parallel()
	url := startHTTP(t, newServer(t))
	b := server.Build()
	assert.NotEmpty(t, b.Version)
	assert.Equal(t, runtime.Version(), b.GoVersion)
	assert.Equal(t, opaversion.Version, b.OPAVersion)

	a := get(t, url+"/v1/status")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	build, ok := a.json(t)["build"].(map[string]any)
	require.True(t, ok, "no build object in %s", a.body)
	assert.Equal(t, map[string]any{"version": b.Version, "revision": b.Revision, "go_version": b.GoVersion, "opa_version": b.OPAVersion}, build)

	metrics := string(get(t, url+"/metrics").body)
	assert.Contains(t, metrics, `authz_build_info{go_version="`+b.GoVersion+`",opa_version="`+b.OPAVersion+`",revision="`+b.Revision+`",version="`+b.Version+`"} 1`)
}
