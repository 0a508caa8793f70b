package server_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

// TestServerReloadReopensDecisionLog is the rotation that signals (SIGHUP calls Reload): the
// file is renamed, Reload opens a new one, and nothing is lost or written twice.
func TestServerReloadReopensDecisionLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.log")
	s := newServer(t, withConfig(func(c *server.Config) { c.DecisionLog.Path = path; c.DecisionLog.Required = true }))
	base := startHTTP(t, s)
	first := decideOK(t, base)
	require.NoError(t, os.Rename(path, path+".1"))
	require.NoError(t, s.Reload())
	_, err := os.Stat(path)
	require.NoError(t, err, "Reload created the new file")
	second := decideOK(t, base)
	assert.Equal(t, []string{first}, logIDs(t, path+".1"))
	assert.Equal(t, []string{second}, logIDs(t, path))

	// A path that cannot be reopened safely keeps the previous file, and says so.
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.Symlink(path+".1", path))
	assert.ErrorContains(t, s.Reload(), "symbolic link")
}
