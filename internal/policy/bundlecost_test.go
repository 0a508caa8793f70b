package policy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/storage"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/policy/policytest"
)

// noETagServer serves the bundle last published at any path, with no ETag (so OPA downloads it
// again at every poll), and counts the requests.
type noETagServer struct {
	*httptest.Server
	mu       sync.Mutex
	body     []byte
	requests atomic.Int64
}

func newNoETagServer(tb testing.TB) *noETagServer {
	s := &noETagServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		body := s.body
		s.mu.Unlock()
		if body == nil {
			http.NotFound(w, r)
			return
		}
		s.requests.Add(1)
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write(body)
	}))
	tb.Cleanup(s.Close)
	return s
}

func (s *noETagServer) Publish(body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body = body
}

// withDataURL is cfg with the data bundle's service at url.
func withDataURL(cfg Config, url string) Config {
	cfg.OPA["services"].(map[string]any)["data"] = map[string]any{"url": url}
	return cfg
}

// regoOf is a module of package other with rules rules of the tester's shape.
func regoOf(rules int) map[string]string {
	var b strings.Builder
	b.WriteString("package other\n\n")
	for i := range rules {
		fmt.Fprintf(&b, "r%d := {\"a\": [input.x, %d]} if input.z == %d\n", i, i, i)
	}
	return map[string]string{"other/p.rego": b.String()}
}

// countCommits counts the write transactions committed into store from now on: one per
// activation OPA's bundle plugin completes.
func countCommits(t *testing.T, store storage.Store) *atomic.Int64 {
	var n atomic.Int64
	require.NoError(t, storage.Txn(t.Context(), store, storage.WriteParams, func(txn storage.Transaction) error {
		_, err := store.Register(t.Context(), txn, storage.TriggerConfig{OnCommit: func(context.Context, storage.Transaction, storage.TriggerEvent) {
			n.Add(1)
		}})
		return err
	}))
	n.Store(0) // the trigger hears the commit that registered it
	return &n
}

// TestSecondBundleTooMuchRegoRefused: a second bundle, validly signed by its own key with
// roots of its own, carrying more Rego than otherBundleRegoBytes, is refused before
// activation (POLICY_BUNDLE_TOO_LARGE, naming the key to raise), never compiled, and the gate's
// bundle is activated as it is published; under the bound, the second bundle is activated.
func TestSecondBundleTooMuchRegoRefused(t *testing.T) {
	t.Parallel()
	a, _ := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	cfg := twoBundles(t, gateSrv, dataSrv, "")
	cfg.OtherBundleRegoBytes = 4096
	require.NoError(t, cfg.Validate())
	eng, src := startSource(t, cfg)

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "big", Roots: []string{"other"}, Modules: regoOf(200), Sign: dataSigned(t)}))
	policytest.WaitFor(t, "the second bundle to be refused as too large", 20*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return st != nil && st.Code == string(coded.PolicyBundleTooLarge)
	})
	st := src.Status()
	assert.Contains(t, st.Bundles["data"].Message, "raise otherBundleRegoBytes")
	assert.Contains(t, st.Bundles["data"].Message, "more than 4096 bytes", "cut as it is downloaded, before OPA parses it")
	assert.Empty(t, st.Bundles["data"].ActiveRevision, "a refused bundle is not activated")

	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"}, Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	policytest.WaitFor(t, "the gate's bundle", 20*time.Second, func() bool { return eng.Revision() == "release-1" })
	assert.Equal(t, "release-1", decideRevision(t, eng))

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "small", Roots: []string{"other"}, Modules: regoOf(3), Sign: dataSigned(t)}))
	policytest.WaitFor(t, "the second bundle under the bound to be activated", 20*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return st != nil && st.ActiveRevision == "small" && st.Code == ""
	})
	var m dto.Metric
	require.NoError(t, src.ops.WithLabelValues("data", opDownload, outcomeFailed, "too_large").Write(&m))
	assert.GreaterOrEqual(t, m.GetCounter().GetValue(), 1.0, "the cut download is counted under reason too_large")
}

// TestSecondBundleUnchangedNotActivatedAgain: a second bundle served again unchanged by a
// server without ETag is downloaded at every poll but not activated (nor compiled) again: no
// commit into OPA's store, no error shown, counted as unchanged; a changed one is activated.
func TestSecondBundleUnchangedNotActivatedAgain(t *testing.T) {
	t.Parallel()
	a, _ := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), newNoETagServer(t)
	cfg := withDataURL(twoBundles(t, gateSrv, policytest.NewBundleServer(t), ""), dataSrv.URL)
	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"}, Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "data-1", Roots: []string{"other"}, Modules: regoOf(3), Sign: dataSigned(t)}))
	eng, src := startSource(t, cfg)
	policytest.WaitFor(t, "both bundles", 20*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return eng.Revision() == "release-1" && st != nil && st.ActiveRevision == "data-1"
	})
	src.mu.Lock()
	store := src.remote.store
	src.mu.Unlock()
	commits := countCommits(t, store)
	from := dataSrv.requests.Load()
	policytest.WaitFor(t, "three more downloads of the unchanged bundle", 30*time.Second, func() bool { return dataSrv.requests.Load() >= from+3 })
	assert.Zero(t, commits.Load(), "the unchanged second bundle must not be activated again")
	st := src.Status().Bundles["data"]
	assert.Empty(t, st.Code, "an unchanged bundle is no failure")
	assert.Empty(t, st.Message)
	assert.Empty(t, src.Status().LastError)
	var m dto.Metric
	require.NoError(t, src.ops.WithLabelValues("data", opActivate, outcomeUnchanged, reasonNone).Write(&m))
	assert.GreaterOrEqual(t, m.GetCounter().GetValue(), 2.0)

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "data-2", Roots: []string{"other"}, Modules: regoOf(4), Sign: dataSigned(t)}))
	policytest.WaitFor(t, "the changed second bundle", 30*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return st != nil && st.ActiveRevision == "data-2" && st.Code == ""
	})
	assert.Positive(t, commits.Load())
	assert.Equal(t, "release-1", decideRevision(t, eng))
}

// TestBundleRuleAdmitCost is the cost bound on its own: the gate's bundle is not bounded.
func TestBundleRuleAdmitCost(t *testing.T) {
	mod := func(n int) *bundle.Bundle {
		return &bundle.Bundle{Modules: []bundle.ModuleFile{{Path: "/other/p.rego", Raw: []byte(strings.Repeat("x", n))}}}
	}
	r := BundleRule{Gate: "authz", Multi: true}
	require.NoError(t, r.AdmitCost("data", mod(DefaultOtherBundleRegoBytes)))
	err := r.AdmitCost("data", mod(DefaultOtherBundleRegoBytes+1))
	assert.Equal(t, coded.PolicyBundleTooLarge, coded.CodeOf(err))
	assert.ErrorContains(t, err, "raise otherBundleRegoBytes")
	require.NoError(t, r.AdmitCost("authz", mod(8*DefaultOtherBundleRegoBytes)), "the gate's bundle is not bounded")
	r.OtherRegoBytes, r.RegoBytesKey = 10, "plugins.authz.otherBundleRegoBytes"
	assert.ErrorContains(t, r.AdmitCost("data", mod(11)), "raise plugins.authz.otherBundleRegoBytes")
	require.Error(t, Config{OtherBundleRegoBytes: -1}.Validate())
}

// TestSecondBundleTooMuchRegoRefusedAtActivation: a second bundle whose download the Rego
// bound does not recognise (its server redirects it elsewhere) is refused at its activation,
// before OPA compiles it (POLICY_BUNDLE_TOO_LARGE).
func TestSecondBundleTooMuchRegoRefusedAtActivation(t *testing.T) {
	t.Parallel()
	gateSrv, dataSrv := policytest.NewBundleServer(t), newNoETagServer(t)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, dataSrv.URL+r.URL.Path, http.StatusFound)
	}))
	t.Cleanup(redirect.Close)
	cfg := withDataURL(twoBundles(t, gateSrv, policytest.NewBundleServer(t), ""), redirect.URL)
	cfg.OtherBundleRegoBytes = 4096
	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "big", Roots: []string{"other"}, Modules: regoOf(200), Sign: dataSigned(t)}))
	_, src := startSource(t, cfg)
	policytest.WaitFor(t, "the second bundle to be refused at its activation", 20*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return st != nil && st.Code == string(coded.PolicyBundleTooLarge) && strings.Contains(st.Message, "over the 4096 bytes")
	})
	assert.Contains(t, src.Status().Bundles["data"].Message, "raise otherBundleRegoBytes")
	assert.Empty(t, src.Status().Bundles["data"].ActiveRevision)
}

// TestOtherBundleURLs: the Rego bound applies to the downloads of the bundles other than the
// gate's, found by the URL OPA's client makes, and never to a URL the gate's bundle has.
func TestOtherBundleURLs(t *testing.T) {
	raw := []byte(`{"services": {"s1": {"url": "http://127.0.0.1:1/base/"}, "s2": {"url": "http://127.0.0.1:2"}},
		"bundles": {"authz": {"service": "s1", "resource": "/authz.tar.gz"}, "data": {"service": "s2", "resource": "data.tar.gz"},
		"dflt": {"service": "s2"}, "same": {"service": "s1", "resource": "authz.tar.gz"}}}`)
	b := otherBundleURLs(raw, BundleRule{Gate: "authz", Multi: true})
	assert.Equal(t, map[string]bool{"http://127.0.0.1:2/data.tar.gz": true, "http://127.0.0.1:2/bundles/dflt": true}, b.urls)
	lim := defaultBundleLimits()
	u, _ := url.Parse("http://127.0.0.1:2/data.tar.gz?x=1")
	assert.Equal(t, int64(DefaultOtherBundleRegoBytes), b.limitsFor(u, lim).regoBytes)
	u, _ = url.Parse("http://127.0.0.1:1/base/authz.tar.gz")
	assert.Zero(t, b.limitsFor(u, lim).regoBytes, "the gate's bundle is not bounded")
	assert.Empty(t, otherBundleURLs(raw, BundleRule{Gate: "authz"}).urls, "one bundle: it is the gate's")
}

// TestLastErrorClearedOnceTheBundleIsWell: GET /v1/status's last_error about a bundle that
// failed once (its server answered 404) is cleared when that bundle is served and activated
// again cleanly, though the gate's policy did not change.
func TestLastErrorClearedOnceTheBundleIsWell(t *testing.T) {
	t.Parallel()
	a, _ := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), newNoETagServer(t)
	cfg := withDataURL(twoBundles(t, gateSrv, policytest.NewBundleServer(t), ""), dataSrv.URL)
	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"}, Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	data := policytest.MakeBundle(t, policytest.BundleSpec{Revision: "data-1", Roots: []string{"other"}, Modules: regoOf(2), Sign: dataSigned(t)})
	dataSrv.Publish(data)
	eng, src := startSource(t, cfg)
	policytest.WaitFor(t, "both bundles", 20*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return eng.Revision() == "release-1" && st != nil && st.ActiveRevision == "data-1"
	})
	dataSrv.Publish(nil)
	policytest.WaitFor(t, "the second bundle's download to fail", 20*time.Second, func() bool {
		return strings.Contains(src.Status().LastError, "Not Found")
	})
	dataSrv.Publish(data)
	policytest.WaitFor(t, "the second bundle well again", 20*time.Second, func() bool {
		st := src.Status().Bundles["data"]
		return st != nil && st.Code == "" && st.LastSuccessfulDownload.After(st.LastRequest.Add(-time.Millisecond))
	})
	policytest.WaitFor(t, "last_error cleared", 10*time.Second, func() bool { return src.Status().LastError == "" })
}
