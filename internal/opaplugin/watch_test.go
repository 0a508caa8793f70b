package opaplugin

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/specexamples"
)

// activateBundle activates b as bundle authz in m's store, as OPA does for a download.
func activateBundle(t testing.TB, m *plugins.Manager, b *bundle.Bundle) {
	t.Helper()
	ctx := context.Background()
	txn, err := m.Store.NewTransaction(ctx, storage.WriteParams)
	require.NoError(t, err)
	err = bundle.Activate(&bundle.ActivateOpts{Ctx: ctx, Store: m.Store, Txn: txn, Compiler: ast.NewCompiler(), Metrics: metrics.New(),
		Bundles: map[string]*bundle.Bundle{"authz": b}})
	if err != nil {
		m.Store.Abort(ctx, txn)
	}
	require.NoError(t, err)
	require.NoError(t, m.Store.Commit(ctx, txn))
}

// TestGateWatchFollowsOPAsBundles: authz run's gate serves POST /v1/authorize/watch; a bundle
// OPA activates that still grants is an update (its revision), one that allows nothing is the
// revoke.
func TestGateWatchFollowsOPAsBundles(t *testing.T) {
	m := newManager(t, policyBundle(t, "v1"))
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`, io.Discard)
	waitState(t, m, plugins.StateOK)
	reqJSON, _ := specexamples.NewFixture().JSON()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr().String()+"/v1/authorize/watch", strings.NewReader(string(reqJSON)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	next := func() (string, map[string]any) {
		var kind string
		for sc.Scan() {
			line := sc.Text()
			if k, ok := strings.CutPrefix(line, "event: "); ok {
				kind = k
			} else if d, ok := strings.CutPrefix(line, "data: "); ok {
				var doc map[string]any
				require.NoError(t, json.Unmarshal([]byte(d), &doc))
				return kind, doc
			}
		}
		t.Fatalf("the stream ended: %v", sc.Err())
		return "", nil
	}
	kind, doc := next()
	require.Equal(t, "decision", kind)
	require.Equal(t, true, doc["allow"])
	require.Equal(t, "v1", doc["revision"])

	activateBundle(t, m, policyBundle(t, "v2"))
	kind, doc = next()
	require.Equal(t, "update", kind)
	require.Equal(t, true, doc["allow"])
	require.Equal(t, "v2", doc["revision"])

	activateBundle(t, m, policytest.NewBundle(t, policytest.BundleSpec{Revision: "deny-all", Roots: []string{"authz"},
		Modules: map[string]string{"authz/deny.rego": policytest.DenyAllModule}}))
	kind, doc = next()
	require.Equal(t, "revoke", kind)
	require.Equal(t, false, doc["allow"])
	require.Equal(t, "deny-all", doc["revision"])
	for sc.Scan() {
		require.Empty(t, sc.Text(), "nothing after the revoke but the end of its event")
	}
	require.NoError(t, sc.Err(), "the stream ends after the revoke")
}
