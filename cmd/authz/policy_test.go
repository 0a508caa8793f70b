package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// remoteServeConfig is a configuration file whose opa section downloads bundle "authz" from
// url with long polling, verified with the public key pub.
func remoteServeConfig(t *testing.T, dir, url, pub string) string {
	t.Helper()
	cfg := map[string]any{
		"opa": map[string]any{
			"services": map[string]any{"bundles": map[string]any{"url": url}},
			"keys":     map[string]any{"default": map[string]any{"key": pub, "algorithm": "RS256"}},
			"bundles": map[string]any{"authz": map[string]any{
				"service": "bundles", "resource": "/bundles/authz.tar.gz", "signing": map[string]any{},
				"polling": map[string]any{"long_polling_timeout_seconds": 10, "min_delay_seconds": 1, "max_delay_seconds": 2},
			}},
		},
	}
	b, err := json.Marshal(cfg) // JSON is YAML
	require.NoError(t, err)
	return testutil.WriteFile(t, dir, "config.yaml", string(b))
}

// TestReplicasFollowOneBundleServer runs two `authz serve` processes against one loopback
// bundle server: neither is ready before a bundle is active; both move to each new signed
// revision; both refuse a tampered bundle and keep deciding on the revision they had.
func TestReplicasFollowOneBundleServer(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	a, _ := policytest.Keys(t)
	good := policytest.Signing{Key: a.Private, KeyID: "default"}
	srv := policytest.NewBundleServer(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	cfg := remoteServeConfig(t, dir, srv.URL, a.Public)
	c := &http.Client{Timeout: 15 * time.Second}
	defer c.CloseIdleConnections()

	replicas := []*serveProcess{
		startServeProcess(t, "", "--config", cfg, "--facts", facts, "--addr", "127.0.0.1:0"),
		startServeProcess(t, "", "--config", cfg, "--facts", facts, "--addr", "127.0.0.1:0"),
	}
	for _, p := range replicas {
		status, ready := testutil.GetJSON(t, c, "http://"+p.addr+"/health/ready")
		assert.Equal(t, http.StatusServiceUnavailable, status, "ready before any bundle: %v", ready)
	}
	revisionOf := func(p *serveProcess) string {
		status, doc := testutil.PostJSON(t, c, "http://"+p.addr+"/v1/authorize", specRequest)
		if status != http.StatusOK {
			return ""
		}
		return doc["revision"].(string)
	}
	for _, rev := range []string{"v1", "v2"} {
		srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev, Sign: good}))
		for i, p := range replicas {
			require.Eventually(t, func() bool { return revisionOf(p) == rev }, 30*time.Second, 20*time.Millisecond,
				"replica %d did not move to %s; stderr:\n%s", i, rev, p.Stderr)
			status, _ := testutil.GetJSON(t, c, "http://"+p.addr+"/health/ready")
			assert.Equal(t, http.StatusOK, status)
		}
	}
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "tampered", Sign: good,
		Tamper: map[string]string{"authz/decision.rego": "package authz\n\ndecision := {\"allow\": true}\n"}}))
	for i, p := range replicas {
		require.Eventually(t, func() bool {
			_, st := testutil.GetJSON(t, c, "http://"+p.addr+"/v1/status")
			b, _ := st["bundles"].(map[string]any)["authz"].(map[string]any)
			return b != nil && b["code"] == "bundle_error"
		}, 30*time.Second, 20*time.Millisecond, "replica %d did not refuse the tampered bundle; stderr:\n%s", i, p.Stderr)
		assert.Equal(t, "v2", revisionOf(p), "replica %d left its revision", i)
		_, st := testutil.GetJSON(t, c, "http://"+p.addr+"/v1/status")
		assert.Equal(t, "v2", st["revision"])
		assert.Equal(t, "remote:authz", st["origin"])
		assert.Contains(t, p.Stderr.String(), "bundle refused; the active policy stays")
	}
	for _, p := range replicas {
		p.Signal(t, syscall.SIGTERM)
		assert.NoError(t, p.WaitExit(t, 30*time.Second))
	}
}

// TestServeReloadsBundleFileOnSIGHUP replaces the bundle file and sends SIGHUP: the new
// revision decides; a broken file then leaves the revision as it was.
func TestServeReloadsBundleFileOnSIGHUP(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	path := filepath.Join(dir, "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "file-1"}), 0o600))
	p := startServeProcess(t, "", "--bundle", path, "--facts", facts, "--addr", "127.0.0.1:0")
	c := &http.Client{Timeout: 15 * time.Second}
	defer c.CloseIdleConnections()
	revision := func() string {
		status, doc := testutil.PostJSON(t, c, "http://"+p.addr+"/v1/authorize", specRequest)
		require.Equal(t, http.StatusOK, status, "%v", doc)
		return doc["revision"].(string)
	}
	require.Equal(t, "file-1", revision())

	require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "file-2"}), 0o600))
	p.Signal(t, syscall.SIGHUP)
	require.Eventually(t, func() bool { return revision() == "file-2" }, 20*time.Second, 20*time.Millisecond, "stderr:\n%s", p.Stderr)

	require.NoError(t, os.WriteFile(path, []byte("not a bundle"), 0o600))
	p.Signal(t, syscall.SIGHUP)
	require.Eventually(t, func() bool { return strings.Contains(p.Stderr.String(), "bundle refused") }, 20*time.Second, 20*time.Millisecond)
	assert.Equal(t, "file-2", revision())
	_, st := testutil.GetJSON(t, c, "http://"+p.addr+"/v1/status")
	assert.Equal(t, "file:"+path, st["origin"])

	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 30*time.Second))
}

// TestDecideWithBundle decides with a draft bundle, verified when a key is given.
func TestDecideWithBundle(t *testing.T) {
	a, b := policytest.Keys(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	pub := testutil.WriteFile(t, dir, "key.pem", a.Public)
	signed := testutil.WriteFile(t, dir, "signed.tar.gz", string(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "draft-1",
		Sign: policytest.Signing{Key: a.Private, KeyID: "default"}})))
	otherKey := testutil.WriteFile(t, dir, "other.tar.gz", string(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "draft-2",
		Sign: policytest.Signing{Key: b.Private, KeyID: "default"}})))
	for _, tc := range []struct {
		name     string
		args     []string
		revision string // "" when refused
	}{
		{"unverified bundle", []string{"--bundle", signed}, "draft-1"},
		{"verified bundle", []string{"--bundle", signed, "--verification-key", pub}, "draft-1"},
		{"signed with another key", []string{"--bundle", otherKey, "--verification-key", pub}, ""},
		{"scope without key", []string{"--bundle", signed, "--scope", "x"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb strings.Builder
			err := run(t.Context(), append([]string{"decide", "--facts", facts}, tc.args...), strings.NewReader(specRequest), &out, &errb)
			if tc.revision == "" {
				var ee *exitError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, 2, ee.code)
				assert.Empty(t, out.String())
				return
			}
			require.NoError(t, err, "stderr: %s", errb.String())
			var doc map[string]any
			require.NoError(t, json.Unmarshal([]byte(out.String()), &doc))
			assert.Equal(t, tc.revision, doc["revision"])
			assert.Equal(t, true, doc["allow"])
		})
	}
}

// twoBundleServeConfig is a configuration file whose opa section downloads the gate's bundle
// "authz" from gateURL, bound to key release, and a second bundle "data" from dataURL, bound
// to key datateam; gateBundle names the gate's bundle unless it is "".
func twoBundleServeConfig(t *testing.T, dir, gateURL, dataURL, gateBundle string) string {
	t.Helper()
	a, b := policytest.Keys(t)
	polling := map[string]any{"long_polling_timeout_seconds": 10, "min_delay_seconds": 1, "max_delay_seconds": 2}
	cfg := map[string]any{
		"opa": map[string]any{
			"services": map[string]any{"gate": map[string]any{"url": gateURL}, "data": map[string]any{"url": dataURL}},
			"keys": map[string]any{
				"release":  map[string]any{"key": a.Public, "algorithm": "RS256"},
				"datateam": map[string]any{"key": b.Public, "algorithm": "RS256"},
			},
			"bundles": map[string]any{
				"authz": map[string]any{"service": "gate", "resource": "/authz.tar.gz", "signing": map[string]any{"keyid": "release"}, "polling": polling},
				"data":  map[string]any{"service": "data", "resource": "/data.tar.gz", "signing": map[string]any{"keyid": "datateam"}, "polling": polling},
			},
		},
	}
	if gateBundle != "" {
		cfg["gateBundle"] = gateBundle
	}
	raw, err := json.Marshal(cfg) // JSON is YAML
	require.NoError(t, err)
	return testutil.WriteFile(t, dir, "config-"+gateBundle+".yaml", string(raw))
}

// TestServeSecondBundleCannotGrant: `authz serve` with two keys and two remote bundles. Without
// gateBundle the start is refused with the line to add. With it, a second bundle validly
// signed by its own key, with roots ["authz"] and a grant-all decision, served before the
// gate's bundle, is refused (POLICY_BUNDLE_ROOTS in /v1/status, counted in
// authz_bundle_operations_total): the service stays not ready and denies; the gate's bundle,
// served next, is activated and decides.
func TestServeSecondBundleCannotGrant(t *testing.T) {
	t.Parallel()
	a, b := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)

	var stdout, stderr strings.Builder
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // bounded, should it start
	defer cancel()
	err := run(ctx, []string{"serve", "--config", twoBundleServeConfig(t, dir, gateSrv.URL, dataSrv.URL, ""), "--facts", facts},
		strings.NewReader(""), &stdout, &stderr)
	var ee *exitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.code)
	assert.Contains(t, ee.msg, "gateBundle: 2 bundles are configured (authz, data)")
	assert.Contains(t, ee.msg, "add `gateBundle: authz` or `gateBundle: data`")

	grantAll := map[string]string{"authz/decision.rego": `package authz

decision := {"allow": true, "code": "", "message": "", "reasons": [], "capabilities": {"reusableLeases": true,
	"nativeSyncIn": true, "nativeSyncOut": true, "persistentProcessSessions": true, "independentControlCommands": true,
	"incrementalSessionOutput": true, "concurrentSyncOperations": true, "duplexCommandStream": true, "runnerWebSocketIngress": true}}
`}
	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "grant-all", Roots: []string{"authz"}, Modules: grantAll,
		Sign: policytest.Signing{Key: b.Private, KeyID: "datateam"}}))
	log, stop := startServe(t, "--config", twoBundleServeConfig(t, dir, gateSrv.URL, dataSrv.URL, "authz"), "--facts", facts, "--addr", "127.0.0.1:0")
	base := "http://" + waitListening(t, log)
	c := &http.Client{Timeout: 15 * time.Second}
	defer c.CloseIdleConnections()
	_, deny := grantAndDenyRequests(t)

	bundleCode := func(name string) any {
		_, st := testutil.GetJSON(t, c, base+"/v1/status")
		bs, _ := st["bundles"].(map[string]any)
		bd, _ := bs[name].(map[string]any)
		return bd["code"]
	}
	require.Eventually(t, func() bool { return bundleCode("data") == "POLICY_BUNDLE_ROOTS" }, 30*time.Second, 20*time.Millisecond, "stderr:\n%s", log)
	status, _ := testutil.GetJSON(t, c, base+"/health/ready")
	assert.Equal(t, http.StatusServiceUnavailable, status, "the second bundle is not a policy")
	status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", deny)
	assert.NotEqual(t, true, doc["allow"], "status %d: %v", status, doc)

	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"},
		Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	require.Eventually(t, func() bool {
		status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", deny)
		return status == http.StatusOK && doc["revision"] == "release-1"
	}, 30*time.Second, 20*time.Millisecond, "stderr:\n%s", log)
	status, doc = testutil.PostJSON(t, c, base+"/v1/authorize", deny)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, false, doc["allow"], "examples/deny.json is denied by the gate's bundle")
	assert.Nil(t, bundleCode("authz"), "the gate's bundle is not refused for the other's overlap")

	resp, err := c.Get(base + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(metrics), `authz_bundle_operations_total{bundle="data",operation="activate",outcome="refused",reason="roots"}`)
	assert.Contains(t, string(metrics), `authz_bundle_operations_total{bundle="authz",operation="activate",outcome="ok",reason="none"}`)
	require.NoError(t, stop())
	assert.NotContains(t, log.String(), "context canceled")
}
