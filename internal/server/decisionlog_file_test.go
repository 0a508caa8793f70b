package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
)

// fileLogServer serves a server whose required decision log is the file at path.
func fileLogServer(t testing.TB, path string) string {
	t.Helper()
	s := newServer(t, withConfig(func(c *server.Config) {
		c.DecisionLog.Path = path
		c.DecisionLog.Required = true
	}))
	return startHTTP(t, s)
}

// decideOK makes one decision that must be answered 200 and returns its decision_id.
func decideOK(t testing.TB, base string) string {
	t.Helper()
	a := post(t, base+"/v1/authorize", fixture(t, nil))
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	return a.json(t)["decision_id"].(string)
}

// logIDs reads the decision_id of every line of a decision log file; every line must be a
// whole JSON object ending with a newline.
func logIDs(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	if len(b) == 0 {
		return nil
	}
	require.True(t, strings.HasSuffix(string(b), "\n"), "%s ends in a partial line", path)
	var ids []string
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		var rec struct {
			DecisionID string `json:"decision_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "%s line %d: %.120q", path, i+1, line)
		ids = append(ids, rec.DecisionID)
	}
	return ids
}

// TestDecisionLogFollowsItsPath moves or removes the decision log file under a running
// service, without a signal: the next decision goes to a new file at the configured path (a
// removed file would lose it while the service answers 200), and every answered decision is
// in exactly one file.
func TestDecisionLogFollowsItsPath(t *testing.T) {
	tests := []struct {
		name  string
		move  func(path string) error
		moved string // where the first decision is afterwards; "" when it is gone
	}{
		{name: "renamed", move: func(p string) error { return os.Rename(p, p+".1") }, moved: ".1"},
		{name: "removed", move: os.Remove},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "decisions.log")
			base := fileLogServer(t, path)
			first := decideOK(t, base)
			require.NoError(t, tt.move(path))
			second := decideOK(t, base)
			third := decideOK(t, base)
			assert.Equal(t, []string{second, third}, logIDs(t, path))
			if tt.moved != "" {
				assert.Equal(t, []string{first}, logIDs(t, path+tt.moved))
			}
			fi, err := os.Stat(path)
			require.NoError(t, err)
			assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
		})
	}
}

// TestDecisionLogRefusesUnsafeFile: the decision log holds every decision's input, so the
// service refuses a file others may read, a file another user owns, and a symbolic link
// (which could point it at any file).
func TestDecisionLogRefusesUnsafeFile(t *testing.T) {
	type testCase struct {
		name    string
		prepare func(t *testing.T, path string)
		want    string
	}
	tests := []testCase{
		{name: "readable by others", want: "has mode 0644", prepare: func(t *testing.T, p string) {
			require.NoError(t, os.WriteFile(p, nil, 0o600))
			require.NoError(t, os.Chmod(p, 0o644))
		}},
		{name: "writable by the group", want: "has mode 0620", prepare: func(t *testing.T, p string) {
			require.NoError(t, os.WriteFile(p, nil, 0o600))
			require.NoError(t, os.Chmod(p, 0o620))
		}},
		{name: "symbolic link", want: "is a symbolic link", prepare: func(t *testing.T, p string) {
			target := filepath.Join(filepath.Dir(p), "target")
			require.NoError(t, os.WriteFile(target, nil, 0o600))
			require.NoError(t, os.Symlink(target, p))
		}},
		{name: "dangling symbolic link", want: "is a symbolic link", prepare: func(t *testing.T, p string) {
			require.NoError(t, os.Symlink(filepath.Join(filepath.Dir(p), "elsewhere"), p))
		}},
		{name: "directory", want: "decisionLog.path", prepare: func(t *testing.T, p string) {
			require.NoError(t, os.Mkdir(p, 0o700))
		}},
	}
	if os.Geteuid() == 0 {
		tests = append(tests, testCase{name: "owned by another user", want: "is owned by uid 65534", prepare: func(t *testing.T, p string) {
			require.NoError(t, os.WriteFile(p, nil, 0o600))
			require.NoError(t, os.Chown(p, 65534, 65534))
		}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "decisions.log")
			tt.prepare(t, path)
			cfg := testConfig()
			cfg.DecisionLog.Path = path
			_, err := server.New(cfg, testEngine(t), staticFacts(t, "facts.json"), server.Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Contains(t, err.Error(), "decisionLog.path")
		})
	}

	t.Run("a new file is created 0600", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "decisions.log")
		cfg := testConfig()
		cfg.DecisionLog.Path = path
		s, err := server.New(cfg, testEngine(t), staticFacts(t, "facts.json"), server.Options{})
		require.NoError(t, err)
		require.NoError(t, s.Close())
		fi, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	})
}
