package pluginhost

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestHostileDriversLeaveNothing: hostile drivers (one that reaches into the host, one that
// leaves short-lived orphans, one that leaves an escapee at every start) are killed and
// restarted over and over; every escapee ends with its worker, and after Close no process,
// zombie, worker cgroup or sealed copy is left.
//
// Sequential: it checks the child processes, zombies, sealed copies and goroutines of the
// whole process.
func TestHostileDriversLeaveNothing(t *testing.T) {
	dir := sharedDir(t)
	escapeOut := filepath.Join(dir, "escapee")
	cfg := testConfig(t,
		hostilePlugin(t, "steal", "steal", filepath.Join(dir, "steal.json")),
		hostilePlugin(t, "zombify", "zombify", filepath.Join(dir, "orphans"), "-n", "5"),
		hostilePlugin(t, "escape", "fork-escape", escapeOut),
	)
	cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	h, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, h.Start(t.Context()))
	closed := false
	defer func() {
		if !closed {
			_ = h.Close()
		}
	}()
	waitStarted(t, h, &pidRecorder{pids: map[int]bool{}})

	var escapees, workers []int
	const rounds = 6
	for round := range rounds {
		// The escapee of this generation, written after its worker started.
		w := state(t, h, "escape").Worker
		require.NotNil(t, w)
		var escapee int
		waitFor(t, 120*time.Second, "the escapee of this generation", func() bool {
			b, err := os.ReadFile(escapeOut)
			if err != nil {
				return false
			}
			pids := orphanPids(t, b)
			if len(pids) != 1 || slices.Contains(escapees, pids[0]) {
				return false
			}
			escapee = pids[0]
			return true
		})
		escapees = append(escapees, escapee)
		require.NoError(t, os.Remove(escapeOut))
		// Kill every worker; the escapee must end with its worker.
		for _, p := range h.Plugins() {
			if p.Worker != nil {
				workers = append(workers, p.Worker.PID)
				_ = syscall.Kill(p.Worker.PID, syscall.SIGKILL)
			}
		}
		waitFor(t, 30*time.Second, "the escapee to end with its worker", func() bool { return !processExists(escapee) })
		waitFor(t, 60*time.Second, "a new worker of every plugin", func() bool {
			for _, p := range h.Plugins() {
				if p.Worker == nil || slices.Contains(workers, p.Worker.PID) {
					return false
				}
			}
			return true
		})
		t.Logf("round %d: escapee %d ended with its worker", round, escapee)
	}

	require.NoError(t, h.Close())
	closed = true
	var left []int
	for _, pid := range append(escapees, workers...) {
		if processExists(pid) {
			left = append(left, pid)
		}
	}
	t.Logf("%d restarts of each driver, %d escapees, %d processes left, %d child processes, %d zombies",
		rounds, len(escapees), len(left), len(childProcesses(t)), hostZombies())
	assert.Empty(t, left, "%s", describeProcesses(left))
	assert.Empty(t, childProcesses(t), "%s", describeProcesses(childProcesses(t)))
	assert.Empty(t, memfdsOfHost(t), "no sealed copy is held once no worker runs")
	if root := containment.setUp().cgroups; root != nil {
		_, err := os.Stat(root.dir)
		assert.True(t, os.IsNotExist(err), "no worker cgroup is left: %v", err)
	}
	goleak.VerifyNone(t)
}
