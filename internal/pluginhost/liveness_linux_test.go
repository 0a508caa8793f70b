package pluginhost

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/testdrivers/liveness"
	"github.com/authz-dev/authz/internal/testutil"
)

// stopBound is how long a test gives the host to end a worker that does not cooperate: the
// graceful request, the SIGKILL and the reaping, with room for a busy machine.
const stopBound = 20 * time.Second

// livenessPlugin configures the test driver as the driver of internal/testdrivers/liveness,
// which stops answering (mode) shortly after the host found it ready.
func livenessPlugin(tb testing.TB, id, mode string) PluginConfig {
	tb.Helper()
	path, sum := driverBinary(tb)
	return PluginConfig{ID: id, Path: path, SHA256: sum, Args: []string{liveness.Marker, "-mode", mode}}
}

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

// stoppedWorker waits until the plugin's first worker has stopped itself and returns its pid.
func stoppedWorker(tb testing.TB, h *Host, rec *pidRecorder, id string) int {
	tb.Helper()
	waitStarted(tb, h, rec)
	w := state(tb, h, id).Worker
	require.NotNil(tb, w)
	killLeftover(tb, w.PID)
	waitFor(tb, 30*time.Second, "the worker to stop itself", func() bool { return procState(w.PID) == 'T' })
	return w.PID
}

// killLeftover SIGKILLs pid when the test ends while it is still a stopped or zombie worker,
// so that a host that cannot end it on its own does not hang the test's cleanup.
func killLeftover(tb testing.TB, pid int) {
	tb.Helper()
	tb.Cleanup(func() {
		if s := procState(pid); s == 'T' || s == 'Z' {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// boundedOrKill runs f and waits stopBound for it; past that it SIGKILLs pid, so that f can
// return and the test end, and fails the test. It returns how long f took.
func boundedOrKill(tb testing.TB, what string, pid int, f func()) time.Duration {
	tb.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	t := time.NewTimer(stopBound)
	defer t.Stop()
	select {
	case <-done:
		return time.Since(start)
	case <-t.C:
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	<-done
	tb.Fatalf("%s did not return within %s with a stopped worker (it returned %s later, once the worker was killed)",
		what, stopBound, time.Since(start)-stopBound)
	return 0
}

// TestCloseIsBoundedWithAStoppedWorker: a worker that stopped (SIGSTOP) answers nothing, not
// even go-plugin's graceful shutdown; Close asks, waits a bounded time, kills and returns.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestCloseIsBoundedWithAStoppedWorker(t *testing.T) {
	cfg := testConfig(t, livenessPlugin(t, "stopped", liveness.ModeSelfStop))
	cfg.Health.Interval = time.Hour // the stop is under test, not the health check
	h, rec := startHost(t, cfg)
	pid := stoppedWorker(t, h, rec, "stopped")
	took := boundedOrKill(t, "Close", pid, func() { assert.NoError(t, h.Close()) })
	t.Logf("Close with a stopped worker took %s", took)
	assert.False(t, processExists(pid), "the stopped worker was killed and reaped")
}

// TestReconfigureRemovingAStoppedWorkerIsBounded: removing a plugin whose worker stopped ends
// the worker without its cooperation, and Reconfigure returns.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestReconfigureRemovingAStoppedWorkerIsBounded(t *testing.T) {
	keep := keyedDriver(t, "keep", "acme.keep")
	cfg := testConfig(t, livenessPlugin(t, "stopped", liveness.ModeSelfStop), keep)
	cfg.Health.Interval = time.Hour // the stop is under test, not the health check
	h, rec := startHost(t, cfg)
	pid := stoppedWorker(t, h, rec, "stopped")
	var changes PluginChanges
	took := boundedOrKill(t, "Reconfigure", pid, func() {
		var err error
		changes, err = h.Reconfigure(context.Background(), []PluginConfig{keep})
		assert.NoError(t, err)
	})
	t.Logf("Reconfigure removing a stopped worker took %s", took)
	assert.Equal(t, []string{"stopped"}, changes.Removed)
	assert.False(t, processExists(pid))
}

// TestStoppedWorkerIsDroppedAndRestarted: a worker that stops answering is found by the health
// check, dropped from the facts at once (a decision on it denies with worker_not_running, without
// waiting for a config check that will never be answered) and restarted as a new generation.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestStoppedWorkerIsDroppedAndRestarted(t *testing.T) {
	cfg := testConfig(t, livenessPlugin(t, "stopped", liveness.ModeSelfStop))
	cfg.Health = HealthConfig{Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout}
	h, rec := startHost(t, cfg)
	pid := stoppedWorker(t, h, rec, "stopped")
	stoppedAt := time.Now()
	first := state(t, h, "stopped").Worker.Generation

	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})
	grant := leaseOn(t, "stopped", "example", `{}`)
	var reasons []string
	var slowest time.Duration
	decisions := 0
	defer func() { t.Logf("%d decisions on the stopped worker, the slowest %s", decisions, slowest) }()
	detected := waitFor(t, 30*time.Second, "a decision that denies with worker_not_running", func() bool {
		start := time.Now()
		doc, _, err := eng.Decide(t.Context(), grant, h)
		require.NoError(t, err)
		slowest = max(slowest, time.Since(start))
		decisions++
		require.False(t, doc.Allow, "a stopped worker never grants")
		reasons = doc.Reasons
		return len(reasons) == 1 && reasons[0] == "worker_not_running"
	})
	start := time.Now()
	doc, _, err := eng.Decide(t.Context(), grant, h)
	require.NoError(t, err)
	t.Logf("stopped → worker_not_running after %s (slowest decision meanwhile %s); a decision then takes %s",
		detected, slowest, time.Since(start))
	assert.False(t, doc.Allow)

	after := readyWorker(t, h, rec, "stopped", first)
	t.Logf("stopped → next generation ready after %s", time.Since(stoppedAt))
	assert.NotEqual(t, pid, after.Worker.PID)
	assert.Equal(t, string(coded.WorkerUnresponsive), after.LastErrorCode)
	assert.Contains(t, after.LastError, "health check")
	assert.False(t, processExists(pid), "the stopped worker was killed and reaped")
}

// TestMainThreadExitIsRestarted: a driver whose main thread ended while its other threads run is
// a zombie thread-group leader the kernel never reports as exited. The host drops it, kills
// what is left of it and restarts the plugin.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestMainThreadExitIsRestarted(t *testing.T) {
	cfg := testConfig(t, livenessPlugin(t, "headless", liveness.ModeMainExit))
	cfg.Health = HealthConfig{Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout}
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	w := state(t, h, "headless").Worker
	require.NotNil(t, w)
	killLeftover(t, w.PID)
	var live []string
	waitFor(t, 30*time.Second, "a zombie leader with live threads", func() bool {
		if procState(w.PID) != 'Z' {
			return false
		}
		tasks, _ := os.ReadDir(filepath.Join("/proc", strconv.Itoa(w.PID), "task"))
		live = live[:0]
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			if tid != w.PID {
				stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(w.PID), "task", task.Name(), "stat"))
				if err == nil && !strings.Contains(string(stat), ") Z ") {
					live = append(live, task.Name())
				}
			}
		}
		return len(live) > 0
	})
	leaderGone := time.Now()
	t.Logf("leader %d is a zombie, threads %v live on", w.PID, live)

	after := readyWorker(t, h, rec, "headless", w.Generation)
	t.Logf("main thread gone → next generation ready after %s", time.Since(leaderGone))
	assert.Equal(t, string(coded.WorkerUnresponsive), after.LastErrorCode)
	assert.Contains(t, after.LastError, "main thread")
	waitFor(t, stopBound, "the old worker reaped", func() bool { return !processExists(w.PID) })
}

// TestReadinessAfterStart: once every plugin has been ready, the host stays ready whatever
// plugins do afterwards, a crash-looping plugin added by Reconfigure included (its failures
// show in Plugins); with ReadinessAllPlugins it is ready only while every enabled plugin has a
// live worker.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestReadinessAfterStart(t *testing.T) {
	path, sum := driverBinary(t)
	crashing := PluginConfig{ID: "crashing", Path: path, SHA256: sum, Args: []string{asFailingDriver}}
	tests := []struct {
		name      string
		readiness string
		want      bool
	}{
		{name: "default: started once", readiness: "", want: true},
		{name: "allPlugins", readiness: ReadinessAllPlugins, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			good := keyedDriver(t, "good", "acme.good")
			cfg := testConfig(t, good)
			cfg.Readiness = tt.readiness
			h, rec := startHost(t, cfg)
			waitStarted(t, h, rec)
			require.True(t, h.Ready())
			reconfigure(t, h, good, crashing)
			waitFor(t, 30*time.Second, "the added plugin to fail twice", func() bool {
				st := state(t, h, "crashing")
				return st.Status == StatusError && st.Restarts >= 2
			})
			assert.Equal(t, tt.want, h.Ready())
		})
	}
}

// TestPinDrift: a pinned binary replaced on disk while its worker runs keeps the worker (it
// runs the pinned bytes) but shows: Reconfigure lists it under PinDrift rather than as merely
// unchanged, the plugin's state says pinDrift, and the periodic check finds it without a
// reconfiguration. Putting the pinned bytes back clears it.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestPinDrift(t *testing.T) {
	dir := t.TempDir()
	path, sum := driverCopy(t, dir, "driver")
	p := PluginConfig{ID: "p", Path: path, SHA256: sum, Args: []string{asDriver}}
	cfg := testConfig(t, p)
	cfg.Health.PinCheckInterval = 100 * time.Millisecond
	log := &testutil.SyncBuffer{}
	cfg.Logger = testLogger(t, log)
	h, rec := startHost(t, cfg)
	waitStarted(t, h, rec)
	assert.False(t, state(t, h, "p").PinDrift)
	pinned, err := os.ReadFile(path)
	require.NoError(t, err)

	require.NoError(t, os.WriteFile(path, append(pinned, "upgraded in place"...), 0o755))
	changes := reconfigure(t, h, p)
	assert.Equal(t, []string{"p"}, changes.Unchanged, "the worker runs the pinned bytes and stays")
	assert.Equal(t, []string{"p"}, changes.PinDrift)
	assert.True(t, state(t, h, "p").PinDrift)
	assert.Equal(t, StatusReady, state(t, h, "p").Status)
	assert.Contains(t, log.String(), "no longer matches its pin")

	require.NoError(t, os.WriteFile(path, pinned, 0o755))
	waitFor(t, 30*time.Second, "the periodic check to clear the drift", func() bool { return !state(t, h, "p").PinDrift })
	require.NoError(t, os.WriteFile(path, append(pinned, "again"...), 0o755))
	waitFor(t, 30*time.Second, "the periodic check to find the drift", func() bool { return state(t, h, "p").PinDrift })
}

// TestDriverFailureMessages: a failed start reads as what happened to the configured binary:
// the exit status of a driver that exited before the handshake, the configured path rather
// than the in-memory copy's, each prefix once, and no go-plugin warning about a graceful exit
// that was never asked for.
//
// Sequential: its drivers get dynamic uids, chosen per plugin id for the whole process.
func TestDriverFailureMessages(t *testing.T) {
	path, sum := driverBinary(t)
	garbage := filepath.Join(t.TempDir(), "not-an-executable")
	require.NoError(t, os.WriteFile(garbage, []byte("\x00\x01 neither ELF nor script\n"), 0o755))
	garbageSum, err := FileSHA256(garbage)
	require.NoError(t, err)
	tests := []struct {
		name    string
		plugin  PluginConfig
		want    []string
		notWant []string
	}{
		{name: "exits 3 before the handshake", plugin: PluginConfig{ID: "p", Path: path, SHA256: sum, Args: []string{asFailingDriver}},
			want:    []string{"exited before the go-plugin handshake with exit status 3"},
			notWant: []string{"driverplugin.Serve"}},
		{name: "not executable", plugin: PluginConfig{ID: "p", Path: garbage, SHA256: garbageSum},
			want:    []string{garbage, "exec format error"},
			notWant: []string{"/proc/self/fd/", "start plugin: start plugin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := &testutil.SyncBuffer{}
			cfg := testConfig(t, tt.plugin)
			cfg.Logger = testLogger(t, log)
			h, _ := startHost(t, cfg)
			var st api.PluginState
			waitFor(t, 30*time.Second, "two failed starts", func() bool {
				st = state(t, h, "p")
				return st.Status == StatusError && st.Restarts >= 1
			})
			for _, w := range tt.want {
				assert.Contains(t, st.LastError, w)
			}
			for _, w := range tt.notWant {
				assert.NotContains(t, st.LastError, w)
			}
			require.NoError(t, h.Close())
			assert.NotContains(t, log.String(), "failed to exit gracefully")
		})
	}
}
