package opaplugin

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// persistedManager is an initialized plugin manager with OPA's persistence_directory dir and
// b activated as bundle authz.
func persistedManager(t *testing.T, dir string, b *bundle.Bundle) *plugins.Manager {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"persistence_directory": dir})
	require.NoError(t, err)
	m, err := plugins.New(raw, "test", inmem.New(), plugins.InitBundles(map[string]*bundle.Bundle{"authz": b}))
	require.NoError(t, err)
	require.NoError(t, m.Init(t.Context()))
	t.Cleanup(func() { m.Stop(context.Background()) })
	return m
}

func signedBundle(t *testing.T, revision string, iat int64) *bundle.Bundle {
	a, _ := policytest.Keys(t)
	return policytest.NewBundle(t, policytest.BundleSpec{Revision: revision, Roots: []string{"authz"},
		Sign: policytest.Signing{Key: a.Private, KeyID: "k", IssuedAt: iat}})
}

// TestGateOrderKeptInPersistenceDirectory: the order recorded in OPA's persistence directory
// holds at start: a signed bundle issued before the recorded one is refused, and with no
// earlier copy the gate has no policy (it denies, EVAL_NO_POLICY, not ready); a later one is
// adopted and recorded.
func TestGateOrderKeptInPersistenceDirectory(t *testing.T) {
	facts := specFactsFile(t)
	reqJSON, _ := specexamples.NewFixture().JSON()

	dir := t.TempDir()
	testutil.WriteFile(t, dir, "authz-bundle-order.json", `{"issued_at": {"authz": 2000}}`)
	m := persistedManager(t, dir, signedBundle(t, "v1000", 1000))
	p := startPlugin(t, m, `{"addr": "127.0.0.1:0", "facts": "`+facts+`"}`, io.Discard)
	st := waitState(t, m, plugins.StateNotReady)
	assert.Contains(t, st.Message, coded.PolicyBundleRollback)
	status, header, _ := post(t, "http://"+p.Addr().String()+"/v1/authorize", reqJSON)
	assert.Equal(t, http.StatusInternalServerError, status)
	assert.Equal(t, string(coded.EvalNoPolicy), header.Get("X-Authz-Error"))
	assert.Equal(t, string(coded.PolicyBundleRollback), p.gate.Status().Bundles["authz"].Code)

	dir2 := t.TempDir()
	testutil.WriteFile(t, dir2, "authz-bundle-order.json", `{"issued_at": {"authz": 2000}}`)
	m2 := persistedManager(t, dir2, signedBundle(t, "v3000", 3000))
	p2 := startPlugin(t, m2, `{"addr": "127.0.0.1:0", "facts": "`+facts+`"}`, io.Discard)
	waitState(t, m2, plugins.StateOK)
	assert.Equal(t, "v3000", p2.gate.Revision())
	state, err := os.ReadFile(filepath.Join(dir2, "authz-bundle-order.json"))
	require.NoError(t, err)
	assert.JSONEq(t, `{"issued_at": {"authz": 3000}}`, string(state))
}

// A malformed order file stops the gate's start: without the recorded order an older bundle
// would be adopted.
func TestGateOrderStateUnreadableStopsStart(t *testing.T) {
	dir := t.TempDir()
	testutil.WriteFile(t, dir, "authz-bundle-order.json", "{not json")
	m := persistedManager(t, dir, signedBundle(t, "v1", 1000))
	f := Factory{LogOutput: io.Discard}
	cfg, err := f.Validate(m, []byte(`{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`))
	require.NoError(t, err)
	p := f.New(m, cfg).(*Plugin)
	m.Register(Name, p)
	err = p.Start(t.Context())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "authz-bundle-order.json")
	t.Cleanup(func() { p.Stop(context.Background()) })
	assert.Nil(t, p.Addr(), "the gate does not serve")
}
