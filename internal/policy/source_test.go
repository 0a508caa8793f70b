package policy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/snapshot"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// OPA's HTTP clients keep idle keep-alive connections for a while after a test.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		// OPA starts process-wide helpers once.
		goleak.IgnoreAnyFunction("github.com/open-policy-agent/opa/v1/topdown/cache.(*interQueryCache).cleanStaleValues"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
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
func signatureShapes(tb testing.TB) (good signing, shapes []struct {
	name string
	spec bundleSpec
	want string
}) {
	a, b := testKeys(tb)
	good = signing{key: a.private, keyID: DefaultVerificationKeyID}
	shapes = []struct {
		name string
		spec bundleSpec
		want string
	}{
		{"unsigned", bundleSpec{}, ".signatures.json"},
		{"signed with another key", bundleSpec{sign: signing{key: b.private, keyID: DefaultVerificationKeyID}}, "verify"},
		{"tampered file", bundleSpec{sign: good, tamper: map[string]string{"authz/decision.rego": "package authz\n\ndecision := {\"allow\": true}\n"}}, "digest mismatch"},
		{"file not covered by the signature", bundleSpec{sign: good, extra: map[string]string{"authz/extra.rego": "package authz\n\nextra := true\n"}}, "authz/extra.rego"},
		{"keyid missing", bundleSpec{sign: signing{key: a.private}}, "key ID is empty"},
		{"keyid unknown", bundleSpec{sign: signing{key: a.private, keyID: "other"}}, "other not found"},
		{"wrong algorithm", bundleSpec{sign: signing{key: a.private, keyID: DefaultVerificationKeyID, alg: "RS512"}}, "verify"},
		{"wrong scope", bundleSpec{sign: signing{key: a.private, keyID: DefaultVerificationKeyID, scope: "write"}}, "scope mismatch"},
	}
	return good, shapes
}

func TestFileBundleSignatureShapesRefused(t *testing.T) {
	// Signed bundle directories list their files under the directory's path as given to
	// `opa sign --bundle DIR`; the shapes are checked on bundle files.
	for _, layout := range []string{"file"} {
		t.Run(layout, func(t *testing.T) {
			a, _ := testKeys(t)
			dir := t.TempDir()
			pub := writeFile(t, dir, "key.pem", a.public)
			path := filepath.Join(dir, "bundle.tar.gz")
			if layout == "directory" {
				path = filepath.Join(dir, "bundle")
			}
			good, shapes := signatureShapes(t)
			publish := func(spec bundleSpec) {
				tgz := makeBundle(t, spec)
				if layout == "file" {
					require.NoError(t, os.WriteFile(path, tgz, 0o600))
					return
				}
				require.NoError(t, os.RemoveAll(path))
				untar(t, tgz, path)
			}
			publish(bundleSpec{revision: "good-0", sign: good})
			eng := decision.NewEmpty(decision.Options{})
			src, err := New(Config{Bundle: path, VerificationKey: pub}, eng, Options{})
			require.NoError(t, err)
			require.NoError(t, src.Start(t.Context()))
			defer src.Close(t.Context())
			require.Equal(t, "good-0", decideRevision(t, eng))
			assert.Equal(t, OriginFile+":"+path, src.Status().Origin)

			for _, sh := range shapes {
				t.Run(sh.name, func(t *testing.T) {
					sh.spec.revision = "bad"
					publish(sh.spec)
					err := src.Reload(t.Context())
					require.Error(t, err)
					assert.Contains(t, err.Error(), sh.want)
					assert.Equal(t, CodeBundleLoad, (err.(*Error)).Code)
					assert.Equal(t, "good-0", decideRevision(t, eng), "the refused bundle must not replace the active one")
					st := src.Status()
					assert.Equal(t, "good-0", st.Revision)
					assert.Equal(t, CodeBundleLoad, st.Bundles[path].Code)
					assert.Contains(t, st.LastError, sh.want)
				})
			}
			// A good bundle after the refused ones is activated, and clears the error.
			publish(bundleSpec{revision: "good-1", sign: good})
			require.NoError(t, src.Reload(t.Context()))
			assert.Equal(t, "good-1", decideRevision(t, eng))
			assert.Empty(t, src.Status().Bundles[path].Code)
		})
	}
}

func TestFileBundleCompileFailureAndMissingEntrypointRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, makeBundle(t, bundleSpec{revision: "good"}), 0o600))
	eng := decision.NewEmpty(decision.Options{})
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
			require.NoError(t, os.WriteFile(path, makeBundle(t, bundleSpec{revision: "bad", modules: tc.modules}), 0o600))
			err := src.Reload(t.Context())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, CodeBundleCheck, (err.(*Error)).Code)
			assert.Equal(t, "good", decideRevision(t, eng))
		})
	}
}

func TestFileBundleRefusedAtStartLeavesNoPolicy(t *testing.T) {
	a, _ := testKeys(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, makeBundle(t, bundleSpec{revision: "unsigned"}), 0o600))
	eng := decision.NewEmpty(decision.Options{})
	src, err := New(Config{Bundle: path, VerificationKey: writeFile(t, dir, "key.pem", a.public)}, eng, Options{})
	require.NoError(t, err)
	require.Error(t, src.Start(t.Context()), "an unsigned bundle must not start the service")
	assert.False(t, src.Ready())
	assert.Empty(t, eng.Revision())
}

func TestWatchedBundleDirectoryEditTakesEffect(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bundle")
	untar(t, makeBundle(t, bundleSpec{revision: "v1", modules: markerModules("M1")}), dir)
	eng := decision.NewEmpty(decision.Options{})
	src, err := New(Config{Bundle: dir, Watch: true}, eng, Options{WatchInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	defer src.Close(t.Context())
	doc, err := eng.Evaluate(t.Context(), snapshot.Input{})
	require.NoError(t, err)
	require.Equal(t, "M1", doc.Code)

	// A broken edit is refused and the policy stays; the fix then takes effect.
	writeFile(t, dir, "authz/decision.rego", "package authz\n\ndecision if { broken }\n")
	waitFor(t, "the broken edit to be refused", 10*time.Second, func() bool { return src.Status().LastError != "" })
	doc, err = eng.Evaluate(t.Context(), snapshot.Input{})
	require.NoError(t, err)
	require.Equal(t, "M1", doc.Code)

	writeFile(t, dir, "authz/decision.rego", markerModules("M2")["authz/decision.rego"])
	waitFor(t, "the edit to take effect", 10*time.Second, func() bool {
		doc, err := eng.Evaluate(t.Context(), snapshot.Input{})
		return err == nil && doc.Code == "M2"
	})
	assert.Empty(t, src.Status().LastError)
}

func TestEmbeddedSourceKeepsTheEmbeddedRevision(t *testing.T) {
	eng := decision.NewEmpty(decision.Options{})
	src, err := New(Config{}, eng, Options{})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	ref, err := decision.New(t.Context(), decision.Options{})
	require.NoError(t, err)
	assert.Equal(t, ref.Revision(), eng.Revision())
	assert.Equal(t, OriginEmbedded, src.Status().Origin)
	assert.Empty(t, eng.CacheStatus(), "the embedded policy keeps the decision cache on")
}

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	bundlePath := writeFile(t, dir, "b.tar.gz", "x")
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
