package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// grantAllPolicy is a policy that grants every request every capability.
var grantAllPolicy = func() string {
	caps := make([]string, len(api.CapabilityKeys))
	for i, k := range api.CapabilityKeys {
		caps[i] = `"` + k + `": true`
	}
	return "package authz\ndecision := {\"allow\": true, \"code\": \"\", \"message\": \"\", \"reasons\": [], \"capabilities\": {" +
		strings.Join(caps, ", ") + "}}\n"
}()

// logMaskPolicy rewrites every decision log event to read as a deny; logDropPolicy drops them all.
const (
	logMaskPolicy = "package system.log\nmask contains {\"op\": \"upsert\", \"path\": \"/result/allow\", \"value\": false}\n"
	logDropPolicy = "package system.log\ndrop if true\n"
)

// grantAndDenyRequests are a request the contract grants and one it denies, on specFacts.
func grantAndDenyRequests(t testing.TB) (grant, deny string) {
	t.Helper()
	for _, ex := range specexamples.Rows() {
		req, facts := ex.Fixture().JSON()
		if string(facts) != specFacts {
			continue
		}
		switch {
		case ex.Allow && grant == "":
			grant = string(req)
		case !ex.Allow && deny == "":
			deny = string(req)
		}
	}
	require.NotEmpty(t, grant)
	require.NotEmpty(t, deny)
	return grant, deny
}

// opaRequest sends method path body to OPA's listener, with host as the Host header when not
// empty, and returns the status and the body.
func opaRequest(t testing.TB, c *http.Client, method, url, host, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// loggedEvent waits for OPA's console decision log (in the process's stderr) to print the
// event of decision id, and returns it.
func loggedEvent(t testing.TB, stderr *testutil.SyncBuffer, id string) map[string]any {
	t.Helper()
	var ev map[string]any
	require.Eventually(t, func() bool {
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, `"decision_id":"`+id+`"`) {
				continue
			}
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil {
				ev = m
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "no decision log event for %s; log:\n%s", id, stderr)
	return ev
}

// decideLogged asks the gate for a decision and checks that OPA's decision log recorded it
// as answered (not dropped, not masked into another verdict).
func decideLogged(t testing.TB, c *http.Client, gate, req string, stderr *testutil.SyncBuffer) map[string]any {
	t.Helper()
	status, doc := testutil.PostJSON(t, c, gate+"/v1/authorize", req)
	require.Equal(t, http.StatusOK, status, "%v", doc)
	ev := loggedEvent(t, stderr, doc["decision_id"].(string))
	result, _ := ev["result"].(map[string]any)
	require.NotNil(t, result, "event: %v", ev)
	assert.Equal(t, doc["allow"], result["allow"], "the event records the verdict answered")
	return doc
}

// TestRunRefusesOPAWrites: under `authz run`, OPA's write APIs cannot change the gate. By
// default a PUT of a grant-all policy or of system.log mask and drop policies to OPA's
// listener is refused (403 OPA_WRITE_API_OFF); with plugins.authz.opaWriteAPI it is accepted
// (OPA's own queries see it), yet the gate's answers and its events in OPA's decision log are
// the same as before: the gate decides and logs with the configured policy only.
func TestRunRefusesOPAWrites(t *testing.T) {
	grant, deny := grantAndDenyRequests(t)
	for _, tt := range []struct {
		name     string
		section  string
		wantPut  int
		bundleOf string // a bundle with root authz and this revision; none when ""
	}{
		{name: "default, with a bundle", section: "", wantPut: http.StatusForbidden, bundleOf: "r1"},
		{name: "default, embedded policy", section: "", wantPut: http.StatusForbidden},
		{name: "opaWriteAPI, embedded policy", section: "    opaWriteAPI: true\n", wantPut: http.StatusOK},
		{name: "opaWriteAPI, with a bundle", section: "    opaWriteAPI: true\n", wantPut: http.StatusOK, bundleOf: "r2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			factsPath := testutil.WriteFile(t, dir, "facts.json", specFacts)
			cfgPath := testutil.WriteFile(t, dir, "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+factsPath+"\n"+tt.section+
				"decision_logs:\n  console: true\n")
			opaAddr := freeLoopbackAddr(t)
			args := []string{"--server", "--addr", opaAddr, "--config-file", cfgPath}
			if tt.bundleOf != "" {
				args = append(args, "--bundle", writePolicyBundle(t, dir, tt.bundleOf))
			}
			ar := startRun(t, args...)
			gate := "http://" + waitListening(t, ar.Stderr)
			opa := "http://" + opaAddr
			c := &http.Client{Timeout: 10 * time.Second}
			testutil.WaitOK(t, c, opa+"/health?plugins", 60*time.Second, ar.Stderr)

			grantBefore := decideLogged(t, c, gate, grant, ar.Stderr)
			denyBefore := decideLogged(t, c, gate, deny, ar.Stderr)

			for id, src := range map[string]string{"grant": grantAllPolicy, "mask": logMaskPolicy} {
				status, body := opaRequest(t, c, http.MethodPut, opa+"/v1/policies/"+id, "", src)
				if tt.bundleOf != "" && id == "grant" && status == http.StatusBadRequest {
					continue // OPA itself refuses a package under the bundle's root
				}
				assert.Equal(t, tt.wantPut, status, "PUT %s: %s", id, body)
				if tt.wantPut == http.StatusForbidden {
					assert.Contains(t, body, "OPA_WRITE_API_OFF")
				}
			}
			status, body := opaRequest(t, c, http.MethodPut, opa+"/v1/data/authz/grants", "", `{"all": true}`)
			if tt.bundleOf == "" {
				assert.Equal(t, tt.wantPut == http.StatusOK, status == http.StatusNoContent, "PUT data: %d %s", status, body)
			}

			assert.Equal(t, withoutID(grantBefore), withoutID(decideLogged(t, c, gate, grant, ar.Stderr)), "the grant is unchanged")
			assert.Equal(t, withoutID(denyBefore), withoutID(decideLogged(t, c, gate, deny, ar.Stderr)), "the deny is unchanged")

			status, body = opaRequest(t, c, http.MethodPut, opa+"/v1/policies/drop", "", logDropPolicy)
			assert.Equal(t, tt.wantPut, status, "PUT drop: %s", body)
			decideLogged(t, c, gate, grant, ar.Stderr) // still logged: not dropped

			if tt.wantPut == http.StatusOK && tt.bundleOf == "" {
				// OPA's own Data API sees what was written: it is OPA's, not the gate's.
				_, got := testutil.PostJSON(t, c, opa+"/v1/data/authz/decision", `{"input": {}}`)
				assert.Equal(t, true, got["result"].(map[string]any)["allow"], "OPA's own query sees the written policy")
			}
			c.CloseIdleConnections()
		})
	}
}

// TestRunChecksHostOnOPAListener: OPA's listener on loopback plain HTTP refuses a Host header
// that does not name it (DNS rebinding), on reads and writes alike, as the gate's does.
func TestRunChecksHostOnOPAListener(t *testing.T) {
	dir := t.TempDir()
	factsPath := testutil.WriteFile(t, dir, "facts.json", specFacts)
	cfgPath := testutil.WriteFile(t, dir, "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+factsPath+"\n")
	opaAddr := freeLoopbackAddr(t)
	ar := startRun(t, "--server", "--addr", opaAddr, "--config-file", cfgPath)
	waitListening(t, ar.Stderr)
	opa := "http://" + opaAddr
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitOK(t, c, opa+"/health", 60*time.Second, ar.Stderr)
	_, port, err := net.SplitHostPort(opaAddr)
	require.NoError(t, err)

	for _, host := range []string{"attacker.example:" + port, "attacker.example", "127.0.0.1:1"} {
		status, body := opaRequest(t, c, http.MethodGet, opa+"/health", host, "")
		assert.Equal(t, http.StatusForbidden, status, "GET /health, Host %s: %s", host, body)
		assert.Contains(t, body, "HOST_NOT_ALLOWED")
		status, body = opaRequest(t, c, http.MethodPut, opa+"/v1/policies/x", host, grantAllPolicy)
		assert.Equal(t, http.StatusForbidden, status, "PUT, Host %s: %s", host, body)
		status, body = opaRequest(t, c, http.MethodPost, opa+"/v1/data/authz/decision", host, `{"input": {}}`)
		assert.Equal(t, http.StatusForbidden, status, "POST, Host %s: %s", host, body)
	}
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port} {
		status, body := opaRequest(t, c, http.MethodGet, opa+"/health", host, "")
		assert.Equal(t, http.StatusOK, status, "Host %s: %s", host, body)
	}
	c.CloseIdleConnections()
}

// TestRunReportsBundleOrigin: with OPA's services and bundles, the gate is not ready and denies
// (EVAL_NO_POLICY) until the bundle is downloaded, whatever OPA's API is sent meanwhile; then it
// decides with the bundle's revision, and /v1/status and authz_policy_revision_info report the
// origin remote:NAME and when it was activated.
func TestRunReportsBundleOrigin(t *testing.T) {
	bundleBytes := policytest.MakeBundle(t, policytest.BundleSpec{Revision: "v42", Roots: []string{"authz"}})
	var served atomic.Bool
	bs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !served.Load() {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/gzip")
		_, _ = w.Write(bundleBytes)
	}))
	t.Cleanup(bs.Close)

	dir := t.TempDir()
	factsPath := testutil.WriteFile(t, dir, "facts.json", specFacts)
	cfgPath := testutil.WriteFile(t, dir, "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+factsPath+"\n"+
		"services:\n  bundles:\n    url: "+bs.URL+"\n"+
		"bundles:\n  authz:\n    service: bundles\n    resource: /authz.tar.gz\n    polling: {min_delay_seconds: 1, max_delay_seconds: 2}\n")
	opaAddr := freeLoopbackAddr(t)
	start := time.Now().UTC()
	ar := startRun(t, "--server", "--addr", opaAddr, "--config-file", cfgPath)
	gate := "http://" + waitListening(t, ar.Stderr)
	opa := "http://" + opaAddr
	c := &http.Client{Timeout: 10 * time.Second}
	grant, _ := grantAndDenyRequests(t)
	testutil.WaitOK(t, c, opa+"/health", 60*time.Second, ar.Stderr)

	status, _ := opaRequest(t, c, http.MethodPut, opa+"/v1/policies/x", "", grantAllPolicy)
	assert.Equal(t, http.StatusForbidden, status)
	status, doc := testutil.PostJSON(t, c, gate+"/v1/authorize", grant)
	assert.Equal(t, http.StatusInternalServerError, status, "%v", doc)
	assert.Equal(t, false, doc["allow"])
	status, _ = testutil.GetJSON(t, c, gate+"/health/ready")
	assert.Equal(t, http.StatusServiceUnavailable, status, "not ready before the bundle is downloaded")

	served.Store(true)
	testutil.WaitReady(t, c, gate, 60*time.Second, ar.Stderr)
	status, doc = testutil.PostJSON(t, c, gate+"/v1/authorize", grant)
	require.Equal(t, http.StatusOK, status, "%v", doc)
	assert.Equal(t, true, doc["allow"])
	assert.Equal(t, "v42", doc["revision"])

	_, st := testutil.GetJSON(t, c, gate+"/v1/status")
	assert.Equal(t, "v42", st["revision"])
	assert.Equal(t, "remote:authz", st["origin"])
	at, err := time.Parse(time.RFC3339Nano, st["activated_at"].(string))
	require.NoError(t, err)
	assert.False(t, at.Before(start), "activated_at %v is the bundle's activation, after the start %v", at, start)
	b, _ := st["bundles"].(map[string]any)["authz"].(map[string]any)
	require.NotNil(t, b, "%v", st)
	assert.Equal(t, "v42", b["active_revision"])

	resp, err := c.Get(gate + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Regexp(t, `authz_policy_revision_info\{[^}]*origin="remote:authz"[^}]*revision="v42"[^}]*\} 1`, string(metrics))
	c.CloseIdleConnections()
}
