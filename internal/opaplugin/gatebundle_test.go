package opaplugin

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/discovery"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/policy/policytest"
)

// twoBundleManager is an OPA plugin manager, as `authz run` makes it, downloading the gate's
// bundle "authz" (bound to key release) from gateSrv and a second bundle "data" (bound to key
// datateam) from dataSrv, with the plugin of raw registered; neither is started.
func twoBundleManager(t *testing.T, gateSrv, dataSrv *policytest.BundleServer, raw string) (*plugins.Manager, *Plugin, error) {
	return twoBundleManagerPersisted(t, gateSrv, dataSrv, raw, "")
}

// twoBundleManagerPersisted is twoBundleManager with both bundles persisted in persist, when
// it is not "".
func twoBundleManagerPersisted(t *testing.T, gateSrv, dataSrv *policytest.BundleServer, raw, persist string) (*plugins.Manager, *Plugin, error) {
	t.Helper()
	a, b := policytest.Keys(t)
	polling := map[string]any{"min_delay_seconds": 1, "max_delay_seconds": 1}
	opa := map[string]any{
		"services": map[string]any{"gate": map[string]any{"url": gateSrv.URL}, "data": map[string]any{"url": dataSrv.URL}},
		"keys": map[string]any{
			"release":  map[string]any{"key": a.Public, "algorithm": "RS256"},
			"datateam": map[string]any{"key": b.Public, "algorithm": "RS256"},
		},
		"bundles": map[string]any{
			"authz": map[string]any{"service": "gate", "resource": "/authz.tar.gz", "signing": map[string]any{"keyid": "release"}, "polling": polling},
			"data":  map[string]any{"service": "data", "resource": "/data.tar.gz", "signing": map[string]any{"keyid": "datateam"}, "polling": polling},
		},
	}
	if persist != "" {
		opa["persistence_directory"] = persist
		for _, v := range opa["bundles"].(map[string]any) {
			v.(map[string]any)["persist"] = true
		}
	}
	doc, err := json.Marshal(opa)
	require.NoError(t, err)
	m, err := plugins.New(doc, "test", inmem.New())
	require.NoError(t, err)
	require.NoError(t, m.Init(t.Context()))
	t.Cleanup(func() { m.Stop(context.Background()) })
	disco, err := discovery.New(m)
	require.NoError(t, err)
	m.Register(discovery.Name, disco)
	f := Factory{LogOutput: io.Discard}
	cfg, err := f.Validate(m, []byte(raw))
	if err != nil {
		return nil, nil, err
	}
	p := f.New(m, cfg).(*Plugin)
	m.Register(Name, p)
	return m, p, nil
}

// TestRunGateDecidesOnlyWithItsBundle: under `authz run`, with two bundles, the configuration
// names the gate's bundle (else the start is refused with the line to add). A second bundle,
// validly signed by its own key, with roots ["authz"] and a grant-all decision, is never
// activated (POLICY_BUNDLE_ROOTS in the gate's status) and neither becomes the gate's policy
// nor switches the gate off: the gate's bundle, published after it, is activated and decides;
// the same bundle published again later changes nothing.
func TestRunGateDecidesOnlyWithItsBundle(t *testing.T) {
	a, b := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	facts := specFactsFile(t)

	_, _, err := twoBundleManager(t, gateSrv, dataSrv, `{"addr": "127.0.0.1:0", "facts": "`+facts+`"}`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "add `plugins.authz.gateBundle: authz` or `plugins.authz.gateBundle: data`")

	evil := policytest.MakeBundle(t, policytest.BundleSpec{Revision: "grant-all", Roots: []string{"authz"},
		Modules: map[string]string{"authz/decision.rego": grantAllModule}, Sign: policytest.Signing{Key: b.Private, KeyID: "datateam"}})
	dataSrv.Publish(evil)
	m, p, err := twoBundleManager(t, gateSrv, dataSrv, `{"addr": "127.0.0.1:0", "facts": "`+facts+`", "gateBundle": "authz"}`)
	require.NoError(t, err)
	require.NoError(t, m.Start(t.Context()))
	t.Cleanup(func() { p.Stop(context.Background()) })

	policytest.WaitFor(t, "the second bundle to be refused", 20*time.Second, func() bool {
		return p.gate.Revision() != "" || p.gate.Status().Bundles["data"] != nil && p.gate.Status().Bundles["data"].Code == string(coded.PolicyBundleRoots)
	})
	assert.Empty(t, p.gate.Revision(), "a second bundle whose roots reach authz must not become the gate's policy")
	assert.Contains(t, p.gate.Status().Bundles["data"].Message, "give bundle data a .manifest whose roots leave them out")

	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"},
		Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	policytest.WaitFor(t, "the gate's bundle", 20*time.Second, func() bool { return p.gate.Revision() == "release-1" })
	waitState(t, m, plugins.StateOK)
	assert.Empty(t, p.gate.Status().Bundles["authz"].Code, "OPA activated the gate's bundle: no overlap with the refused one")

	// Served again, the second bundle still changes nothing.
	published := time.Now()
	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "grant-all-2", Roots: []string{"authz"},
		Modules: map[string]string{"authz/decision.rego": grantAllModule}, Sign: policytest.Signing{Key: b.Private, KeyID: "datateam"}}))
	policytest.WaitFor(t, "the second bundle to be downloaded again", 20*time.Second, func() bool {
		return p.gate.Revision() != "release-1" || p.gate.Status().Bundles["data"].LastSuccessfulDownload.After(published)
	})
	assert.Equal(t, "release-1", p.gate.Revision())
	assert.Equal(t, plugins.StateOK, m.PluginStatus()[Name].State)
}

// TestRunPersistedSecondBundleNotActivated: a second bundle on disk in OPA's persistence
// directory whose roots reach authz (as an earlier version let OPA persist it) is not
// activated when OPA loads it at start: it is not in OPA's store, the gate shows
// POLICY_BUNDLE_ROOTS for it and adopts the persisted gate's bundle.
func TestRunPersistedSecondBundleNotActivated(t *testing.T) {
	a, b := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	persist := t.TempDir()
	write := func(name string, spec policytest.BundleSpec) {
		p := filepath.Join(persist, "bundles", name, "bundle.tar.gz")
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o700))
		require.NoError(t, os.WriteFile(p, policytest.MakeBundle(t, spec), 0o600))
	}
	write("data", policytest.BundleSpec{Revision: "grant-all", Roots: []string{"authz"},
		Modules: map[string]string{"authz/decision.rego": grantAllModule}, Sign: policytest.Signing{Key: b.Private, KeyID: "datateam"}})
	write("authz", policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"}, Sign: policytest.Signing{Key: a.Private, KeyID: "release"}})

	m, p, err := twoBundleManagerPersisted(t, gateSrv, dataSrv, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`", "gateBundle": "authz"}`, persist)
	require.NoError(t, err)
	require.NoError(t, m.Start(t.Context()))
	t.Cleanup(func() { p.Stop(context.Background()) })
	policytest.WaitFor(t, "the persisted gate's bundle", 20*time.Second, func() bool { return p.gate.Revision() != "" })
	assert.Equal(t, "release-1", p.gate.Revision())
	names, err := storeBundleNames(t.Context(), m.Store)
	require.NoError(t, err)
	assert.Equal(t, []string{"authz"}, names, "the persisted second bundle is not activated in OPA's store")
	assert.Equal(t, string(coded.PolicyBundleRoots), p.gate.Status().Bundles["data"].Code)
}
