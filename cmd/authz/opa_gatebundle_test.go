package main

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestRunDecidesOnlyWithItsBundle: `authz run` with two keys and two bundle servers. Without
// plugins.authz.gateBundle OPA's start is refused (exit 1) with the line to add. With it, a
// second bundle validly signed by its own key, with roots ["authz"] and a grant-all decision,
// published first, is refused (POLICY_BUNDLE_ROOTS in the gate's /v1/status); the gate's
// bundle, published next, is activated and decides: examples/deny.json is denied with its
// revision.
func TestRunDecidesOnlyWithItsBundle(t *testing.T) {
	a, b := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	config := func(gateBundle string) string {
		section := "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: " + facts + "\n"
		if gateBundle != "" {
			section += "    gateBundle: " + gateBundle + "\n"
		}
		return testutil.WriteFile(t, dir, "opa-"+gateBundle+".yaml", section+
			"services:\n  gate:\n    url: "+gateSrv.URL+"\n  data:\n    url: "+dataSrv.URL+"\n"+
			"keys:\n"+pemKeyYAML("release", a.Public)+pemKeyYAML("datateam", b.Public)+
			"bundles:\n"+
			"  authz:\n    service: gate\n    resource: /authz.tar.gz\n    signing: {keyid: release}\n    polling: {min_delay_seconds: 1, max_delay_seconds: 1}\n"+
			"  data:\n    service: data\n    resource: /data.tar.gz\n    signing: {keyid: datateam}\n    polling: {min_delay_seconds: 1, max_delay_seconds: 1}\n")
	}

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, runBinary(t), "run", "--server", "--addr", "127.0.0.1:0", "--config-file", config("")).CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "output:\n%s", out)
	assert.Equal(t, 1, ee.ExitCode(), "output:\n%s", out)
	assert.Contains(t, string(out), "add `plugins.authz.gateBundle: authz` or `plugins.authz.gateBundle: data`")

	grantAll := map[string]string{"authz/decision.rego": `package authz

decision := {"allow": true, "code": "", "message": "", "reasons": [], "capabilities": {"reusableLeases": true,
	"nativeSyncIn": true, "nativeSyncOut": true, "persistentProcessSessions": true, "independentControlCommands": true,
	"incrementalSessionOutput": true, "concurrentSyncOperations": true, "duplexCommandStream": true, "runnerWebSocketIngress": true}}
`}
	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "grant-all", Roots: []string{"authz"}, Modules: grantAll,
		Sign: policytest.Signing{Key: b.Private, KeyID: "datateam"}}))
	ar := startRun(t, "--server", "--addr", freeLoopbackAddr(t), "--config-file", config("authz"))
	gate := "http://" + waitListening(t, ar.Stderr)
	c := &http.Client{Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	dataCode := func() any {
		_, st := testutil.GetJSON(t, c, gate+"/v1/status")
		bs, _ := st["bundles"].(map[string]any)
		bd, _ := bs["data"].(map[string]any)
		return bd["code"]
	}
	require.Eventually(t, func() bool { return dataCode() == string(coded.PolicyBundleRoots) }, 30*time.Second, 20*time.Millisecond, "stderr:\n%s", ar.Stderr)
	_, deny := grantAndDenyRequests(t)
	status, doc := testutil.PostJSON(t, c, gate+"/v1/authorize", deny)
	assert.NotEqual(t, true, doc["allow"], "status %d: %v", status, doc)

	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"},
		Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	testutil.WaitReady(t, c, gate, 60*time.Second, ar.Stderr)
	status, doc = testutil.PostJSON(t, c, gate+"/v1/authorize", deny)
	assert.Equal(t, http.StatusOK, status)
	assert.Equal(t, false, doc["allow"])
	assert.Equal(t, "release-1", doc["revision"])
	assert.True(t, strings.Contains(ar.Stderr.String(), string(coded.PolicyBundleRoots)), "the refusal is logged")
}
