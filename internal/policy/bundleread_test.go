package policy

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestFileBundleWithLyingHeaderRefused: a bundle file whose tar header claims 2^62 or 2^40
// bytes (94 bytes on disk) is refused with POLICY_BUNDLE_LOAD, at start and on reload, with
// and without a verification key; the active policy stays.
func TestFileBundleWithLyingHeaderRefused(t *testing.T) {
	a, _ := policytest.Keys(t)
	for _, claim := range []struct {
		name string
		size int64
	}{{"2^62", 1 << 62}, {"2^40", 1 << 40}} {
		for _, signed := range []bool{false, true} {
			name := claim.name + "/unsigned source"
			if signed {
				name = claim.name + "/verifying source"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "bundle.tar.gz")
				cfg := Config{Bundle: path}
				spec := policytest.BundleSpec{Revision: "good"}
				if signed {
					cfg.VerificationKey = testutil.WriteFile(t, dir, "key.pem", a.Public)
					spec.Sign = policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID}
				}
				lying := policytest.LyingBundle(t, claim.size)
				t.Logf("crafted bundle: %d bytes, header claims %d", len(lying), claim.size)

				// At start: refused, no policy.
				require.NoError(t, os.WriteFile(path, lying, 0o600))
				eng := decision.NewEmpty(decision.Options{})
				src, err := New(cfg, eng, Options{})
				require.NoError(t, err)
				err = src.Start(t.Context())
				requireBundleLoadError(t, err, "data.json")
				assert.Empty(t, eng.Revision())
				src.Close(t.Context())

				// On reload (SIGHUP, --watch): refused, the active policy stays.
				require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, spec), 0o600))
				eng = decision.NewEmpty(decision.Options{})
				src, err = New(cfg, eng, Options{})
				require.NoError(t, err)
				require.NoError(t, src.Start(t.Context()))
				defer src.Close(t.Context())
				require.NoError(t, os.WriteFile(path, lying, 0o600))
				requireBundleLoadError(t, src.Reload(t.Context()), "data.json")
				assert.Equal(t, "good", decideRevision(t, eng))
				assert.Contains(t, src.Status().LastError, "data.json")
			})
		}
	}
}

func requireBundleLoadError(t *testing.T, err error, want string) {
	t.Helper()
	require.Error(t, err)
	t.Logf("refused: %v", err)
	var ce *coded.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, coded.PolicyBundleLoad, ce.Code)
	assert.Contains(t, err.Error(), want)
}
