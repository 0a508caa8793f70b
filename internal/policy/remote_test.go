package policy

import (
	"bytes"
	"fmt"
	"maps"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// remoteConfig is an OPA configuration for one bundle "authz" from srv, verified with pub when
// pub is not empty; longPoll selects long polling, else polling every 1-2 s.
func remoteConfig(srv *policytest.BundleServer, pub string, longPoll bool, persistDir string) Config {
	polling := map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 2}
	if longPoll {
		polling["long_polling_timeout_seconds"] = 10
	}
	b := map[string]any{"service": "bundles", "resource": "/bundles/authz.tar.gz", "polling": polling}
	opa := map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": srv.URL}},
		"bundles":  map[string]any{"authz": b},
	}
	if pub != "" {
		opa["keys"] = map[string]any{DefaultVerificationKeyID: map[string]any{"key": pub, "algorithm": "RS256"}}
		b["signing"] = map[string]any{}
	}
	if persistDir != "" {
		opa["persistence_directory"] = persistDir
		b["persist"] = true
	}
	return Config{OPA: opa}
}

func startSource(tb testing.TB, cfg Config) (*decision.Engine, *Source) {
	tb.Helper()
	return startSourceWith(tb, cfg, decision.Options{})
}

func startSourceWith(tb testing.TB, cfg Config, opts decision.Options) (*decision.Engine, *Source) {
	tb.Helper()
	eng := decision.New(opts)
	src, err := New(cfg, eng, Options{})
	require.NoError(tb, err)
	require.NoError(tb, src.Start(tb.Context()))
	tb.Cleanup(func() { src.Close(tb.Context()) })
	return eng, src
}

func TestRemoteSignedBundleActivatedAndShapesRefused(t *testing.T) {
	a, _ := policytest.Keys(t)
	srv := policytest.NewBundleServer(t)
	eng, src := startSource(t, remoteConfig(srv, a.Public, true, ""))
	assert.False(t, src.Ready(), "not ready before a bundle is activated")
	assert.Empty(t, eng.Revision())

	good, shapes := signatureShapes(t)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "good-0", Sign: good}))
	policytest.WaitFor(t, "the signed bundle to be activated", 20*time.Second, src.Ready)
	assert.Equal(t, "good-0", decideRevision(t, eng))
	st := src.Status()
	assert.Equal(t, OriginRemote+":authz", st.Origin)
	assert.Equal(t, "good-0", st.Bundles["authz"].ActiveRevision)

	for i, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			// Each shape follows a good bundle, so its error is its own.
			rev := "good-" + string(rune('1'+i))
			srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev, Sign: good}))
			policytest.WaitFor(t, "the good bundle to be activated", 20*time.Second, func() bool { return eng.Revision() == rev })
			sh.spec.Revision = "bad"
			srv.Publish(policytest.MakeBundle(t, sh.spec))
			policytest.WaitFor(t, "the bundle to be refused", 20*time.Second, func() bool {
				b := src.Status().Bundles["authz"]
				return b != nil && b.Code != "" && strings.Contains(b.Message, sh.want)
			})
			assert.Equal(t, rev, decideRevision(t, eng), "the refused bundle must not replace the active one")
			assert.Equal(t, rev, src.Status().Revision)
		})
	}
}

func TestRemoteCompileFailureAndMissingEntrypointRefused(t *testing.T) {
	srv := policytest.NewBundleServer(t)
	eng, src := startSource(t, remoteConfig(srv, "", true, ""))
	for i, tc := range []struct {
		name    string
		modules map[string]string
		code    string
		want    string
	}{
		{"compile failure", map[string]string{"authz/decision.rego": "package authz\n\ndecision if { undefined_var }\n"}, "bundle_error", "compiling"},
		{"missing entrypoint", map[string]string{"authz/decision.rego": "package authz\n\nsomething := true\n"}, string(coded.PolicyBundleCheck), "does not define data.authz.decision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rev := "good-" + string(rune('0'+i))
			srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev}))
			policytest.WaitFor(t, "the good bundle to be activated", 20*time.Second, func() bool { return eng.Revision() == rev })
			srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "bad", Modules: tc.modules}))
			policytest.WaitFor(t, "the bundle to be refused", 20*time.Second, func() bool {
				b := src.Status().Bundles["authz"]
				return b != nil && b.Code == tc.code && strings.Contains(b.Message, tc.want)
			})
			assert.Equal(t, rev, decideRevision(t, eng))
			assert.Equal(t, rev, src.Status().Bundles["authz"].ActiveRevision, "the status shows the revision served, not the refused one")
		})
	}
	// A good bundle after a refused one clears the error.
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "good-last"}))
	policytest.WaitFor(t, "the good bundle to be activated", 20*time.Second, func() bool { return eng.Revision() == "good-last" })
	policytest.WaitFor(t, "the error to clear", 5*time.Second, func() bool { return src.Status().Bundles["authz"].Code == "" })
}

func TestRemotePersistedBundleServedAfterRestartWithoutServer(t *testing.T) {
	a, _ := policytest.Keys(t)
	persist := t.TempDir()
	srv := policytest.NewBundleServer(t)
	good, _ := signatureShapes(t)
	cfg := remoteConfig(srv, a.Public, false, persist)
	eng, src := startSource(t, cfg)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "persisted", Sign: good}))
	policytest.WaitFor(t, "the bundle to be activated", 20*time.Second, func() bool { return eng.Revision() == "persisted" })
	src.Close(t.Context())
	srv.Close() // the bundle server is gone

	eng2 := decision.New(decision.Options{})
	src2, err := New(cfg, eng2, Options{})
	require.NoError(t, err)
	require.NoError(t, src2.Start(t.Context()))
	defer src2.Close(t.Context())
	assert.True(t, src2.Ready(), "the persisted bundle is active as soon as Start returns")
	assert.Equal(t, "persisted", decideRevision(t, eng2))
}

func TestRemoteBundleKeepsTheDecisionCacheOn(t *testing.T) {
	srv := policytest.NewBundleServer(t)
	eng, _ := startSource(t, remoteConfig(srv, "", true, ""))
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "r1", Modules: policytest.MarkerModules("M1")}))
	policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eng.Revision() == "r1" })
	assert.Empty(t, eng.CacheStatus(), "a bundle from the plugin manager keeps the decision cache on")
	doc, err := eng.Evaluate(t.Context(), snapshot.Input{})
	require.NoError(t, err)
	assert.Equal(t, "M1", doc.Code)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "r2", Modules: policytest.MarkerModules("M2")}))
	policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eng.Revision() == "r2" })
	doc, err = eng.Evaluate(t.Context(), snapshot.Input{})
	require.NoError(t, err)
	assert.Equal(t, "M2", doc.Code, "a cached decision of r1 must not answer for r2")
}

// TestMeasurePublishToDecision measures the time from publishing a bundle to the first decision
// on it, with long polling and with polling (1-2 s), and the decision latency while bundles are
// swapped under load. The figures are logged (go test -v); the bounds only catch a stall.
func TestMeasurePublishToDecision(t *testing.T) {
	for _, mode := range []struct {
		name     string
		longPoll bool
	}{{"long polling", true}, {"polling 1-2s", false}} {
		t.Run(mode.name, func(t *testing.T) {
			srv := policytest.NewBundleServer(t)
			eng, _ := startSource(t, remoteConfig(srv, "", mode.longPoll, ""))
			srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "m-0"}))
			policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eng.Revision() == "m-0" })
			var lat []time.Duration
			for i := 1; i <= 5; i++ {
				rev := "m-" + string(rune('0'+i))
				body := policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev})
				if mode.longPoll { // the downloader is back in its long poll: publishing answers it
					policytest.WaitFor(t, "a long poll", 20*time.Second, func() bool { return srv.Waiting() > 0 })
				}
				start := time.Now()
				srv.Publish(body)
				for decideRevision(t, eng) != rev {
					require.Less(t, time.Since(start), 20*time.Second, "stalled")
					time.Sleep(time.Millisecond)
				}
				lat = append(lat, time.Since(start))
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			t.Logf("publish → first decision (%s): median %v, max %v over %d bundles", mode.name, lat[len(lat)/2], lat[len(lat)-1], len(lat))
		})
	}
	t.Run("latency during swaps", func(t *testing.T) {
		srv := policytest.NewBundleServer(t)
		// The cache is off: every decision is an evaluation of the shipped policy.
		eng, _ := startSourceWith(t, remoteConfig(srv, "", true, ""), decision.Options{Cache: decision.CacheOptions{Disabled: true}})
		srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "s-0"}))
		policytest.WaitFor(t, "activation", 20*time.Second, func() bool { return eng.Revision() == "s-0" })
		// The contract's grant example: the whole grant path of the policy is evaluated.
		reqJSON, factsJSON := specexamples.NewFixture().JSON()
		facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
		require.NoError(t, err)
		req, err := snapshot.ParseRequest(bytes.NewReader(reqJSON))
		require.NoError(t, err)
		grant := snapshot.Build(t.Context(), req, facts, snapshot.Options{})
		bodies := make([][]byte, 5)
		for i := range bodies {
			bodies[i] = policytest.MakeBundle(t, policytest.BundleSpec{Revision: fmt.Sprintf("s-%d", i+1)})
		}
		measure := func(swaps bool) (p50, p99 time.Duration, revs, failed int) {
			var mu sync.Mutex
			var all []time.Duration
			seen := map[string]bool{}
			var stop atomic.Bool
			var wg sync.WaitGroup
			for w := range runtime.GOMAXPROCS(0) {
				wg.Go(func() {
					in := maps.Clone(grant)
					in["worker"] = w // the workers' inputs differ, as the requests of many callers do
					var local []time.Duration
					for !stop.Load() {
						s := time.Now()
						doc, err := eng.Evaluate(t.Context(), in)
						local = append(local, time.Since(s))
						mu.Lock()
						if err == nil && doc.Allow {
							seen[doc.Revision] = true
						} else {
							failed++ // every revision grants this input: a deny is a decision lost in a swap
						}
						mu.Unlock()
					}
					mu.Lock()
					all = append(all, local...)
					mu.Unlock()
				})
			}
			if swaps {
				// Five swaps, each published once the previous one is active.
				for i := range 5 {
					rev := fmt.Sprintf("s-%d", i+1)
					srv.Publish(bodies[i])
					policytest.WaitFor(t, "swap "+rev, 30*time.Second, func() bool { return eng.Revision() == rev })
					time.Sleep(100 * time.Millisecond) // the window measured on each revision, not a synchronisation
				}
			} else {
				time.Sleep(time.Second) // the window measured without swaps, not a synchronisation
			}
			stop.Store(true)
			wg.Wait()
			sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
			return all[len(all)/2], all[len(all)*99/100], len(seen), failed
		}
		b50, b99, _, bFailed := measure(false)
		s50, s99, revs, sFailed := measure(true)
		t.Logf("decision latency (evaluation of the grant example, cache off), %d workers: without swaps p50 %v p99 %v; with 5 swaps p50 %v p99 %v (%d revisions decided)", runtime.GOMAXPROCS(0), b50, b99, s50, s99, revs)
		assert.Greater(t, revs, 2, "decisions were made on several revisions during the swaps")
		assert.Zero(t, bFailed+sFailed, "no decision failed or denied while the policy was swapped")
	})
}

// TestDecisionLogsBesideEmbeddedPolicy runs OPA's decision-log plugin (console) for the
// embedded policy: the opa section then has no bundles, and the policy stays the embedded one.
func TestDecisionLogsBesideEmbeddedPolicy(t *testing.T) {
	out := &testutil.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Output: out, Level: hclog.Info})
	eng := decision.New(decision.Options{})
	src, err := New(Config{OPA: map[string]any{"decision_logs": map[string]any{"console": true}}}, eng, Options{Logger: logger})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	defer src.Close(t.Context())
	assert.Equal(t, OriginEmbedded, src.Status().Origin)
	require.True(t, src.DecisionLogs())
	require.NoError(t, src.LogDecision(t.Context(), api.Decision{ID: "decision-123", Path: "authz/decision", Timestamp: time.Now(),
		Input: map[string]any{"operation": "openDuplexChannel"}, Result: map[string]any{"allow": false}, Revision: eng.Revision()}))
	policytest.WaitFor(t, "the console decision log", 10*time.Second, func() bool { return strings.Contains(out.String(), "decision-123") })
	assert.Contains(t, out.String(), eng.Revision())

	// Without decision_logs, nothing is handed over.
	plain, err := New(Config{}, decision.New(decision.Options{}), Options{})
	require.NoError(t, err)
	require.NoError(t, plain.Start(t.Context()))
	assert.False(t, plain.DecisionLogs())
	assert.NoError(t, plain.LogDecision(t.Context(), api.Decision{ID: "x"}))
}
