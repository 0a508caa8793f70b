package service_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/service"
	"github.com/authz-dev/authz/internal/testdrivers/liveness"
	"github.com/authz-dev/authz/internal/testutil"
)

// procState is the state letter of pid in the process table (R, S, T, Z, …); 0 when it is gone.
func procState(pid int) byte {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || len(stat) < i+3 {
		return 0
	}
	return stat[i+2]
}

// TestSIGHUPWithAStoppedPlugin: a SIGHUP that removes a plugin whose worker stopped (SIGSTOP)
// ends it without its cooperation, and it never holds up what other SIGHUPs reload: the next
// SIGHUP reopens the decision log at once, and the plugin is gone.
func TestSIGHUPWithAStoppedPlugin(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	sum, err := pluginhost.FileSHA256(self)
	require.NoError(t, err)
	cfg := service.DefaultConfig()
	cfg.Server.DecisionLog.Path = filepath.Join(t.TempDir(), "decisions.log")
	cfg.Host.Plugins = []pluginhost.PluginConfig{{ID: "stopped", Path: self, SHA256: sum,
		Args: []string{liveness.Marker, "-mode", liveness.ModeSelfStop}}}
	cfg.Host.Health.Interval = time.Hour // the stop on SIGHUP is under test, not the health check
	without := cfg
	without.Host.Plugins = []pluginhost.PluginConfig{}

	log := &testutil.SyncBuffer{}
	ln := loopback(t)
	stop := testutil.RunUntilStopped(t, "Run", 30*time.Second, func(ctx context.Context) error {
		return service.Run(ctx, cfg, service.Options{LogOutput: log, Listener: ln,
			Reread: func() (service.Config, error) { return without, nil }})
	})
	base := "http://" + ln.Addr().String()
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 30*time.Second, log)
	_, doc := testutil.GetJSON(t, c, base+"/v1/plugins")
	pid := int(doc["plugins"].([]any)[0].(map[string]any)["worker"].(map[string]any)["pid"].(float64))
	t.Cleanup(func() { // a service that cannot end it must not hang the test
		if procState(pid) == 'T' {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	require.Eventually(t, func() bool { return procState(pid) == 'T' }, 30*time.Second, 5*time.Millisecond, "the worker never stopped itself")

	hup := time.Now()
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "SIGHUP: reloading") }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, os.Rename(cfg.Server.DecisionLog.Path, cfg.Server.DecisionLog.Path+".1"))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	reopened := assert.Eventually(t, func() bool {
		_, err := os.Stat(cfg.Server.DecisionLog.Path)
		return err == nil
	}, 20*time.Second, 5*time.Millisecond, "the second SIGHUP did not reopen the decision log; log:\n%s", log)
	t.Logf("two SIGHUPs → decision log reopened after %s", time.Since(hup))
	removed := assert.Eventually(t, func() bool {
		_, doc := testutil.GetJSON(t, c, base+"/v1/plugins")
		return len(doc["plugins"].([]any)) == 0 && procState(pid) == 0
	}, 20*time.Second, 5*time.Millisecond, "the stopped plugin was not removed; log:\n%s", log)
	t.Logf("SIGHUP → stopped plugin removed and reaped after %s", time.Since(hup))
	if !reopened || !removed {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	c.CloseIdleConnections()
	require.NoError(t, stop())
}

// TestShutdownWithAStoppedPlugin: the end of Run (SIGTERM in `authz serve`) with a plugin whose
// worker stopped (SIGSTOP) kills the worker after the grace period instead of waiting for an
// answer that never comes, and Run returns.
func TestShutdownWithAStoppedPlugin(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	sum, err := pluginhost.FileSHA256(self)
	require.NoError(t, err)
	cfg := service.DefaultConfig()
	cfg.Host.Plugins = []pluginhost.PluginConfig{{ID: "stopped", Path: self, SHA256: sum,
		Args: []string{liveness.Marker, "-mode", liveness.ModeSelfStop}}}
	cfg.Host.Health.Interval = time.Hour // the stop at shutdown is under test, not the health check

	log := &testutil.SyncBuffer{}
	ln := loopback(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- service.Run(ctx, cfg, service.Options{LogOutput: log, Listener: ln}) }()
	base := "http://" + ln.Addr().String()
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 30*time.Second, log)
	_, doc := testutil.GetJSON(t, c, base+"/v1/plugins")
	pid := int(doc["plugins"].([]any)[0].(map[string]any)["worker"].(map[string]any)["pid"].(float64))
	require.Eventually(t, func() bool { return procState(pid) == 'T' }, 30*time.Second, 5*time.Millisecond, "the worker never stopped itself")
	c.CloseIdleConnections()

	start := time.Now()
	cancel()
	bound := time.NewTimer(30 * time.Second)
	defer bound.Stop()
	select {
	case err := <-ran:
		require.NoError(t, err)
		t.Logf("shutdown with a stopped worker took %s", time.Since(start))
	case <-bound.C:
		_ = syscall.Kill(pid, syscall.SIGKILL) // so that Run can end and the test with it
		err := <-ran
		t.Fatalf("Run did not return within 30s of its end with a stopped worker (it returned %s later, once the worker was killed, with %v)", time.Since(start)-30*time.Second, err)
	}
	assert.Equal(t, byte(0), procState(pid), "the stopped worker was killed and reaped")
	testutil.AssertLogOrder(t, log.String(), "HTTP server stopped", "stopping plugins", "plugins stopped", "stopped: exiting")
}

// TestReadinessSurvivesACrashLoopingPluginAddedBySIGHUP: readiness means the service can
// decide. A plugin added by SIGHUP that never starts shows on /v1/plugins, and /health/ready
// stays 200: one bad rollout does not take every replica out of the load balancer.
func TestReadinessSurvivesACrashLoopingPluginAddedBySIGHUP(t *testing.T) {
	bin, err := exec.LookPath("false")
	require.NoError(t, err)
	bin, err = filepath.EvalSymlinks(bin)
	require.NoError(t, err)
	sum, err := pluginhost.FileSHA256(bin)
	require.NoError(t, err)
	cfg := service.DefaultConfig()
	cfg.Host.Plugins = []pluginhost.PluginConfig{}
	with := cfg
	with.Host.Plugins = []pluginhost.PluginConfig{{ID: "crashing", Path: bin, SHA256: sum}}

	log := &testutil.SyncBuffer{}
	ln := loopback(t)
	stop := testutil.RunUntilStopped(t, "Run", 30*time.Second, func(ctx context.Context) error {
		return service.Run(ctx, cfg, service.Options{LogOutput: log, Listener: ln,
			Reread: func() (service.Config, error) { return with, nil }})
	})
	base := "http://" + ln.Addr().String()
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 30*time.Second, log)

	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool {
		_, doc := testutil.GetJSON(t, c, base+"/v1/plugins")
		plugins := doc["plugins"].([]any)
		if len(plugins) != 1 {
			return false
		}
		p := plugins[0].(map[string]any)
		return p["status"] == pluginhost.StatusError && p["restarts"].(float64) >= 2
	}, 30*time.Second, 10*time.Millisecond, "the added plugin did not fail twice; log:\n%s", log)
	status, doc := testutil.GetJSON(t, c, base+"/health/ready")
	assert.Equal(t, http.StatusOK, status, "%v", doc)
	assert.Equal(t, true, doc["pluginsStarted"])
	c.CloseIdleConnections()
	require.NoError(t, stop())
}

// TestSIGHUPNamesPinDrift: a pinned binary upgraded in place while its worker runs is not a
// silent "unchanged" on SIGHUP: the log warns, and /v1/plugins shows pinDrift while the worker
// runs on (it runs the pinned bytes).
func TestSIGHUPNamesPinDrift(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	path, sum := testutil.CopyWithTrailer(t, self, t.TempDir(), "driver", "\x00a build of the driver")
	cfg := service.DefaultConfig()
	cfg.Host.Plugins = []pluginhost.PluginConfig{{ID: "p", Path: path, SHA256: sum,
		Args: []string{liveness.Marker, "-after", "1h"}}} // a driver that keeps answering

	log := &testutil.SyncBuffer{}
	ln := loopback(t)
	stop := testutil.RunUntilStopped(t, "Run", 30*time.Second, func(ctx context.Context) error {
		return service.Run(ctx, cfg, service.Options{LogOutput: log, Listener: ln,
			Reread: func() (service.Config, error) { return cfg, nil }})
	})
	base := "http://" + ln.Addr().String()
	c := &http.Client{Timeout: 10 * time.Second}
	testutil.WaitReady(t, c, base, 30*time.Second, log)
	plugin := func() map[string]any {
		_, doc := testutil.GetJSON(t, c, base+"/v1/plugins")
		return doc["plugins"].([]any)[0].(map[string]any)
	}
	before := plugin()
	assert.Equal(t, false, before["pinDrift"])

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString("upgraded in place")
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "no longer match their pins") },
		20*time.Second, 10*time.Millisecond, "log:\n%s", log)
	after := plugin()
	assert.Equal(t, true, after["pinDrift"])
	assert.Equal(t, before["worker"].(map[string]any)["pid"], after["worker"].(map[string]any)["pid"], "the worker runs on")
	c.CloseIdleConnections()
	require.NoError(t, stop())
}
