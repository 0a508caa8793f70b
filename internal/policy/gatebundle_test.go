package policy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy/policytest"
)

// grantAll is a policy that grants everything: what a second bundle's key holder would serve.
func grantAll() map[string]string {
	caps := make([]string, len(api.CapabilityKeys))
	for i, k := range api.CapabilityKeys {
		caps[i] = `"` + k + `": true`
	}
	return map[string]string{"authz/decision.rego": `package authz

decision := {"allow": true, "code": "OK", "message": "granted", "reasons": ["granted"], "capabilities": {` + strings.Join(caps, ", ") + `}}
`}
}

// twoBundles is an opa section with keys release (a) and datateam (b), the gate's bundle
// "authz" from gateSrv bound to release and a second bundle "data" from dataSrv bound to
// datateam, persisted in persist when it is not "".
func twoBundles(tb testing.TB, gateSrv, dataSrv *policytest.BundleServer, persist string) Config {
	a, b := policytest.Keys(tb)
	polling := map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 2, "long_polling_timeout_seconds": 10}
	bundles := map[string]any{
		"authz": map[string]any{"service": "gate", "resource": "/bundles/authz.tar.gz", "signing": map[string]any{"keyid": "release"}, "polling": polling},
		"data":  map[string]any{"service": "data", "resource": "/bundles/data.tar.gz", "signing": map[string]any{"keyid": "datateam"}, "polling": polling},
	}
	opa := map[string]any{
		"services": map[string]any{"gate": map[string]any{"url": gateSrv.URL}, "data": map[string]any{"url": dataSrv.URL}},
		"keys": map[string]any{
			"release":  map[string]any{"key": a.Public, "algorithm": "RS256"},
			"datateam": map[string]any{"key": b.Public, "algorithm": "RS256"},
		},
		"bundles": bundles,
	}
	if persist != "" {
		opa["persistence_directory"] = persist
		for _, v := range bundles {
			v.(map[string]any)["persist"] = true
		}
	}
	return Config{OPA: opa, GateBundle: "authz"}
}

func dataSigned(tb testing.TB) policytest.Signing {
	_, b := policytest.Keys(tb)
	return policytest.Signing{Key: b.Private, KeyID: "datateam"}
}

// TestGateBundleMustBeNamed: with two bundles the configuration names the gate's bundle; the
// error gives the line to add.
func TestGateBundleMustBeNamed(t *testing.T) {
	srv := policytest.NewBundleServer(t)
	cfg := twoBundles(t, srv, srv, "")
	require.NoError(t, cfg.Validate())
	cfg.GateBundle = ""
	err := cfg.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "`gateBundle: authz` or `gateBundle: data`")
	cfg.GateBundle = "nobody"
	require.ErrorContains(t, cfg.Validate(), `gateBundle: "nobody" is not one of the configured bundles (authz, data)`)
	one := remoteConfig(srv, "", false, "")
	require.NoError(t, one.Validate(), "with one bundle it is the gate's")
	require.ErrorContains(t, Config{GateBundle: "authz"}.Validate(), "applies to the bundles of the opa section only")
}

// TestSecondBundleCannotBecomeTheGatesPolicy: a second bundle, validly signed by its own key,
// with roots ["authz"] (or no manifest roots) and a grant-all decision, is refused before it
// is activated (POLICY_BUNDLE_ROOTS) while the gate's bundle is not yet served, and the gate's
// bundle is then activated; a second bundle with roots of its own is activated in OPA but the
// gate decides only with its bundle.
func TestSecondBundleCannotBecomeTheGatesPolicy(t *testing.T) {
	t.Parallel()
	a, _ := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	eng, src := startSource(t, twoBundles(t, gateSrv, dataSrv, ""))
	refused := func(rev string) func() bool {
		return func() bool {
			st := src.Status().Bundles["data"]
			return eng.Revision() != "" || st != nil && st.Code == string(coded.PolicyBundleRoots) && strings.Contains(st.Message, rev)
		}
	}

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "grant-all", Roots: []string{"authz"}, Modules: grantAll(), Sign: dataSigned(t)}))
	policytest.WaitFor(t, "the second bundle to be refused", 20*time.Second, refused("roots [\"authz\"]"))
	assert.Empty(t, eng.Revision(), "a second bundle whose roots reach authz must not become the gate's policy")
	assert.False(t, src.Ready())
	st := src.Status()
	assert.Contains(t, st.Bundles["data"].Message, "give bundle data a .manifest whose roots leave them out")

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "no-manifest", Modules: grantAll(), Sign: dataSigned(t)}))
	policytest.WaitFor(t, "the second bundle without roots to be refused", 20*time.Second, refused(`the root "" is all of data`))
	assert.Empty(t, eng.Revision(), "a bundle without roots reaches authz")

	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"}, Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	policytest.WaitFor(t, "the gate's bundle", 20*time.Second, func() bool { return eng.Revision() == "release-1" })
	assert.Equal(t, "release-1", decideRevision(t, eng))
	assert.Empty(t, src.Status().Bundles["authz"].Code, "the gate's bundle is not refused for the refused bundle's overlap")

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "data-1", Roots: []string{"datateam"},
		Modules: map[string]string{"datateam/x.rego": "package datateam\n\nx := 1\n"}, Data: map[string]any{"datateam": map[string]any{"y": 2}}, Sign: dataSigned(t)}))
	policytest.WaitFor(t, "the second bundle with roots of its own to be activated in OPA", 20*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return st != nil && st.ActiveRevision == "data-1" && st.Code == ""
	})
	assert.Equal(t, "release-1", decideRevision(t, eng), "the gate decides with its bundle only")
	assert.Equal(t, OriginRemote+":authz", src.Status().Origin)
}

// TestPersistedSecondBundleNotActivatedAfterRestart: a second bundle on disk whose roots reach
// authz (as an earlier version persisted it) is not activated at start; the persisted gate's
// bundle is.
func TestPersistedSecondBundleNotActivatedAfterRestart(t *testing.T) {
	t.Parallel()
	a, _ := policytest.Keys(t)
	persist := t.TempDir()
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	cfg := twoBundles(t, gateSrv, dataSrv, persist)
	write := func(name string, spec policytest.BundleSpec) {
		p := filepath.Join(persist, "bundles", name, "bundle.tar.gz")
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, policytest.MakeBundle(t, spec), 0o600))
	}
	write("data", policytest.BundleSpec{Revision: "grant-all", Roots: []string{"authz"}, Modules: grantAll(), Sign: dataSigned(t)})

	eng, src := startSource(t, cfg)
	assert.Empty(t, eng.Revision(), "a persisted second bundle whose roots reach authz must not be activated")
	assert.False(t, src.Ready())
	assert.Equal(t, string(coded.PolicyBundleRoots), src.Status().Bundles["data"].Code)
	src.Close(t.Context())

	write("authz", policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"}, Sign: policytest.Signing{Key: a.Private, KeyID: "release", IssuedAt: 1000}})
	eng2, src2 := startSource(t, cfg)
	assert.Equal(t, "release-1", decideRevision(t, eng2), "the persisted gate's bundle is activated, the refused one is not")
	assert.Equal(t, string(coded.PolicyBundleRoots), src2.Status().Bundles["data"].Code)
}

// TestBundleRuleAdmit is the rule on its own.
func TestBundleRuleAdmit(t *testing.T) {
	roots := func(r ...string) *[]string { return &r }
	multi := BundleRule{Gate: "authz", Multi: true}
	for _, c := range []struct {
		name, bundle string
		roots        *[]string
		rule         BundleRule
		ok           bool
	}{
		{"gate alone, no roots", "authz", nil, BundleRule{Gate: "authz"}, true},
		{"gate with others, within authz", "authz", roots("authz", "system/log"), multi, true},
		{"gate with others, no roots", "authz", nil, multi, false},
		{"gate with others, a root outside", "authz", roots("authz", "data"), multi, false},
		{"other, own roots", "data", roots("datateam", "x/y"), multi, true},
		{"other, authz", "data", roots("authz"), multi, false},
		{"other, below authz", "data", roots("authz/extra"), multi, false},
		{"other, system log", "data", roots("system/log"), multi, false},
		{"other, no roots", "data", nil, multi, false},
		{"other, empty root", "data", roots(""), multi, false},
		{"other, a prefix of authz is not authz", "data", roots("authzdata"), multi, true},
	} {
		err := c.rule.Admit(c.bundle, c.roots)
		if c.ok {
			assert.NoError(t, err, c.name)
		} else {
			assert.Equal(t, coded.PolicyBundleRoots, coded.CodeOf(err), c.name)
		}
	}
}

// trickleServer answers every bundle request with its headers, then body one byte every
// 50 ms: a download of a valid bundle that takes minutes.
func trickleServer(tb testing.TB, body []byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/gzip")
		w.WriteHeader(http.StatusOK)
		for _, c := range body {
			if _, err := w.Write([]byte{c}); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}))
	tb.Cleanup(srv.Close)
	return srv
}

// TestTricklingDownloadIsCut: a bundle server that sends its headers, then one byte every
// 50 ms, is cut once the download averages under the minimum rate after the grace, and
// retried; /v1/status shows the stall and authz_bundle_operations_total counts it.
func TestTricklingDownloadIsCut(t *testing.T) {
	t.Parallel()
	srv := trickleServer(t, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "slow", Roots: []string{"authz"}}))
	cfg := Config{OPA: map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": srv.URL}},
		"bundles": map[string]any{"authz": map[string]any{"service": "bundles", "resource": "/bundles/authz.tar.gz",
			"polling": map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 1}}},
	}}
	eng := decision.New(decision.Options{})
	src, err := New(cfg, eng, Options{downloadTimes: downloadTimes{stall: 5 * time.Second, grace: 300 * time.Millisecond, minRate: 1024}})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	t.Cleanup(func() { src.Close(t.Context()) })

	failed := func() float64 {
		var m dto.Metric
		require.NoError(t, src.ops.WithLabelValues("authz", opDownload, outcomeFailed, "stalled").Write(&m))
		return m.GetCounter().GetValue()
	}
	policytest.WaitFor(t, "the trickling download to be cut twice", 20*time.Second, func() bool { return failed() >= 2 })
	st := src.Status().Bundles["authz"]
	require.NotNil(t, st)
	assert.Contains(t, st.Message, "under the minimum of 1024 bytes a second")
	assert.Contains(t, st.Message, "bundle download too slow, cut")
	assert.Empty(t, eng.Revision())
}

// TestStalledBodyIsCut: a body that sends nothing after its headers is cut after the stall
// bound, even inside the grace; a Read blocked in it returns.
func TestStalledBodyIsCut(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	b := newTimedBody(pr, downloadTimes{stall: 100 * time.Millisecond, grace: time.Hour, minRate: 1})
	defer b.Close()
	_, err := b.Read(make([]byte, 10))
	require.ErrorIs(t, err, errDownloadStalled)
	assert.Contains(t, err.Error(), "no byte for 100ms (0 bytes in")
}

// TestAdmittingLeavesRegoWorking: once the remote source's activator is registered, a query
// that names no store still runs (OPA's rego takes the registered store function).
func TestAdmittingLeavesRegoWorking(t *testing.T) {
	ensureAdmitting()
	rs, err := rego.New(rego.Query("x := 1")).Eval(t.Context())
	require.NoError(t, err)
	require.Len(t, rs, 1)
}
