package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// lyingClaims are the header claims of the 94-byte bundles that once took the service down:
// 2^62 bytes (a panic in OPA's tarball loader) and 2^40 (the runtime out of memory).
var lyingClaims = []struct {
	name  string
	claim int64
}{{"2^62", 1 << 62}, {"2^40", 1 << 40}}

// TestDecideRefusesBundleWithLyingHeader: `authz decide --bundle` with a bundle whose tar
// header claims 2^62 or 2^40 bytes exits 2 naming the entry and the bound, with and without a
// verification key.
func TestDecideRefusesBundleWithLyingHeader(t *testing.T) {
	a, _ := policytest.Keys(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	pub := testutil.WriteFile(t, dir, "key.pem", a.Public)
	for _, c := range lyingClaims {
		path := filepath.Join(dir, "lying-"+c.name+".tar.gz")
		require.NoError(t, os.WriteFile(path, policytest.LyingBundle(t, c.claim), 0o600))
		for _, args := range [][]string{{"--bundle", path}, {"--bundle", path, "--verification-key", pub}} {
			t.Run(c.name+" "+strings.Join(args[2:], " "), func(t *testing.T) {
				var out, errb strings.Builder
				err := run(t.Context(), append([]string{"decide", "--facts", facts}, args...), strings.NewReader(specRequest), &out, &errb)
				var ee *exitError
				require.ErrorAs(t, err, &ee)
				assert.Equal(t, 2, ee.code)
				assert.Contains(t, ee.Error(), "authz/lying/data.json: its header announces")
				assert.Contains(t, ee.Error(), "beyond the bounds of a bundle")
				assert.Empty(t, out.String())
			})
		}
	}
}

// TestServeRefusesBundleWithLyingHeader: `authz serve --bundle --watch --verification-key`
// whose bundle file is replaced by one whose header claims 2^62, then 2^40 bytes, reloaded
// by the watch and by SIGHUP: each is refused, the service stays up and keeps deciding with
// the revision it had.
func TestServeRefusesBundleWithLyingHeader(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	a, _ := policytest.Keys(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	pub := testutil.WriteFile(t, dir, "key.pem", a.Public)
	path := filepath.Join(dir, "bundle.tar.gz")
	require.NoError(t, os.WriteFile(path, policytest.MakeBundle(t, policytest.BundleSpec{Revision: "signed-1",
		Sign: policytest.Signing{Key: a.Private, KeyID: "default"}}), 0o600))
	p := startServeProcess(t, "", "--bundle", path, "--watch", "--verification-key", pub, "--facts", facts, "--addr", "127.0.0.1:0")
	c := &http.Client{Timeout: 15 * time.Second}
	defer c.CloseIdleConnections()
	revision := func() string {
		status, doc := testutil.PostJSON(t, c, "http://"+p.addr+"/v1/authorize", specRequest)
		require.Equal(t, http.StatusOK, status, "%v", doc)
		return doc["revision"].(string)
	}
	require.Equal(t, "signed-1", revision())

	refusals := 0
	refused := func(how string) {
		refusals++
		require.Eventually(t, func() bool {
			return strings.Count(p.Stderr.String(), "its header announces") >= refusals
		}, 20*time.Second, 20*time.Millisecond, "refused on %s; stderr:\n%s", how, p.Stderr)
		require.True(t, p.Alive(), "the service survived the bundle (%s)", how)
		assert.Equal(t, "signed-1", revision())
	}
	for _, cl := range lyingClaims {
		require.NoError(t, os.WriteFile(path, policytest.LyingBundle(t, cl.claim), 0o600))
		refused(cl.name + " read by the watch")
		p.Signal(t, syscall.SIGHUP)
		refused(cl.name + " read on SIGHUP")
	}
	_, st := testutil.GetJSON(t, c, "http://"+p.addr+"/v1/status")
	assert.Contains(t, st["last_error"], "beyond the bounds of a bundle")

	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 30*time.Second))
}
