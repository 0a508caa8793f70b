package service

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestReloadLogsThePolicy: a reload (SIGHUP) says what it did to the policy, in one line with
// the revision before and after, as it does for the decision log and the plugins.
func TestReloadLogsThePolicy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join("..", "..", "policies")
	require.NoError(t, filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rego") {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(rel)), 0o755))
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	}))
	cfg := DefaultConfig()
	cfg.Host.Plugins = []pluginhost.PluginConfig{}
	cfg.Policy.Bundle = dir
	log := &testutil.SyncBuffer{}
	g, _, _ := servedGate(t, cfg, log)
	t.Cleanup(g.Close)
	before := g.policy.Status().Revision
	require.NotEmpty(t, before)

	// The same bundle: reloaded, unchanged.
	g.reloadPolicy(t.Context())
	assert.Contains(t, log.String(), "reload: policy: revision="+before+" previous_revision="+before+" changed=false")

	// A changed bundle: the new revision.
	f := filepath.Join(dir, "authz", "decision.rego")
	b, err := os.ReadFile(f)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f, append(b, "\n# changed\n"...), 0o644))
	g.reloadPolicy(t.Context())
	after := g.policy.Status().Revision
	require.NotEqual(t, before, after)
	assert.Contains(t, log.String(), "reload: policy: revision="+after+" previous_revision="+before+" changed=true")
}
