package opaplugin

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/policy/policytest"
)

// TestRunSecondBundleTooLargeRefused: under `authz run`, a second bundle, validly signed by
// its own key with roots of its own, carrying more Rego than plugins.authz.otherBundleRegoBytes
// or more data than plugins.authz.otherBundleDataBytes, is refused in the activator before OPA
// decodes or compiles it (POLICY_BUNDLE_TOO_LARGE, naming the key to raise): nothing of it is
// in OPA's store, and the gate's bundle is activated and decides; under the bounds the second
// bundle is activated.
func TestRunSecondBundleTooLargeRefused(t *testing.T) {
	a, b := policytest.Keys(t)
	gateSrv, dataSrv := policytest.NewBundleServer(t), policytest.NewBundleServer(t)
	sign := policytest.Signing{Key: b.Private, KeyID: "datateam"}
	var rego strings.Builder
	rego.WriteString("package other\n\n")
	for i := range 200 {
		fmt.Fprintf(&rego, "r%d := {\"a\": [input.x, %d]} if input.z == %d\n", i, i, i)
	}
	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "rego", Roots: []string{"other"},
		Modules: map[string]string{"other/p.rego": rego.String()}, Sign: sign}))
	m, p, err := twoBundleManager(t, gateSrv, dataSrv, `{"addr": "127.0.0.1:0", "facts": "`+specFactsFile(t)+`", "gateBundle": "authz",
		"otherBundleRegoBytes": 4096, "otherBundleDataBytes": 2048}`)
	require.NoError(t, err)
	require.NoError(t, m.Start(t.Context()))
	t.Cleanup(func() { p.Stop(context.Background()) })
	refused := func(key string) func() bool {
		return func() bool {
			st := p.gate.Status().Bundles["data"]
			return st != nil && st.Code == string(coded.PolicyBundleTooLarge) && strings.Contains(st.Message, "raise "+key)
		}
	}
	policytest.WaitFor(t, "the second bundle's Rego to be refused", 20*time.Second, refused("plugins.authz.otherBundleRegoBytes"))

	gateSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "release-1", Roots: []string{"authz"},
		Sign: policytest.Signing{Key: a.Private, KeyID: "release"}}))
	policytest.WaitFor(t, "the gate's bundle", 20*time.Second, func() bool { return p.gate.Revision() == "release-1" })

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "data", Roots: []string{"other"},
		Modules: map[string]string{"other/p.rego": "package other\n\nx := 1\n"}, Data: map[string]any{"other": map[string]any{"s": strings.Repeat("x", 4096)}}, Sign: sign}))
	policytest.WaitFor(t, "the second bundle's data to be refused", 20*time.Second, refused("plugins.authz.otherBundleDataBytes"))
	inStore := func() bool {
		found := false
		_ = storage.Txn(t.Context(), m.Store, storage.TransactionParams{}, func(txn storage.Transaction) error {
			_, err := m.Store.Read(t.Context(), txn, storage.MustParsePath("/other"))
			found = err == nil
			return nil
		})
		return found
	}
	assert.False(t, inStore(), "a refused bundle is not activated in OPA's store")

	dataSrv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "small", Roots: []string{"other"},
		Modules: map[string]string{"other/p.rego": "package other\n\nx := 1\n"}, Data: map[string]any{"other": map[string]any{"s": "x"}}, Sign: sign}))
	policytest.WaitFor(t, "the second bundle under the bounds", 20*time.Second, func() bool {
		st := p.gate.Status().Bundles["data"]
		return st != nil && st.Code == "" && st.ActiveRevision == "small"
	})
	assert.True(t, inStore())
	assert.Equal(t, "release-1", p.gate.Revision())
}

// TestOtherBundleBoundsParsed: the bounds are positive numbers of bytes.
func TestOtherBundleBoundsParsed(t *testing.T) {
	cfg, err := parseConfig([]byte(`{"facts": "`+specFactsFile(t)+`", "otherBundleRegoBytes": 10, "otherBundleDataBytes": 20}`), true)
	require.NoError(t, err)
	assert.Equal(t, int64(10), cfg.OtherBundleRegoBytes)
	assert.Equal(t, int64(20), cfg.OtherBundleDataBytes)
	_, err = parseConfig([]byte(`{"facts": "`+specFactsFile(t)+`", "otherBundleRegoBytes": -1}`), true)
	require.ErrorContains(t, err, "plugins.authz.otherBundleRegoBytes: must be a positive number of bytes")
	_, err = parseConfig([]byte(`{"facts": "`+specFactsFile(t)+`", "otherBundleDataBytes": "big"}`), true)
	require.ErrorContains(t, err, "plugins.authz.otherBundleDataBytes: must be a positive number of bytes")
}
