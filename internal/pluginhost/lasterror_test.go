package pluginhost

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/testutil"
)

// Every way a real plugin fails has its code, carried by the error itself, and the code carries
// none of the details (paths, digests, pids) that the last error holds for the service log.
func TestLastErrorCodes(t *testing.T) {
	runParallel(t)
	truePath, err := exec.LookPath("true")
	require.NoError(t, err)
	truePath, err = filepath.EvalSymlinks(truePath)
	require.NoError(t, err)
	trueSum, err := FileSHA256(truePath)
	require.NoError(t, err)

	tests := []struct {
		name   string
		plugin func(t *testing.T) PluginConfig
		start  time.Duration
		kill   bool // SIGKILL the first worker and wait for the restart
		want   coded.Code
		// wantErr matches the last error, where the code alone does not say which failure it was.
		wantErr string
	}{
		{name: "pin mismatch", want: coded.PinMismatch, plugin: func(t *testing.T) PluginConfig {
			p := driverPlugin(t, "p")
			p.SHA256 = strings.Repeat("0", 64)
			return p
		}},
		{name: "unreadable binary", want: coded.PinUnreadable, plugin: func(t *testing.T) PluginConfig {
			p := driverPlugin(t, "p")
			p.Path = filepath.Join(t.TempDir(), "missing")
			return p
		}},
		{name: "hang at start", want: coded.StartTimeout, start: 500 * time.Millisecond,
			plugin: func(t *testing.T) PluginConfig { return driverPlugin(t, "p", "-hang-at-start") }},
		{name: "stdout noise", want: coded.HandshakeFailed,
			plugin: func(t *testing.T) PluginConfig { return driverPlugin(t, "p", "-stdout-noise") }},
		{name: "not a driver", want: coded.HandshakeFailed, wantErr: `plugin (ended its stdout|exited) before the go-plugin handshake`,
			plugin: func(*testing.T) PluginConfig { return PluginConfig{ID: "p", Path: truePath, SHA256: trueSum} }},
		{name: "invalid manifest", want: coded.InvalidManifest,
			plugin: func(t *testing.T) PluginConfig { return driverPlugin(t, "p", "-plugin-key", "") }},
		{name: "worker killed", want: coded.WorkerExited, kill: true,
			plugin: func(t *testing.T) PluginConfig { return driverPlugin(t, "p") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, tt.plugin(t))
			cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
			if tt.start > 0 {
				cfg.StartTimeout = tt.start
			}
			h, rec := startHost(t, cfg)
			if tt.kill {
				waitStarted(t, h, rec)
				w := state(t, h, "p").Worker
				require.NotNil(t, w)
				require.NoError(t, syscall.Kill(w.PID, syscall.SIGKILL))
				waitFor(t, 30*time.Second, "the exit recorded", func() bool { return state(t, h, "p").LastError != "" })
				rec.record(h)
			} else {
				waitFor(t, 30*time.Second, "status error", func() bool { return state(t, h, "p").Status == StatusError })
			}
			st := state(t, h, "p")
			assert.Equal(t, string(tt.want), st.LastErrorCode, "last error: %s", st.LastError)
			if tt.wantErr != "" {
				assert.Regexp(t, tt.wantErr, st.LastError)
			}
		})
	}
}

func TestStartErrorCode(t *testing.T) {
	assert.Equal(t, coded.StartFailed, startErrorCode(errors.New(`dispense "driver": boom`)), "an error without a code")
	assert.Equal(t, coded.LimitExceeded, startErrorCode(fmt.Errorf("dispense: %w", coded.Errorf(coded.LimitExceeded, "too large"))), "a wrapped code")
}

// What a plugin writes to stderr before it fails is in the service log at the default level
// (info): that is where a driver says why it cannot start.
func TestPluginStderrAtDefaultLevel(t *testing.T) {
	runParallel(t)
	// The test driver as a driver that explains on stderr why it cannot start, and exits.
	p := driverPlugin(t, "p")
	p.Args = []string{asFailingDriver}
	var logs testutil.SyncBuffer
	cfg := testConfig(t, p)
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "pluginhost", Level: hclog.Info, Output: &logs})
	cfg.MinBackoff, cfg.MaxBackoff = time.Second, time.Second
	h, _ := startHost(t, cfg)
	waitFor(t, 30*time.Second, "status error", func() bool { return state(t, h, "p").Status == StatusError })
	waitFor(t, 5*time.Second, "the stderr line in the log", func() bool {
		return strings.Contains(logs.String(), "acme driver: DAYTONA_API_URL is not set")
	})
	assert.Regexp(t, `\[INFO\]\s+pluginhost\.p: acme driver: DAYTONA_API_URL is not set`, logs.String())
	assert.NotContains(t, logs.String(), "chatter", "a line that says [DEBUG] stays at debug")
	assert.Equal(t, string(coded.HandshakeFailed), state(t, h, "p").LastErrorCode)
}
