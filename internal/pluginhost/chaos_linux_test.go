//go:build linux

package pluginhost

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testdrivers/identity"
	"github.com/authz-dev/authz/internal/testutil"
)

// TestChaos ends once the honest drivers granted after a kill and it killed chaosKills workers
// (four of each plugin, one every 300 ms) or ran for chaosTime, whichever comes first; at
// chaosBound it ends in any case, and the checks say what did not happen.
const (
	chaosKills = 12
	chaosTime  = 20 * time.Second
	chaosBound = 2 * time.Minute
)

// chaosDecision is one decision TestChaos made.
type chaosDecision struct {
	plugin     string
	start, end time.Time
	allow      bool
	generation uint64 // of the worker in the input; 0: none
	hasWorker  bool
	key        string
}

// TestChaos makes decisions from several goroutines through the real engine while drivers are
// SIGKILLed and restarted: one whose child holds its pipes, one that flip-flops its declaration
// and its methods across generations (no generation of it can grant), and one whose binary is
// swapped on disk for an impostor all the time. Every grant is checked against the process
// state at that instant: its generation was not yet seen dead when the decision started, and
// no grant comes from the flip-flop driver or an impostor. It ends with no process, goroutine
// or descriptor left behind.
//
// Sequential: it checks the child processes, descriptors and goroutines of the whole process.
func TestChaos(t *testing.T) {
	dir := t.TempDir()
	link, sum, flip := flippingBinary(t, dir, "swapped")
	flipDir := filepath.Join(dir, "flipflop")
	require.NoError(t, os.Mkdir(flipDir, 0o700))

	// Warm up the runtime's poller so that the descriptor count compares like with like.
	r, w, err := os.Pipe()
	require.NoError(t, err)
	_ = r.Close()
	_ = w.Close()
	fdsBefore := openDescriptors(t)

	cfg := testConfig(t,
		identityPlugin(t, "holder", "-child-holds-pipes", filepath.Join(dir, "holder-child")),
		identityPlugin(t, "flipflop", "-flipflop", flipDir),
		PluginConfig{ID: "swapped", Path: link, SHA256: sum, Args: []string{identity.Marker, "serve", "-key", "test.identity.swapped"}},
	)
	cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	cfg.Logger = testLogger(t, nil).Named("chaos")
	h, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, h.Start(t.Context()))
	closed := false
	defer func() {
		if !closed {
			_ = h.Close()
		}
	}()
	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})
	plugins := []string{"holder", "flipflop", "swapped"}
	requests := map[string]*snapshot.Request{}
	for _, id := range plugins {
		requests[id] = leaseOn(t, id, identity.DriverKey, `{}`)
	}
	waitFor(t, 60*time.Second, "every plugin ready once", func() bool {
		for _, id := range []string{"holder", "swapped"} {
			if _, ok := h.Worker(id); !ok {
				return false
			}
		}
		return true
	})

	var (
		mu        sync.Mutex
		decisions []chaosDecision
		seenDead  = map[string]map[uint64]time.Time{} // plugin → generation → first seen dead
		kills     []struct {
			plugin string
			at     time.Time
		}
		pids = map[int]bool{}
	)
	for _, id := range plugins {
		seenDead[id] = map[uint64]time.Time{}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup

	// Swap the swapped plugin's binary on disk all the time.
	stopFlipping := testutil.Repeat(t, 1, func(i int) bool {
		time.Sleep(time.Millisecond)
		flip(i)
		return true
	})
	// Kill a worker every 300 ms, round robin, and note when its death is visible.
	wg.Go(func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id := plugins[i%len(plugins)]
			var st api.PluginState
			for _, s := range h.Plugins() {
				if s.ID == id {
					st = s
				}
			}
			if st.Worker == nil {
				continue
			}
			pid, gen := st.Worker.PID, st.Worker.Generation
			mu.Lock()
			pids[pid] = true
			kills = append(kills, struct {
				plugin string
				at     time.Time
			}{id, time.Now()})
			mu.Unlock()
			_ = syscall.Kill(pid, syscall.SIGKILL)
			for running(pid) {
				time.Sleep(50 * time.Microsecond)
			}
			mu.Lock()
			seenDead[id][gen] = time.Now()
			mu.Unlock()
		}
	})
	// Decide from three goroutines, paced so that the restarts get a share of a small machine.
	for g := range 3 {
		wg.Go(func() {
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := plugins[i%len(plugins)]
				d := chaosDecision{plugin: id, start: time.Now()}
				doc, in, _ := eng.Decide(t.Context(), requests[id], h)
				d.end = time.Now()
				d.allow = doc.Allow
				facts, _ := in["facts"].(map[string]any)
				if wd, ok := facts["worker"].(map[string]any); ok {
					d.hasWorker = true
					d.generation, _ = wd["generation"].(uint64)
				}
				if rec, ok := facts["plugin"].(map[string]any); ok {
					d.key, _ = rec["key"].(string)
				}
				mu.Lock()
				decisions = append(decisions, d)
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		})
	}
	chaosStart := time.Now()
	enough := func() bool {
		mu.Lock()
		defer mu.Unlock()
		grantsAfterKills := 0
		for _, d := range decisions {
			if d.allow && len(kills) > 0 && d.start.After(kills[0].at) {
				grantsAfterKills++
			}
		}
		return (len(kills) >= chaosKills || time.Since(chaosStart) >= chaosTime) && grantsAfterKills > 0
	}
	for !enough() && time.Since(chaosStart) < chaosBound {
		select {
		case <-t.Context().Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	close(stop)
	wg.Wait()
	stopFlipping()

	// Every grant against the process state at the moment the decision started.
	var grants, falseGrants int
	for _, d := range decisions {
		if !d.allow {
			continue
		}
		grants++
		why := ""
		switch dead, ok := seenDead[d.plugin][d.generation]; {
		case !d.hasWorker:
			why = "no worker in the input"
		case ok && dead.Before(d.start):
			why = "its generation was seen dead " + d.start.Sub(dead).String() + " before the decision started"
		case d.plugin == "flipflop":
			why = "no generation of the flip-flop driver has both the method and the declaration"
		case d.key == identity.ImpostorKey:
			why = "an impostor answered"
		}
		if why != "" {
			falseGrants++
			t.Errorf("false grant on %s generation %d: %s", d.plugin, d.generation, why)
		}
	}
	// Kill to the first deny of a decision that started after the kill.
	var worst time.Duration
	byPlugin := map[string][]chaosDecision{}
	for _, d := range decisions {
		byPlugin[d.plugin] = append(byPlugin[d.plugin], d)
	}
	for _, ds := range byPlugin {
		slices.SortFunc(ds, func(a, b chaosDecision) int { return a.start.Compare(b.start) })
	}
	for _, k := range kills {
		for _, d := range byPlugin[k.plugin] {
			if d.start.After(k.at) && !d.allow {
				worst = max(worst, d.end.Sub(k.at))
				break
			}
		}
	}
	var flipGrants int
	for _, d := range byPlugin["flipflop"] {
		if d.allow {
			flipGrants++
		}
	}
	durations := make([]time.Duration, 0, len(decisions))
	for _, d := range decisions {
		durations = append(durations, d.end.Sub(d.start))
	}
	slices.Sort(durations)
	t.Logf("chaos: %d decisions, %d grants (%d false), %d kills, %d restarts of the flip-flop driver, longest kill-to-first-deny %s (decision time median %s, max %s)",
		len(decisions), grants, falseGrants, len(kills), state(t, h, "flipflop").Restarts, worst,
		durations[len(durations)/2], durations[len(durations)-1])
	assert.Zero(t, falseGrants)
	assert.Zero(t, flipGrants)
	assert.Positive(t, grants, "the honest drivers should have granted between kills")
	assert.GreaterOrEqual(t, len(kills), len(plugins), "every driver should have been killed")

	for _, s := range h.Plugins() {
		if s.Worker != nil {
			pids[s.Worker.PID] = true
		}
	}
	start := time.Now()
	require.NoError(t, h.Close())
	closed = true
	t.Logf("Close took %s", time.Since(start))
	for pid := range pids {
		assert.False(t, processExists(pid), "worker %d left behind", pid)
	}
	assert.Empty(t, childProcesses(t), "processes left behind")
	assert.LessOrEqual(t, openDescriptors(t), fdsBefore, "descriptors left open")
	goleak.VerifyNone(t)
}

// openDescriptors counts this process's open descriptors.
func openDescriptors(tb testing.TB) int {
	tb.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(tb, err)
	return len(entries)
}
