package service_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/service"
)

// TestHealthAndReadinessConfig: health and readiness are read from the file at the top level,
// default when absent, and refused by field name when wrong.
func TestHealthAndReadinessConfig(t *testing.T) {
	cfg, err := service.ParseConfig(strings.NewReader(""))
	require.NoError(t, err)
	assert.Equal(t, pluginhost.HealthConfig{Interval: time.Second, Timeout: time.Second, PinCheckInterval: time.Minute}, cfg.Host.Health)
	assert.Equal(t, pluginhost.ReadinessStarted, cfg.Host.Readiness)

	cfg, err = service.ParseConfig(strings.NewReader("health:\n  interval: 250ms\n  timeout: 2s\n  pinCheckInterval: 10m\nreadiness: allPlugins\n"))
	require.NoError(t, err)
	assert.Equal(t, pluginhost.HealthConfig{Interval: 250 * time.Millisecond, Timeout: 2 * time.Second, PinCheckInterval: 10 * time.Minute}, cfg.Host.Health)
	assert.Equal(t, pluginhost.ReadinessAllPlugins, cfg.Host.Readiness)
	cfg.Host.Plugins = nil
	require.NoError(t, cfg.Validate())

	tests := []struct {
		name string
		yaml string
		want string
	}{
		{name: "negative interval", yaml: "health: {interval: -1s}", want: "health.interval: must not be negative"},
		{name: "timeout too short", yaml: "health: {timeout: 1ms}", want: "health.timeout: 1ms is too short"},
		{name: "negative pin check", yaml: "health: {pinCheckInterval: -1m}", want: "health.pinCheckInterval: must not be negative"},
		{name: "unknown readiness", yaml: "readiness: everything", want: `readiness: "everything" is neither "started" nor "allPlugins"`},
		{name: "unknown health field", yaml: "health: {period: 1s}", want: "period"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := service.ParseConfig(strings.NewReader(tt.yaml))
			if err == nil {
				err = cfg.Validate()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}
