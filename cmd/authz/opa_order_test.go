package main

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestRunRefusesBundleRollback: under `authz run` with a signed bundle from a bundle server,
// the gate orders bundles by their signature's issue time, as `authz serve` does. After v2000
// (iat 2000), an older validly signed bundle (iat 1000), which OPA verifies and activates, is
// refused by the gate: it keeps deciding with v2000, logs a WARN with POLICY_BUNDLE_ROLLBACK
// and both issue times, and /v1/status shows the refusal. A bundle signed again with a newer
// iat (3000) is adopted. With OPA's persistence_directory the order survives a restart: the
// older bundle is refused again.
func TestRunRefusesBundleRollback(t *testing.T) {
	a, _ := policytest.Keys(t)
	srv := policytest.NewBundleServer(t)
	publish := func(rev string, iat int64) {
		srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: rev, Roots: []string{"authz"},
			Sign: policytest.Signing{Key: a.Private, KeyID: "k", IssuedAt: iat}}))
	}
	dir := t.TempDir()
	persist := t.TempDir()
	factsPath := testutil.WriteFile(t, dir, "facts.json", specFacts)
	cfgPath := testutil.WriteFile(t, dir, "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+factsPath+"\n"+
		"services:\n  bundles:\n    url: "+srv.URL+"\n"+
		"keys:\n  k:\n    algorithm: RS256\n    key: |\n      "+strings.ReplaceAll(strings.TrimSpace(a.Public), "\n", "\n      ")+"\n"+
		"persistence_directory: "+persist+"\n"+
		"bundles:\n  authz:\n    service: bundles\n    resource: /authz.tar.gz\n    persist: true\n    signing: {keyid: k}\n"+
		"    polling: {min_delay_seconds: 1, max_delay_seconds: 1}\n")
	grant, _ := grantAndDenyRequests(t)
	c := &http.Client{Timeout: 10 * time.Second}
	revision := func(gate string) string {
		status, doc := testutil.PostJSON(t, c, gate+"/v1/authorize", grant)
		require.Equal(t, http.StatusOK, status, "%v", doc)
		return doc["revision"].(string)
	}
	bundleStatus := func(gate string) (map[string]any, map[string]any) {
		_, st := testutil.GetJSON(t, c, gate+"/v1/status")
		b, _ := st["bundles"].(map[string]any)["authz"].(map[string]any)
		return st, b
	}
	// refused waits until OPA has activated the bundle of revision rev (OPA's status says so)
	// and the gate has refused it, or the gate decides with it.
	refused := func(gate, rev string) func() bool {
		return func() bool {
			if revision(gate) == rev {
				return true
			}
			_, b := bundleStatus(gate)
			return b != nil && b["code"] == string(coded.PolicyBundleRollback) && strings.Contains(b["message"].(string), "1970-01-01T00:16:40Z")
		}
	}

	publish("v2000", 2000)
	ar := startRun(t, "--server", "--addr", freeLoopbackAddr(t), "--config-file", cfgPath)
	gate := "http://" + waitListening(t, ar.Stderr)
	testutil.WaitReady(t, c, gate, 60*time.Second, ar.Stderr)
	policytest.WaitFor(t, "v2000", 20*time.Second, func() bool { return revision(gate) == "v2000" })

	publish("v1000", 1000)
	policytest.WaitFor(t, "the older bundle to be refused", 20*time.Second, refused(gate, "v1000"))
	assert.Equal(t, "v2000", revision(gate), "a bundle issued before the gate's must not replace it")
	st, b := bundleStatus(gate)
	assert.Equal(t, "v2000", st["revision"])
	assert.Contains(t, st["last_error"], coded.PolicyBundleRollback)
	assert.Equal(t, "v2000", b["active_revision"], "the revision the gate decides with")
	assert.Contains(t, b["message"], "issued at 1970-01-01T00:16:40Z, before the active bundle (issued at 1970-01-01T00:33:20Z)")
	log := testutil.WaitLogged(t, ar.Stderr, regexp.MustCompile(`((?:\[WARN\]|"@level":"warn").*`+string(coded.PolicyBundleRollback)+`.*)`), 10*time.Second)
	assert.Contains(t, log, "1970-01-01T00:16:40Z")
	assert.Contains(t, log, "1970-01-01T00:33:20Z")
	status, _ := testutil.GetJSON(t, c, gate+"/health/ready")
	assert.Equal(t, http.StatusOK, status, "the gate still decides with its policy")

	publish("v3000", 3000)
	policytest.WaitFor(t, "the re-signed bundle", 20*time.Second, func() bool { return revision(gate) == "v3000" })
	st, b = bundleStatus(gate)
	assert.Empty(t, b["code"])
	assert.Empty(t, st["last_error"])

	state, err := os.ReadFile(filepath.Join(persist, "authz-bundle-order.json"))
	require.NoError(t, err, "the order is kept in OPA's persistence directory, as authz serve keeps it")
	assert.JSONEq(t, `{"issued_at": {"authz": 3000}}`, string(state))

	// After a restart the order holds: OPA loads the persisted v3000, then downloads v1000.
	ar.Terminate(t)
	publish("v1000", 1000)
	ar = startRun(t, "--server", "--addr", freeLoopbackAddr(t), "--config-file", cfgPath)
	gate = "http://" + waitListening(t, ar.Stderr)
	testutil.WaitReady(t, c, gate, 60*time.Second, ar.Stderr)
	policytest.WaitFor(t, "the older bundle to be refused after a restart", 20*time.Second, refused(gate, "v1000"))
	assert.Equal(t, "v3000", revision(gate))
	c.CloseIdleConnections()
}
