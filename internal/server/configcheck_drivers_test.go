//go:build unix

package server_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/testdrivers/checks"
)

// TestConfigCheckLoadRealDrivers measures, with two real driver processes, the decisions on
// plugin "fast" while callers of plugin "slow" send new configs whose checks are slow or
// costly. It prints the figures; it asserts only that "fast" is never answered 503.
func TestConfigCheckLoadRealDrivers(t *testing.T) {
	tests := []struct {
		name    string
		flags   []string
		hold    bool // the slow driver never answers: every check runs to configCheckTimeout (2s)
		callers int
	}{
		{name: "a driver that never answers, 8 callers", hold: true, callers: 8},
		{name: "an honest driver taking 100ms, 16 callers", flags: []string{"-delay", "100ms"}, callers: 16},
		{name: "a driver answering 4 MiB errors, 8 callers", flags: []string{"-error-bytes", "4194304"}, callers: 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slowDir := t.TempDir()
			if tt.hold {
				require.NoError(t, os.WriteFile(filepath.Join(slowDir, checks.HoldFile), nil, 0o600))
			}
			base := serveRealDrivers(t, slowDir, tt.flags, nil, nil)
			measureOtherPlugin(t, base, slowDir, tt.callers)
		})
	}
}

// TestConfigCheckHoldsNoDecidingSlotRealDrivers: with more callers of plugin "slow" waiting in
// its driver's config check than there are deciding slots, a decision on plugin "fast" is
// answered at once; the slow callers are decided once the driver answers.
func TestConfigCheckHoldsNoDecidingSlotRealDrivers(t *testing.T) {
	const deciding, slowCallers = 2, 6
	slowDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(slowDir, checks.HoldFile), nil, 0o600))
	base := serveRealDrivers(t, slowDir, nil,
		func(c *pluginhost.Config) {
			c.ConfigCheck.MaxConcurrent = slowCallers // every caller's check at the driver
			c.ConfigCheckTimeout = 20 * time.Second
		},
		func(c *server.Config) {
			c.Limits.MaxDeciding = deciding
			c.Limits.QueueWait = 500 * time.Millisecond
		})

	var wg sync.WaitGroup
	slowStatus := make(chan int, slowCallers)
	for i := range slowCallers {
		body := driverRequest(t, "slow", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			slowStatus <- postStatus(t.Context(), base+"/v1/authorize", body)
		}()
	}
	waitUntil(t, 20*time.Second, "every slow caller's check at the driver", func() bool {
		return checks.Calls(slowDir) == slowCallers
	})
	a := post(t, base+"/v1/authorize", driverRequest(t, "fast", 1))
	t.Logf("with %d checks of slow waiting at its driver: fast answered %d", checks.Calls(slowDir), a.status)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	assert.Equal(t, true, a.json(t)["allow"])

	require.NoError(t, os.Remove(filepath.Join(slowDir, checks.HoldFile)))
	wg.Wait()
	close(slowStatus)
	for st := range slowStatus {
		assert.Equal(t, http.StatusOK, st)
	}
}

// serveRealDrivers serves decisions over a plugin host with two checks drivers, "slow" (with
// flags, control directory slowDir) and "fast".
func serveRealDrivers(t *testing.T, slowDir string, flags []string, changeHost func(*pluginhost.Config), changeServer func(*server.Config)) string {
	t.Helper()
	self, sum := driverProgram(t)
	plugin := func(id, dir string, flags ...string) pluginhost.PluginConfig {
		p := pluginhost.PluginConfig{ID: id, Path: self, SHA256: sum,
			Args:    append([]string{checks.Marker, "-plugin-key", "checks." + id, "-dir", dir}, flags...),
			Sandbox: pluginhost.SandboxConfig{WritePaths: []string{dir}}} // its sandbox lets it write dir
		if os.Getuid() == 0 {
			p.User = "root" // the driver writes to dir, a directory of the test's own
		}
		return p
	}
	cfg := pluginhost.DefaultConfig()
	cfg.Plugins = []pluginhost.PluginConfig{plugin("slow", slowDir, flags...), plugin("fast", t.TempDir())}
	cfg.StartTimeout = 30 * time.Second
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: testWriter{t}})
	if changeHost != nil {
		changeHost(&cfg)
	}
	host, err := pluginhost.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, host.Close()) })
	require.NoError(t, host.Start(t.Context()))
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	require.NoError(t, host.WaitStarted(ctx))
	s := newServer(t, withFacts(host), withConfig(func(c *server.Config) {
		c.Limits.QueueWait = time.Second
		if changeServer != nil {
			changeServer(c)
		}
	}))
	base := startHTTP(t, s)
	require.Equal(t, http.StatusOK, post(t, base+"/v1/authorize", driverRequest(t, "fast", 0)).status)
	return base
}

// driverRequest is the contract's request for a checks driver plugin, with config number n.
func driverRequest(t testing.TB, id string, n int) string {
	return fixture(t, func(req map[string]any) {
		md := metadata(req)
		md["pluginId"], md["provider"] = id, "example"
		req["environment"].(map[string]any)["config"] = map[string]any{"provider": "example", "n": n}
	})
}

// measureOtherPlugin runs slowCallers callers of "slow" (each request a new config) beside two
// callers of "fast" for a few seconds, and logs what "fast" was answered.
func measureOtherPlugin(t *testing.T, base, slowDir string, slowCallers int) {
	t.Helper()
	const duration = 4 * time.Second
	load, stop := context.WithTimeout(t.Context(), duration)
	defer stop()
	l := loadBeside(load, base, slowCallers, func(n int) string { return driverRequest(t, "slow", n) }, func(n int) string { return driverRequest(t, "fast", n) })
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("in %.1fs: fast answered %d (%.0f/s), %d times 503, %d other; slow answered %d, its driver asked %d times; heap high-water %d MiB",
		l.elapsed.Seconds(), l.fastOK, float64(l.fastOK)/l.elapsed.Seconds(), l.fastOverloaded, l.fastOther,
		l.slowAnswered, checks.Calls(slowDir), ms.HeapSys>>20)
	assert.Zero(t, l.fastOverloaded, "a decision on another plugin is never refused for the slow plugin's checks")
	assert.Positive(t, l.fastOK)
}

// testWriter writes to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
