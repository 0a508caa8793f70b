package main

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
)

// TestServeSurvivesClosedStderr closes the reading end of the service's stderr, where its
// required decision log goes: the next decision cannot be recorded, so it is answered 503, and
// the process lives on (a write to a closed pipe is an error, not a SIGPIPE death).
func TestServeSurvivesClosedStderr(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	facts := testutil.WriteFile(t, t.TempDir(), "facts.json", specFacts)
	p := startServeProcess(t, "", "--facts", facts, "--addr", "127.0.0.1:0",
		"--decision-log", "-", "--decision-log-required")
	c := &http.Client{Timeout: 10 * time.Second}
	base := "http://" + p.addr

	status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", specRequest)
	require.Equal(t, http.StatusOK, status, "%v", doc)

	require.NoError(t, p.Pipe.Close())
	for range 3 {
		status, doc = testutil.PostJSON(t, c, base+"/v1/authorize", specRequest)
		assert.Equal(t, http.StatusServiceUnavailable, status)
		assert.Equal(t, "DECISION_LOG_UNAVAILABLE", doc["code"])
		assert.Equal(t, false, doc["allow"])
	}
	require.True(t, p.Alive(), "the service died after its stderr reader went away")

	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 30*time.Second), "exit status after SIGTERM")
}

// startServeWithLog runs `authz serve` as a process on the contract's facts with a required
// decision log file in a fresh directory; it returns the process and the log's path.
func startServeWithLog(t testing.TB) (p *serveProcess, logPath string) {
	t.Helper()
	dir := t.TempDir()
	facts := testutil.WriteFile(t, dir, "facts.json", specFacts)
	logPath = filepath.Join(dir, "decisions.log")
	p = startServeProcess(t, "", "--facts", facts, "--addr", "127.0.0.1:0",
		"--decision-log", logPath, "--decision-log-required")
	return p, logPath
}

// TestServeReopensDecisionLogOnSIGHUP rotates the decision log the way logrotate does
// (rename, then SIGHUP): the service lives on, and every decision is in exactly one of the
// two files, the ones after the signal in the new file.
func TestServeReopensDecisionLogOnSIGHUP(t *testing.T) {
	t.Parallel() // the service runs in a process of its own
	p, logPath := startServeWithLog(t)
	c := &http.Client{Timeout: 10 * time.Second}
	base := "http://" + p.addr

	decide := func() string {
		t.Helper()
		status, doc := testutil.PostJSON(t, c, base+"/v1/authorize", specRequest)
		require.Equal(t, http.StatusOK, status, "%v", doc)
		return doc["decision_id"].(string)
	}
	before := decide()
	require.NoError(t, os.Rename(logPath, logPath+".1"))
	p.Signal(t, syscall.SIGHUP)
	require.Eventually(t, func() bool { _, err := os.Stat(logPath); return err == nil }, 10*time.Second, 10*time.Millisecond,
		"SIGHUP did not reopen %s; stderr:\n%s", logPath, p.Stderr)
	after := decide()
	require.True(t, p.Alive(), "SIGHUP killed the service")
	assert.Contains(t, p.Stderr.String(), "decision log reopened")

	assert.Equal(t, []string{before}, decisionIDs(t, logPath+".1"))
	assert.Equal(t, []string{after}, decisionIDs(t, logPath))

	p.Signal(t, syscall.SIGTERM)
	assert.NoError(t, p.WaitExit(t, 30*time.Second), "exit status after SIGTERM")
}

// decisionIDs reads the decision_id of every line of a decision log; every line must be a
// whole JSON object.
func decisionIDs(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var ids []string
	for i, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" && i == 0 {
			continue
		}
		var rec struct {
			DecisionID string `json:"decision_id"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "%s line %d is not a JSON object: %.200q", path, i+1, line)
		ids = append(ids, rec.DecisionID)
	}
	return ids
}
