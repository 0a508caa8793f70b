package service_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/sandbox"
	"github.com/authz-dev/authz/internal/service"
	"github.com/authz-dev/authz/internal/testdrivers/liveness"
	"github.com/authz-dev/authz/internal/testutil"
)

func TestMain(m *testing.M) {
	sandbox.Init() // the tests start drivers through this binary
	if len(os.Args) > 1 && os.Args[1] == liveness.Marker {
		os.Exit(liveness.Main(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// loopback is a listener on an ephemeral loopback port.
func loopback(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

// startRun runs the service of cfg on a loopback listener until the test stops it; stop
// cancels its context and returns Run's error (or fails when Run does not return in time).
func startRun(t testing.TB, cfg service.Config, log io.Writer) (base string, stop func() error) {
	t.Helper()
	ln := loopback(t)
	stop = testutil.RunUntilStopped(t, "Run", 30*time.Second, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		return service.Run(ctx, cfg, service.Options{LogOutput: log, Listener: ln})
	})
	return "http://" + ln.Addr().String(), stop
}

// TestRun serves the composed service on loopback, with static facts and with a live plugin
// host, answers a decision, reloads on SIGHUP, and shuts down in order when its context ends.
func TestRun(t *testing.T) {
	tests := []struct {
		name        string
		change      func(c *service.Config)
		wantPlugins int
		wantLog     []string
	}{
		{
			name:        "static facts",
			change:      func(c *service.Config) { c.Facts = filepath.Join("..", "server", "testdata", "facts.json") },
			wantPlugins: 2,
			wantLog:     []string{"using static facts", "listening", "SIGHUP: reloading", "shutting down", "HTTP server stopped", "stopped: exiting"},
		},
		{
			name:        "plugin host without plugins",
			change:      func(c *service.Config) { c.Host.Plugins = []pluginhost.PluginConfig{} },
			wantPlugins: 0,
			wantLog: []string{"listening", "SIGHUP: reloading", "shutting down", "HTTP server stopped",
				"stopping plugins", "plugins stopped", "stopped: exiting"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := service.DefaultConfig()
			cfg.Server.DecisionLog.Path = filepath.Join(t.TempDir(), "decisions.log")
			tt.change(&cfg)
			log := &testutil.SyncBuffer{}
			base, stop := startRun(t, cfg, log)
			c := &http.Client{Timeout: 10 * time.Second}
			testutil.WaitReady(t, c, base, 30*time.Second, log)

			status, plugins := testutil.GetJSON(t, c, base+"/v1/plugins")
			require.Equal(t, http.StatusOK, status)
			assert.Len(t, plugins["plugins"], tt.wantPlugins)

			body, err := os.ReadFile(filepath.Join("..", "specexamples", "request.json"))
			require.NoError(t, err)
			resp, err := c.Post(base+"/v1/authorize", "application/json", strings.NewReader(string(body)))
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode)

			// Run catches SIGHUP from its start: the signal reloads instead of ending the process.
			require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
			require.Eventually(t, func() bool { return strings.Contains(log.String(), "SIGHUP: reloading") },
				10*time.Second, 10*time.Millisecond)
			c.CloseIdleConnections()

			require.NoError(t, stop())
			testutil.AssertLogOrder(t, log.String(), tt.wantLog...)
			logged, err := os.ReadFile(cfg.Server.DecisionLog.Path)
			require.NoError(t, err)
			assert.Contains(t, string(logged), `"decision_id"`, "the decision was logged")
		})
	}
}

// TestRunRefusesConfiguration: a configuration that cannot be served is a *ConfigError that
// names the problem, returned before anything serves; the listener is closed.
func TestRunRefusesConfiguration(t *testing.T) {
	tests := []struct {
		name   string
		change func(c *service.Config)
		want   string
	}{
		{name: "invalid field", change: func(c *service.Config) { c.Server.MaxBodyBytes = 0 },
			want: "invalid configuration:\nmaxBodyBytes: must be positive"},
		{name: "bad pin", change: func(c *service.Config) {
			c.Host.Plugins = []pluginhost.PluginConfig{{ID: "a", Path: "/opt/a", SHA256: "abc"}}
		}, want: "plugins[0].sha256: must be 64 hex characters"},
		{name: "missing facts file", change: func(c *service.Config) { c.Facts = filepath.Join(t.TempDir(), "none.json") },
			want: "facts: "},
		{name: "unreadable certificate", change: func(c *service.Config) {
			c.Server.TLS.Cert, c.Server.TLS.Key = "/nonexistent/c.pem", "/nonexistent/k.pem"
			c.Host.Plugins = nil
		}, want: "tls.cert: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := service.DefaultConfig()
			tt.change(&cfg)
			ln := loopback(t)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			err := service.Run(ctx, cfg, service.Options{LogOutput: io.Discard, Listener: ln})
			var ce *service.ConfigError
			require.ErrorAs(t, err, &ce)
			assert.Contains(t, err.Error(), tt.want)
			_, err = ln.Accept()
			assert.ErrorIs(t, err, net.ErrClosed, "Run closed the listener it was given")
		})
	}
}

// TestRunNotReadyWhilePluginsHaveNotStarted: readiness comes from the host. A plugin that never
// completes its start keeps GET /health/ready at 503, and once the start time-out has passed the
// log names it.
func TestRunNotReadyWhilePluginsHaveNotStarted(t *testing.T) {
	bin, err := exec.LookPath("true")
	require.NoError(t, err)
	bin, err = filepath.EvalSymlinks(bin)
	require.NoError(t, err)
	sum, err := pluginhost.FileSHA256(bin)
	require.NoError(t, err)
	cfg := service.DefaultConfig()
	cfg.Host.Plugins = []pluginhost.PluginConfig{{ID: "never.ready", Path: bin, SHA256: sum}}
	cfg.Host.StartTimeout = 300 * time.Millisecond
	log := &testutil.SyncBuffer{}
	base, stop := startRun(t, cfg, log)
	c := &http.Client{Timeout: 10 * time.Second}

	require.Eventually(t, func() bool {
		return strings.Contains(log.String(), "plugins have not started yet")
	}, 30*time.Second, 20*time.Millisecond, "log:\n%s", log)
	assert.Contains(t, log.String(), "not ready yet: never.ready (status ")
	status, doc := testutil.GetJSON(t, c, base+"/health/ready")
	assert.Equal(t, http.StatusServiceUnavailable, status)
	assert.Equal(t, false, doc["pluginsStarted"])
	c.CloseIdleConnections()
	require.NoError(t, stop())
	testutil.AssertLogOrder(t, log.String(), "HTTP server stopped", "stopping plugins", "plugins stopped", "stopped: exiting")
}

// TestRunWarnsOfAReadableConfigFile: a configuration file others may read (it may hold
// credentials, and drivers run as other users) gets one WARN at start that names it and says
// chmod 600; a file only its owner reads gets none.
func TestRunWarnsOfAReadableConfigFile(t *testing.T) {
	facts, err := filepath.Abs(filepath.Join("..", "server", "testdata", "facts.json"))
	require.NoError(t, err)
	for _, mode := range []os.FileMode{0o644, 0o600} {
		t.Run(fmt.Sprintf("%04o", mode), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "config.yaml")
			require.NoError(t, os.WriteFile(file, []byte("facts: "+facts+"\n"), 0o600))
			require.NoError(t, os.Chmod(file, mode))
			cfg, err := service.LoadConfig(file)
			require.NoError(t, err)
			log := &testutil.SyncBuffer{}
			base, stop := startRun(t, cfg, log)
			testutil.WaitReady(t, &http.Client{Timeout: 10 * time.Second}, base, 30*time.Second, log)
			require.NoError(t, stop())
			warn := "chmod 600 " + file
			if mode&0o004 != 0 {
				assert.Equal(t, 1, strings.Count(log.String(), warn), "%s", log.String())
				assert.Contains(t, log.String(), "[WARN]")
			} else {
				assert.NotContains(t, log.String(), warn)
			}
		})
	}
}
