package server_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
)

// countingChecks are facts whose config checks answer at once (valid) and count how often a
// decision asks: ahead of the decision (PrepareConfigCheck, AnswerConfigCheck) or while it
// builds its input (ConfigValid).
type countingChecks struct {
	*server.StaticFacts
	asks atomic.Int64
}

func (f *countingChecks) ConfigValid(ctx context.Context, pluginID string, w *snapshot.Worker, driverKey string, config any) (bool, error) {
	f.asks.Add(1)
	return f.StaticFacts.ConfigValid(ctx, pluginID, w, driverKey, config)
}

func (f *countingChecks) PrepareConfigCheck(string, *snapshot.Worker, string, any) func(context.Context) (bool, error) {
	f.asks.Add(1)
	return nil
}

func (f *countingChecks) AnswerConfigCheck(string, *snapshot.Worker, string, any) (func(context.Context) (bool, error), bool, error) {
	f.asks.Add(1)
	return nil, true, nil
}

// TestConfigCheckAskedOncePerDecision: a decision whose config check is answered at once asks
// for it once, not once ahead of the decision and again while it builds the input.
func TestConfigCheckAskedOncePerDecision(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "facts.json")
	require.NoError(t, os.WriteFile(path, []byte(twoPluginFacts), 0o600))
	sf, err := server.LoadStaticFacts(path)
	require.NoError(t, err)
	facts := &countingChecks{StaticFacts: sf}
	h := newServer(t, withFacts(facts)).Handler()
	for n := range 3 {
		before := facts.asks.Load()
		req := httptest.NewRequest(http.MethodPost, "/v1/authorize", bytes.NewReader([]byte(pluginRequest(t, "test.plugin", n))))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		require.Contains(t, rec.Body.String(), `"allow":true`)
		assert.Equal(t, int64(1), facts.asks.Load()-before, "config check asks of decision %d", n)
	}
}
