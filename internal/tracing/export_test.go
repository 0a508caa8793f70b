package tracing_test

import (
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/testutil"
	"github.com/authz-dev/authz/internal/tracing"
)

// TestStartExport: an absent distributed_tracing section exports nothing; a configured one
// builds a provider with OPA's defaults, says so in the log, leaves the excluded paths
// untraced, and Shutdown returns though no collector answers.
func TestStartExport(t *testing.T) {
	log := &testutil.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "authz", Output: log})

	off, err := tracing.ParseConfig(nil)
	require.NoError(t, err)
	exp, err := tracing.StartExport(t.Context(), off, logger)
	require.NoError(t, err)
	assert.Nil(t, exp)

	cfg, err := tracing.ParseConfig(map[string]any{"type": "http", "address": "127.0.0.1:1", "exclude_paths": []any{"/v1/data/**"}})
	require.NoError(t, err)
	assert.Equal(t, tracing.DefaultServiceName, cfg.ServiceName)
	exp, err = tracing.StartExport(t.Context(), cfg, logger)
	require.NoError(t, err)
	require.NotNil(t, exp)
	assert.True(t, exp.Exclude("/v1/data/authz/decision"))
	assert.False(t, exp.Exclude("/v1/authorize"))
	assert.Contains(t, log.String(), "authz.tracing: decisions are traced: type=http address=127.0.0.1:1 service_name=authz")
	exp.Shutdown(t.Context())

	_, err = tracing.ParseConfig(map[string]any{"type": "zipkin"})
	require.ErrorContains(t, err, tracing.Section+`.type: "zipkin" is not a transport`)
}
