package exampledriver

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/driverplugin"
)

func TestDescribeAndMethods(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantKey string
	}{
		{name: "defaults", opts: DefaultOptions(), wantKey: DefaultDriverKey},
		{name: "another driver key", opts: Options{PluginKey: DefaultPluginKey, DriverKey: "other"}, wantKey: "other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := New(tt.opts)
			desc, err := d.Describe(t.Context())
			require.NoError(t, err)
			assert.Equal(t, DefaultPluginKey, desc.Key)
			require.Len(t, desc.EnvironmentDrivers, 1)
			e := desc.EnvironmentDrivers[0]
			assert.Equal(t, tt.wantKey, e.DriverKey)
			assert.Equal(t, driverplugin.KindSandboxProvider, e.Kind)
			assert.Equal(t, map[string]any{"duplexCommandStream": true, "incrementalSessionOutput": true}, e.SandboxCapabilities)
			methods, err := d.SupportedMethods(t.Context())
			require.NoError(t, err)
			assert.Equal(t, DefaultMethods, methods)
			methods[0] = "changed"
			assert.Equal(t, "duplexChannelOpen", DefaultMethods[0], "callers get a copy")
		})
	}
}

func TestCheckConfig(t *testing.T) {
	tests := []struct {
		name      string
		driverKey string
		config    map[string]any
		want      bool
	}{
		{name: "any config", driverKey: "example", config: map[string]any{"region": "eu"}, want: true},
		{name: "empty config", driverKey: "example", config: map[string]any{}, want: true},
		{name: "reject true", driverKey: "example", config: map[string]any{"reject": true}},
		{name: "reject as a string is not reject", driverKey: "example", config: map[string]any{"reject": "true"}, want: true},
		{name: "other driver key", driverKey: "daytona", config: map[string]any{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, reason, err := New(DefaultOptions()).CheckConfig(t.Context(), tt.driverKey, tt.config)
			require.NoError(t, err)
			assert.Equal(t, tt.want, ok)
			if !tt.want {
				assert.NotEmpty(t, reason)
			}
		})
	}
}

// TestRunFlags: the example driver takes its honest keys and nothing else; the fault flags of
// the test-only driver (internal/testdrivers/faults) are refused.
func TestRunFlags(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{name: "unknown flag", args: []string{"-nope"}, wantCode: 2},
		{name: "extra argument", args: []string{"extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
		{name: "empty plugin key", args: []string{"-plugin-key", ""}, wantCode: 2, wantStderr: "must not be empty"},
		{name: "empty driver key", args: []string{"-driver-key", ""}, wantCode: 2, wantStderr: "must not be empty"},
		{name: "help", args: []string{"-h"}, wantCode: 0},
		{name: "run by hand", args: []string{"-plugin-key", "acme.sandbox", "-driver-key", "acme"}, wantCode: 1, wantStderr: "not meant to be run by hand"},
		{name: "crash-after is a test fault", args: []string{"-crash-after", "2"}, wantCode: 2, wantStderr: "flag provided but not defined: -crash-after"},
		{name: "hang-at-start is a test fault", args: []string{"-hang-at-start"}, wantCode: 2, wantStderr: "not defined: -hang-at-start"},
		{name: "stdout-noise is a test fault", args: []string{"-stdout-noise"}, wantCode: 2, wantStderr: "not defined: -stdout-noise"},
		{name: "declare is a test fault", args: []string{"-declare", "nativeSyncIn=1"}, wantCode: 2, wantStderr: "not defined: -declare"},
		{name: "omit-method is a test fault", args: []string{"-omit-method", "duplexChannelOpen"}, wantCode: 2, wantStderr: "not defined: -omit-method"},
		{name: "reject-config is a test fault", args: []string{"-reject-config"}, wantCode: 2, wantStderr: "not defined: -reject-config"},
		{name: "config-delay is a test fault", args: []string{"-config-delay", "1s"}, wantCode: 2, wantStderr: "not defined: -config-delay"},
		{name: "kind is a test fault", args: []string{"-kind", "sandbox"}, wantCode: 2, wantStderr: "not defined: -kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(tt.args, &stderr)
			assert.Equal(t, tt.wantCode, code)
			assert.Contains(t, stderr.String(), tt.wantStderr)
		})
	}
}
