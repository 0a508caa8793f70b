package faults

import (
	"bytes"
	"context"
	"go/build"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/examples/exampledriver"
)

func TestDescribeAndMethods(t *testing.T) {
	tests := []struct {
		name        string
		opts        func(o *Options)
		wantCaps    map[string]any
		wantMethods []string
		wantKey     string
		wantKind    string
	}{
		{
			name:        "defaults are the example driver's",
			wantCaps:    map[string]any{"duplexCommandStream": true, "incrementalSessionOutput": true},
			wantMethods: exampledriver.DefaultMethods,
			wantKey:     exampledriver.DefaultDriverKey,
			wantKind:    driverplugin.KindSandboxProvider,
		},
		{
			name: "lying declaration, a missing method, another key and kind",
			opts: func(o *Options) {
				o.Declare = map[string]any{"duplexCommandStream": "true", "nativeSyncIn": false}
				o.OmitMethods = []string{"duplexChannelOpen"}
				o.DriverKey = "other"
				o.Kind = "sandbox"
			},
			wantCaps:    map[string]any{"duplexCommandStream": "true", "incrementalSessionOutput": true, "nativeSyncIn": false},
			wantMethods: []string{"environmentExecute", "environmentSyncIn", "environmentSyncOut"},
			wantKey:     "other",
			wantKind:    "sandbox",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			if tt.opts != nil {
				tt.opts(&o)
			}
			d := New(o, nil)
			desc, err := d.Describe(t.Context())
			require.NoError(t, err)
			assert.Equal(t, exampledriver.DefaultPluginKey, desc.Key)
			require.Len(t, desc.EnvironmentDrivers, 1)
			e := desc.EnvironmentDrivers[0]
			assert.Equal(t, tt.wantKey, e.DriverKey)
			assert.Equal(t, tt.wantKind, e.Kind)
			assert.Equal(t, tt.wantCaps, e.SandboxCapabilities)
			methods, err := d.SupportedMethods(t.Context())
			require.NoError(t, err)
			assert.Equal(t, tt.wantMethods, methods)
		})
	}
}

func TestCheckConfig(t *testing.T) {
	tests := []struct {
		name      string
		opts      func(o *Options)
		driverKey string
		config    map[string]any
		want      bool
	}{
		{name: "any config", driverKey: "example", config: map[string]any{"region": "eu"}, want: true},
		{name: "reject true", driverKey: "example", config: map[string]any{"reject": true}},
		{name: "other driver key", driverKey: "daytona", config: map[string]any{}},
		{name: "reject every config", opts: func(o *Options) { o.RejectConfig = true }, driverKey: "example", config: map[string]any{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			if tt.opts != nil {
				tt.opts(&o)
			}
			ok, reason, err := New(o, nil).CheckConfig(t.Context(), tt.driverKey, tt.config)
			require.NoError(t, err)
			assert.Equal(t, tt.want, ok)
			if !tt.want {
				assert.NotEmpty(t, reason)
			}
		})
	}
}

func TestConfigDelayHonoursContext(t *testing.T) {
	o := DefaultOptions()
	o.ConfigDelay = time.Hour
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, _, err := New(o, nil).CheckConfig(ctx, "example", map[string]any{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestCrashAfter(t *testing.T) {
	o := DefaultOptions()
	o.CrashAfter = 2
	d := New(o, nil)
	var exited []int
	d.exit = func(code int) { exited = append(exited, code) }
	_, _ = d.Describe(t.Context())
	_, _ = d.SupportedMethods(t.Context())
	assert.Empty(t, exited)
	_, _, _ = d.CheckConfig(t.Context(), "example", nil)
	assert.Equal(t, []int{CrashExitCode}, exited)
}

func TestRunFlags(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStderr string
	}{
		{name: "bad declare", args: []string{"-declare", "x"}, wantCode: 2, wantStderr: "want KEY=JSONVALUE"},
		{name: "declare not JSON", args: []string{"-declare", "x=true!"}, wantCode: 2, wantStderr: "value of x is not JSON"},
		{name: "unknown flag", args: []string{"-nope"}, wantCode: 2},
		{name: "extra argument", args: []string{"extra"}, wantCode: 2, wantStderr: "unexpected arguments"},
		{name: "help", args: []string{"-h"}, wantCode: 0},
		{name: "run by hand", args: []string{"-declare", `duplexCommandStream="true"`, "-omit-method", "a", "-omit-method", "b"}, wantCode: 1, wantStderr: "not meant to be run by hand"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			assert.Equal(t, tt.wantCode, code)
			assert.Contains(t, stderr.String(), tt.wantStderr)
			assert.Empty(t, stdout.String(), "stdout carries the handshake only")
		})
	}
}

func TestDeclareFlag(t *testing.T) {
	d := declareFlag{}
	require.NoError(t, d.Set(`duplexCommandStream="true"`))
	require.NoError(t, d.Set(`nativeSyncIn=false`))
	require.NoError(t, d.Set(`x=null`))
	require.NoError(t, d.Set(`y={"a":[1]}`))
	assert.Equal(t, declareFlag{"duplexCommandStream": "true", "nativeSyncIn": false, "x": nil, "y": map[string]any{"a": []any{1.0}}}, d)
	assert.Error(t, d.Set("=true"))
}

// TestNotInTheShippedBinary: the authz command never links this misbehaving driver.
func TestNotInTheShippedBinary(t *testing.T) {
	goTool := filepath.Join(build.Default.GOROOT, "bin", "go")
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", "github.com/authz-dev/authz/cmd/authz").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	assert.Contains(t, deps, "github.com/authz-dev/authz/examples/exampledriver", "the list is the command's dependencies")
	assert.NotContains(t, deps, "github.com/authz-dev/authz/internal/testdrivers/faults", "cmd/authz links the faults driver")
}
