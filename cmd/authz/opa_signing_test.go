package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/policy/policytest"
	"github.com/authz-dev/authz/internal/testutil"
)

// pemKeyYAML is a keys entry of an OPA configuration for the public key pub.
func pemKeyYAML(name, pub string) string {
	return "  " + name + ":\n    algorithm: RS256\n    key: |\n      " + strings.ReplaceAll(strings.TrimSpace(pub), "\n", "\n      ") + "\n"
}

// TestRunRefusesUnboundBundleKeys: `authz run` holds OPA's keys and bundles sections to the
// rule `authz serve` holds its opa section to: with two keys, a bundle whose signing block
// names no key (either key could sign it), and with a key, a bundle without a signing block
// (OPA would activate it unsigned), stop the start (exit status 1) with the message of authz
// serve, before anything is served.
func TestRunRefusesUnboundBundleKeys(t *testing.T) {
	a, b := policytest.Keys(t)
	bin := runBinary(t)
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	head := "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: " + facts + "\n" +
		"services:\n  bundles:\n    url: http://127.0.0.1:1\n"
	for _, tt := range []struct {
		name, keys, signing, want string
	}{
		{name: "two keys, signing names none", keys: pemKeyYAML("release", a.Public) + pemKeyYAML("other", b.Public), signing: "    signing: {}\n",
			want: "bundles.authz.signing: 2 keys are configured, so this bundle must name the one key that signs it"},
		{name: "a key, no signing block", keys: pemKeyYAML("release", a.Public),
			want: "bundles.authz: keys are configured but this bundle has no signing block, so OPA would accept it unsigned"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := head + "keys:\n" + tt.keys + "bundles:\n  authz:\n    service: bundles\n    resource: /authz.tar.gz\n" + tt.signing
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "run", "--server", "--addr", "127.0.0.1:0",
				"--config-file", testutil.WriteFile(t, t.TempDir(), "opa.yaml", cfg))
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "output:\n%s", out)
			assert.Equal(t, 1, ee.ExitCode(), "output:\n%s", out)
			assert.Contains(t, string(out), tt.want)
			assert.NotContains(t, string(out), "Initializing server", "nothing served")
		})
	}
}

// TestRunReloadsOnSIGHUP: SIGHUP to `authz run` does not end it: the gate reads its tokens
// file again (a token removed from it stops working, one kept still works), reopens its
// decision log at its path (rotation by renaming), logs what it reloaded, and keeps serving
// until SIGTERM.
func TestRunReloadsOnSIGHUP(t *testing.T) {
	const kept, revoked = "0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210"
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	tokens := testutil.WriteFile(t, dir, "tokens", kept+" decide\n"+revoked+" decide\n")
	require.NoError(t, os.Chmod(tokens, 0o600))
	logPath := filepath.Join(dir, "decisions.log")
	cfgPath := testutil.WriteFile(t, dir, "opa.yaml", "plugins:\n  authz:\n    addr: 127.0.0.1:0\n    facts: "+facts+"\n"+
		"    authentication:\n      mode: token\n      tokensFile: "+tokens+"\n"+
		"    decisionLog: {path: "+logPath+", required: true}\n")
	ar := startRun(t, "--server", "--addr", freeLoopbackAddr(t), "--config-file", cfgPath)
	gate := "http://" + waitListening(t, ar.Stderr)
	c := &http.Client{Timeout: 10 * time.Second}
	decide := func(token string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, gate+"/v1/authorize", strings.NewReader(specRequest))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	policytest.WaitFor(t, "the gate to decide", 60*time.Second, func() bool { return decide(revoked) == http.StatusOK })

	testutil.WriteFile(t, dir, "tokens", kept+" decide\n")
	require.NoError(t, os.Chmod(tokens, 0o600))
	require.NoError(t, os.Rename(logPath, logPath+".1"))
	ar.Signal(t, syscall.SIGHUP)
	testutil.WaitLogged(t, ar.Stderr, regexp.MustCompile(`(reload: bearer tokens re-read)`), 10*time.Second)
	require.True(t, ar.Alive(), "SIGHUP ended authz run; stderr:\n%s", ar.Stderr)
	assert.Contains(t, ar.Stderr.String(), "reload: SIGHUP received", "the gate logs what the signal did")
	assert.Equal(t, http.StatusUnauthorized, decide(revoked), "a token removed from the tokens file is refused after SIGHUP")
	assert.Equal(t, http.StatusOK, decide(kept))
	assert.NotEmpty(t, decisionIDs(t, logPath+".1"), "the decisions before the signal are in the renamed file")
	assert.Len(t, decisionIDs(t, logPath), 1, "the decision after the signal is in the reopened file")
	c.CloseIdleConnections()

	ar.Signal(t, syscall.SIGTERM)
	assert.NoError(t, ar.WaitExit(t, 30*time.Second), "exit status after SIGTERM")
}

// TestRunRefusesWatchWithVerificationKey: OPA's file watcher re-reads a bundle file without
// verifying its signature, so `authz run --bundle FILE --verification-key KEY --watch` would
// adopt an unsigned or older bundle on the next save: it is refused at start, serving nothing.
func TestRunRefusesWatchWithVerificationKey(t *testing.T) {
	a, _ := policytest.Keys(t)
	bin := runBinary(t)
	dir := t.TempDir()
	pub := testutil.WriteFile(t, dir, "key.pub", a.Public)
	bundleDir := filepath.Join(dir, "bundle")
	require.NoError(t, os.Mkdir(bundleDir, 0o700))
	for _, watch := range []string{"--watch", "-w"} {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		out, err := exec.CommandContext(ctx, bin, "run", "--server", "--addr", "127.0.0.1:0",
			"--bundle", bundleDir, "--verification-key", pub, watch).CombinedOutput()
		cancel()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "output:\n%s", out)
		assert.Equal(t, 1, ee.ExitCode(), "output:\n%s", out)
		assert.Contains(t, string(out), "--watch with --verification-key is refused")
		assert.NotContains(t, string(out), "Initializing server", "nothing served")
	}
}

// TestSignedBundleWithoutKeyIDSaysWhatToDo: `opa build --signing-key --claims-file` writes no
// "kid" header and its claims file replaces the claims, keyid included, so a bundle signed that
// way names no key unless the claims file does. authz
// refuses it, and its message names the key id to add and where (the docs' recipe adds it);
// with the keyid in the claims the same bundle is accepted.
func TestSignedBundleWithoutKeyIDSaysWhatToDo(t *testing.T) {
	t.Parallel()
	a, _ := policytest.Keys(t)
	dir := t.TempDir()
	pub := testutil.WriteFile(t, dir, "public.pem", a.Public)
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	noKeyID := testutil.WriteFile(t, dir, "no-keyid.tar.gz", string(policytest.MakeBundle(t, policytest.BundleSpec{
		Revision: "v42", Sign: policytest.Signing{Key: a.Private, IssuedAt: time.Now().Unix()}})))
	code, _, errOut := runCLI(t, specRequest, "decide", "--facts", facts, "--bundle", noKeyID,
		"--verification-key", pub, "--verification-key-id", "release")
	assert.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, "verification key ID is empty")
	assert.Contains(t, errOut, `it must name release: add "keyid": "release" to the claims file of `+"`opa build --claims-file`")

	withKeyID := testutil.WriteFile(t, dir, "keyid.tar.gz", string(policytest.MakeBundle(t, policytest.BundleSpec{
		Revision: "v42", Sign: policytest.Signing{Key: a.Private, IssuedAt: time.Now().Unix(), Claims: map[string]any{"keyid": "release"}}})))
	code, out, errOut := runCLI(t, specRequest, "decide", "--facts", facts, "--bundle", withKeyID,
		"--verification-key", pub, "--verification-key-id", "release")
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"allow"`)
}
