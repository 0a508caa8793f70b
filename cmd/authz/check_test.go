package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestCheckGoodConfiguration: the example configurations, of authz serve and of authz run's
// plugins.authz section, check clean: exit status 0 and what was checked.
func TestCheckGoodConfiguration(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCLI(t, "", "check", "--config", "../../examples/config.yaml")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "config.yaml: ok")
	assert.Contains(t, out, "plugins: 1 pinned binaries match their sha256 (none started)")
	assert.Contains(t, out, "policy: sha256:")

	code, out, errOut = runCLI(t, "", "check", "--opa-config", "../../examples/opa.yaml")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "opa.yaml: ok")
}

// TestCheckNamesEveryProblem: every kind of problem is reported at once, each with its field
// and the line of the file that holds it: a value the validation refuses, a pin that does not
// match its binary, a binary that is missing, TLS and tokens files that cannot be read, a
// decision log that cannot be written, a facts file, a policy bundle that does not verify, and
// in an OPA configuration a field of plugins.authz.
func TestCheckNamesEveryProblem(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	drv := testutil.WriteFile(t, dir, "drv", "#!/bin/sh\nexit 0\n")
	require.NoError(t, os.Chmod(drv, 0o755))
	zero := strings.Repeat("0", 64)
	cfg := testutil.WriteFile(t, dir, "bad.yaml", fmt.Sprintf(`addr: 127.0.0.1:8181
decisionCache: maybe
plugins:
  - id: acme.one
    path: %[1]s
    key: acme.one
    sha256: %[2]s
  - id: acme.two
    path: %[3]s/missing
    key: acme.two
    sha256: %[2]s
tls:
  cert: %[3]s/cert.pem
  key: %[3]s/key.pem
authentication:
  mode: token
  tokensFile: %[3]s/tokens
decisionLog:
  path: %[3]s/no/such/dir/decisions.log
`, drv, zero, dir))
	code, _, errOut := runCLI(t, "", "check", "--config", cfg)
	require.Equal(t, 2, code, errOut)
	for _, want := range []string{
		`decisionCache (line 2): must be on or off, got "maybe"`,
		"plugins[0].sha256 (line 7): does not match " + drv,
		"PIN_MISMATCH",
		"plugins[1].path (line 9): " + dir + "/missing",
		"tls.cert (line 13): load the certificate",
		"authentication.tokensFile (line 17): " + dir + "/tokens",
		"decisionLog.path (line 19): " + dir + "/no/such/dir/decisions.log: cannot be created",
	} {
		assert.Contains(t, errOut, want)
	}
	assert.Contains(t, errOut, "6 problem(s)")

	// The policy: a bundle that is not signed with the verification key given.
	bundle := filepath.Join(dir, "bundle")
	copyPolicy(t, bundle)
	a, _ := policytest.Keys(t)
	pub := testutil.WriteFile(t, dir, "public.pem", a.Public)
	good := testutil.WriteFile(t, dir, "good.yaml", "plugins: []\nbundle: "+bundle+"\nverificationKey: "+pub+"\n")
	code, _, errOut = runCLI(t, "", "check", "--config", good)
	require.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, "bundle (line 2): ")
	assert.Contains(t, errOut, ".signatures.json")

	// A facts file that does not parse.
	facts := testutil.WriteFile(t, dir, "facts.json", `{"plugins": null}`)
	code, _, errOut = runCLI(t, "", "check", "--facts", facts)
	require.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, "facts: "+facts)

	// authz run's section of an OPA configuration: fields below plugins.authz, with their lines.
	opa := testutil.WriteFile(t, dir, "opa.yaml", "services: {}\nplugins:\n  authz:\n    addr: localhost\n    decisionCache: maybe\n")
	code, _, errOut = runCLI(t, "", "check", "--opa-config", opa)
	require.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, "plugins.authz.addr (line 4): ")
	assert.Contains(t, errOut, `plugins.authz.decisionCache (line 5): must be on or off, got "maybe"`)
}

// TestCheckStartsAndBindsNothing: check hashes a plugin's binary but never runs it, and never
// binds the configured address (here one another process holds, and a unix socket path).
func TestCheckStartsAndBindsNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	drv := testutil.WriteFile(t, dir, "drv", "#!/bin/sh\ntouch "+marker+"\n")
	require.NoError(t, os.Chmod(drv, 0o755))
	sum, err := pluginhost.FileSHA256(drv)
	require.NoError(t, err)
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { held.Close() })
	cfg := testutil.WriteFile(t, dir, "config.yaml", fmt.Sprintf("addr: %s\nplugins:\n  - id: acme.one\n    path: %s\n    key: acme.one\n    sha256: %s\n",
		held.Addr(), drv, sum))
	code, out, errOut := runCLI(t, "", "check", "--config", cfg)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "plugins: 1 pinned binaries match their sha256 (none started)")
	assert.Contains(t, out, "addr: "+held.Addr().String()+" (not bound by check)")
	assert.NoFileExists(t, marker, "the driver was started")

	sock := filepath.Join(dir, "authz.sock")
	code, _, errOut = runCLI(t, "", "check", "--config", cfg, "--addr", "unix://"+sock)
	require.Equal(t, 0, code, errOut)
	assert.NoFileExists(t, sock, "the socket was bound")
	assert.NoFileExists(t, marker, "the driver was started")
}

// TestCheckFetch: remote bundles are validated but not downloaded without --fetch; with it a
// signed bundle is downloaded, verified and compiled (exit 0), and a tampered one is a
// problem of its bundle (exit 2).
func TestCheckFetch(t *testing.T) {
	t.Parallel()
	a, _ := policytest.Keys(t)
	srv := policytest.NewBundleServer(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	cfg := remoteServeConfig(t, dir, srv.URL, a.Public)

	code, out, errOut := runCLI(t, "", "check", "--config", cfg, "--facts", facts)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "remote bundles under opa: validated, not fetched")

	good := policytest.Signing{Key: a.Private, KeyID: "default"}
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "v1", Sign: good}))
	code, out, errOut = runCLI(t, "", "check", "--config", cfg, "--facts", facts, "--fetch")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "policy: v1 (remote:authz), compiled and its signature verified")

	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "tampered", Sign: good,
		Tamper: map[string]string{"authz/decision.rego": "package authz\n\ndecision := {\"allow\": true}\n"}}))
	code, _, errOut = runCLI(t, "", "check", "--config", cfg, "--facts", facts, "--fetch")
	require.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, "opa.bundles.authz")
}
