package opaplugin

import (
	"context"
	"encoding/json"
	"io"
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
)

// keyedManager is an initialized plugin manager whose OPA configuration has the public keys
// (by name) and a bundle authz with the signing block signing (none when nil), with b
// activated as bundle authz.
func keyedManager(t *testing.T, keys map[string]string, signing any, b *bundle.Bundle) *plugins.Manager {
	t.Helper()
	ks := map[string]any{}
	for n, pub := range keys {
		ks[n] = map[string]any{"algorithm": "RS256", "key": pub}
	}
	bc := map[string]any{"service": "bundles", "resource": "/authz.tar.gz"}
	if signing != nil {
		bc["signing"] = signing
	}
	raw, err := json.Marshal(map[string]any{
		"services": map[string]any{"bundles": map[string]any{"url": "http://127.0.0.1:1"}},
		"keys":     ks,
		"bundles":  map[string]any{"authz": bc},
	})
	require.NoError(t, err)
	m, err := plugins.New(raw, "test", inmem.New(), plugins.InitBundles(map[string]*bundle.Bundle{"authz": b}))
	require.NoError(t, err)
	require.NoError(t, m.Init(t.Context()))
	t.Cleanup(func() { m.Stop(context.Background()) })
	return m
}

// TestGateHoldsOPAKeysToServesRule: the plugin refuses OPA's configuration that authz serve
// refuses in its opa section, with the same message: two keys and a bundle whose signing block
// names neither (either key could sign it), or a key and a bundle without a signing block (OPA
// would activate it unsigned). A gate that meets such a configuration anyway (one OPA was
// reconfigured with) adopts none of its bundles: it has no policy and says why.
func TestGateHoldsOPAKeysToServesRule(t *testing.T) {
	a, b := policytest.Keys(t)
	two := map[string]string{"release": a.Public, "other": b.Public}
	one := map[string]string{"release": a.Public}
	unsigned := policytest.NewBundle(t, policytest.BundleSpec{Revision: "unsigned", Roots: []string{"authz"}})
	raw := []byte(`{"addr": "127.0.0.1:0", "facts": "` + specFactsFile(t) + `"}`)
	for _, tt := range []struct {
		name    string
		keys    map[string]string
		signing any
		want    string
	}{
		{name: "two keys, signing names none", keys: two, signing: map[string]any{},
			want: "bundles.authz.signing: 2 keys are configured, so this bundle must name the one key that signs it, else any of them could sign it"},
		{name: "a key, no signing block", keys: one,
			want: "bundles.authz: keys are configured but this bundle has no signing block, so OPA would accept it unsigned"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := keyedManager(t, tt.keys, tt.signing, unsigned)
			_, err := Factory{LogOutput: io.Discard}.Validate(m, raw)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "plugins.authz: OPA's configuration: "+tt.want)

			cfg, err := parseConfig(raw, false)
			require.NoError(t, err)
			g := newGate(m)
			g.settings.Store(gateSettings(cfg))
			msg, err := g.load(t.Context())
			require.NoError(t, err)
			assert.Contains(t, msg, tt.want)
			assert.Contains(t, msg, coded.EvalNoPolicy)
			assert.Empty(t, g.Revision(), "the bundle is not adopted")
		})
	}
}

// TestGateAdoptsOnlyVerifiedBundlesWhenKeyed: with keys in OPA's configuration, a bundle of
// the bundles section that carries no verified signature is not adopted, however it was
// activated in OPA's store; the same bundle signed by the configured key is.
func TestGateAdoptsOnlyVerifiedBundlesWhenKeyed(t *testing.T) {
	a, _ := policytest.Keys(t)
	keys := map[string]string{"k": a.Public}
	cfg, err := parseConfig([]byte(`{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`"}`), false)
	require.NoError(t, err)

	m := keyedManager(t, keys, map[string]any{"keyid": "k"},
		policytest.NewBundle(t, policytest.BundleSpec{Revision: "unsigned", Roots: []string{"authz"}}))
	g := newGate(m)
	g.settings.Store(gateSettings(cfg))
	msg, err := g.load(t.Context())
	require.NoError(t, err)
	assert.Contains(t, msg, "bundle authz has no verified signature")
	assert.Contains(t, msg, coded.EvalNoPolicy)
	assert.Empty(t, g.Revision())

	m = keyedManager(t, keys, map[string]any{"keyid": "k"}, signedBundle(t, "signed", 1000))
	g = newGate(m)
	g.settings.Store(gateSettings(cfg))
	msg, err = g.load(t.Context())
	require.NoError(t, err)
	assert.Empty(t, msg)
	assert.Equal(t, "signed", g.Revision())
}

// TestReloadReachesServingGates: Reload reloads the gate's server while it serves (its
// decision log is reopened at its path after a rename) and reaches no gate once it stopped;
// a Reload racing the stop neither blocks nor touches a stopped server.
func TestReloadReachesServingGates(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "decisions.log")
	p := startPlugin(t, newManager(t, nil), `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`", "decisionLog": {"path": "`+logPath+`"}}`, io.Discard)
	require.FileExists(t, logPath)
	require.NoError(t, os.Rename(logPath, logPath+".1"))
	assert.Equal(t, 1, Reload())
	assert.FileExists(t, logPath, "the decision log is reopened at its path")

	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			Reload()
		}
	}()
	p.Stop(context.Background())
	<-done
	assert.Equal(t, 0, Reload(), "a stopped gate is not reloaded")
}
