package policy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// decideRevision evaluates one decision and returns the revision that made it.
func decideRevision(tb testing.TB, eng *decision.Engine) string {
	tb.Helper()
	doc, err := eng.Evaluate(context.Background(), snapshot.Input{"operation": "openDuplexChannel"})
	require.NoError(tb, err)
	return doc.Revision
}

// signatureShapes are the bundles a verifying source must refuse, each with the reason OPA
// gives. good is how a valid bundle is signed.
func signatureShapes(tb testing.TB) (good policytest.Signing, shapes []struct {
	name string
	spec policytest.BundleSpec
	want string
}) {
	a, b := policytest.Keys(tb)
	good = policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID}
	shapes = []struct {
		name string
		spec policytest.BundleSpec
		want string
	}{
		{"unsigned", policytest.BundleSpec{}, ".signatures.json"},
		{"signed with another key", policytest.BundleSpec{Sign: policytest.Signing{Key: b.Private, KeyID: DefaultVerificationKeyID}}, "verify"},
		{"tampered file", policytest.BundleSpec{Sign: good, Tamper: map[string]string{"authz/decision.rego": "package authz\n\ndecision := {\"allow\": true}\n"}}, "digest mismatch"},
		{"file not covered by the signature", policytest.BundleSpec{Sign: good, Extra: map[string]string{"authz/extra.rego": "package authz\n\nextra := true\n"}}, "authz/extra.rego"},
		{"keyid missing", policytest.BundleSpec{Sign: policytest.Signing{Key: a.Private}}, "key ID is empty"},
		{"keyid unknown", policytest.BundleSpec{Sign: policytest.Signing{Key: a.Private, KeyID: "other"}}, "other not found"},
		{"wrong algorithm", policytest.BundleSpec{Sign: policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID, Alg: "RS512"}}, "verify"},
		{"wrong scope", policytest.BundleSpec{Sign: policytest.Signing{Key: a.Private, KeyID: DefaultVerificationKeyID, Scope: "write"}}, "scope mismatch"},
	}
	return good, shapes
}

func TestFileBundleSignatureShapesRefused(t *testing.T) {
	for _, layout := range []string{"file", "directory"} {
		t.Run(layout, func(t *testing.T) {
			a, _ := policytest.Keys(t)
			dir := t.TempDir()
			pub := testutil.WriteFile(t, dir, "key.pem", a.Public)
			path := filepath.Join(dir, "bundle.tar.gz")
			if layout == "directory" {
				path = filepath.Join(dir, "bundle")
			}
			good, shapes := signatureShapes(t)
			publish := func(spec policytest.BundleSpec) {
				if layout == "file" {
					require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, spec), 0o600))
					return
				}
				policytest.WriteBundleDir(t, path, spec)
			}
			publish(policytest.BundleSpec{Revision: "good-0", Sign: good})
			eng := decision.New(decision.Options{})
			src, err := New(Config{Bundle: path, VerificationKey: pub}, eng, Options{})
			require.NoError(t, err)
			require.NoError(t, src.Start(t.Context()))
			defer src.Close(t.Context())
			require.Equal(t, "good-0", decideRevision(t, eng))
			assert.Equal(t, OriginFile+":"+path, src.Status().Origin)

			for _, sh := range shapes {
				t.Run(sh.name, func(t *testing.T) {
					sh.spec.Revision = "bad"
					publish(sh.spec)
					err := src.Reload(t.Context())
					require.Error(t, err)
					assert.Contains(t, err.Error(), sh.want)
					var pe *coded.Error
					require.ErrorAs(t, err, &pe)
					assert.Equal(t, coded.PolicyBundleLoad, pe.Code)
					assert.Equal(t, "good-0", decideRevision(t, eng), "the refused bundle must not replace the active one")
					st := src.Status()
					assert.Equal(t, "good-0", st.Revision)
					assert.Equal(t, string(coded.PolicyBundleLoad), st.Bundles[path].Code)
					assert.Contains(t, st.LastError, sh.want)
				})
			}
			// A good bundle after the refused ones is activated, and clears the error.
			publish(policytest.BundleSpec{Revision: "good-1", Sign: good})
			require.NoError(t, src.Reload(t.Context()))
			assert.Equal(t, "good-1", decideRevision(t, eng))
			assert.Empty(t, src.Status().Bundles[path].Code)
		})
	}
}

func TestFileBundleCompileFailureAndMissingEntrypointRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "good"}), 0o600))
	eng := decision.New(decision.Options{})
	src, err := New(Config{Bundle: path}, eng, Options{})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	defer src.Close(t.Context())
	for _, tc := range []struct {
		name    string
		modules map[string]string
		want    string
	}{
		{"compile failure", map[string]string{"authz/decision.rego": "package authz\n\ndecision if { undefined_var }\n"}, "unsafe"},
		{"missing entrypoint", map[string]string{"authz/decision.rego": "package authz\n\nsomething := true\n"}, "does not define data.authz.decision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "bad", Modules: tc.modules}), 0o600))
			err := src.Reload(t.Context())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			var pe *coded.Error
			require.ErrorAs(t, err, &pe)
			assert.Equal(t, coded.PolicyBundleCheck, pe.Code)
			assert.Equal(t, "good", decideRevision(t, eng))
		})
	}
}

func TestFileBundleRefusedAtStartLeavesNoPolicy(t *testing.T) {
	a, _ := policytest.Keys(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "unsigned"}), 0o600))
	eng := decision.New(decision.Options{})
	src, err := New(Config{Bundle: path, VerificationKey: testutil.WriteFile(t, dir, "key.pem", a.Public)}, eng, Options{})
	require.NoError(t, err)
	require.Error(t, src.Start(t.Context()), "an unsigned bundle must not start the service")
	assert.False(t, src.Ready())
	assert.Empty(t, eng.Revision())
}

func TestWatchedBundleDirectoryEditTakesEffect(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bundle")
	policytest.Untar(t, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "v1", Modules: policytest.MarkerModules("M1")}), dir)
	eng := decision.New(decision.Options{})
	src, err := New(Config{Bundle: dir, Watch: true}, eng, Options{WatchInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	defer src.Close(t.Context())
	doc, err := eng.Evaluate(t.Context(), snapshot.Input{})
	require.NoError(t, err)
	require.Equal(t, "M1", doc.Code)

	// A broken edit is refused and the policy stays; the fix then takes effect.
	testutil.WriteFile(t, dir, "authz/decision.rego", "package authz\n\ndecision if { broken }\n")
	policytest.WaitFor(t, "the broken edit to be refused", 10*time.Second, func() bool { return src.Status().LastError != "" })
	doc, err = eng.Evaluate(t.Context(), snapshot.Input{})
	require.NoError(t, err)
	require.Equal(t, "M1", doc.Code)

	testutil.WriteFile(t, dir, "authz/decision.rego", policytest.MarkerModules("M2")["authz/decision.rego"])
	policytest.WaitFor(t, "the edit to take effect", 10*time.Second, func() bool {
		doc, err := eng.Evaluate(t.Context(), snapshot.Input{})
		return err == nil && doc.Code == "M2"
	})
	assert.Empty(t, src.Status().LastError)
}

func TestEmbeddedSourceKeepsTheEmbeddedRevision(t *testing.T) {
	eng := decision.New(decision.Options{})
	src, err := New(Config{}, eng, Options{})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	ref := decisiontest.EmbeddedEngine(t, decision.Options{})
	assert.Equal(t, ref.Revision(), eng.Revision())
	assert.Equal(t, OriginEmbedded, src.Status().Origin)
	assert.Empty(t, eng.CacheStatus(), "the embedded policy keeps the decision cache on")
}

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	bundlePath := testutil.WriteFile(t, dir, "b.tar.gz", "x")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" when valid
	}{
		{"embedded", Config{}, ""},
		{"bundle", Config{Bundle: bundlePath}, ""},
		{"two sources", Config{Bundle: bundlePath, OPA: map[string]any{"bundles": map[string]any{"a": map[string]any{"resource": "x"}}}}, "one source at a time"},
		{"missing bundle", Config{Bundle: filepath.Join(dir, "nope")}, "bundle: "},
		{"watch without bundle", Config{Watch: true}, "watch: applies to a bundle"},
		{"key id without key", Config{Bundle: bundlePath, VerificationKeyID: "k"}, "verificationKeyId: needs verificationKey"},
		{"bad alg", Config{Bundle: bundlePath, VerificationKey: bundlePath, SigningAlg: "XX1"}, "signingAlg"},
		{"no bundle named", Config{OPA: map[string]any{"bundles": map[string]any{}}}, "bundles: name at least one bundle"},
		{"decision logs only", Config{OPA: map[string]any{
			"services":      map[string]any{"s": map[string]any{"url": "http://127.0.0.1:1"}},
			"decision_logs": map[string]any{"service": "s"},
		}}, ""},
		{"keys without signing", Config{OPA: map[string]any{
			"services": map[string]any{"s": map[string]any{"url": "http://127.0.0.1:1"}},
			"keys":     map[string]any{"k": map[string]any{"key": "secret", "algorithm": "HS256"}},
			"bundles":  map[string]any{"authz": map[string]any{"service": "s", "resource": "b.tar.gz"}},
		}}, "bundles.authz: keys are configured but this bundle has no signing block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestActivationLogSaysWhetherTheCacheIsOn: the activation line reports the engine's cache, not
// only whether the policy could be cached: with the cache turned off it says so.
func TestActivationLogSaysWhetherTheCacheIsOn(t *testing.T) {
	for _, tc := range []struct {
		opts decision.Options
		want string
	}{
		{opts: decision.Options{}, want: "cache=on"},
		{opts: decision.Options{Cache: decision.CacheOptions{Disabled: true}}, want: `cache="off: the decision cache is turned off"`},
	} {
		out := &testutil.SyncBuffer{}
		eng := decision.New(tc.opts)
		src, err := New(Config{}, eng, Options{Logger: hclog.New(&hclog.LoggerOptions{Output: out})})
		require.NoError(t, err)
		require.NoError(t, src.Start(t.Context()))
		src.Close(t.Context())
		assert.Contains(t, out.String(), tc.want)
	}
}
