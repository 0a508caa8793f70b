package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/testdrivers/hostpid"
	"github.com/authz-dev/authz/internal/testdrivers/liveness"
)

// TestChaosWithHostileDrivers ends once every behaviour it checks was seen and it killed
// hostileChaosKills workers (two per plugin on average, one every 250 ms) or ran for
// hostileChaosTime, whichever comes first; at hostileChaosBound it ends in any case, and the
// checks say what did not happen.
const (
	hostileChaosKills = 16
	hostileChaosTime  = 10 * time.Second
	hostileChaosBound = 2 * time.Minute
)

// workerSeen is one generation of a plugin's worker as the test saw it.
type workerSeen struct {
	pid   int
	badAt time.Time // first seen stopped, a zombie or gone; zero: not yet
}

// keyedLiveness is the liveness driver in mode reporting a plugin key of its own, so that two
// of them run in one host. It answers for half a second before it stops answering, long enough
// for decisions to grant and for the host to keep config check answers of it.
func keyedLiveness(tb testing.TB, id, mode string) PluginConfig {
	tb.Helper()
	p := livenessPlugin(tb, id, mode)
	p.Args = append(p.Args, "-plugin-key", "test.liveness."+id, "-after", "500ms")
	return p
}

// TestChaosWithHostileDrivers runs every hostile driver the host contains in one host at once:
// one that reaches into the host and answers forged grants on every listener it steals, one
// that leaves orphans, one that leaves an escapee at every start, one that stops itself
// (SIGSTOP) and one whose main thread ends once ready, a driver whose config checks are slow
// and one that answers every check with a 4 MiB error, and the honest example driver. Workers
// are SIGKILLed at random while decisions are made through the real engine, config checks are
// asked directly and a client asks the host's listener. Every grant is judged against what the
// test saw of its worker's generation when the decision started (not seen stopped, a zombie or
// gone; never from the driver whose checks all fail); no forged answer reaches the client; after
// Close, within its bound, no process, zombie, worker cgroup or sealed copy is left.
//
// Sequential: it checks the child processes, zombies, sealed copies and goroutines of the
// whole process.
func TestChaosWithHostileDrivers(t *testing.T) {
	// A loopback listener of the host, always answering a deny, for the steal driver to copy.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"allow":false}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()

	dir := sharedDir(t)
	stealOut := filepath.Join(dir, "steal.json")
	orphansOut := filepath.Join(dir, "orphans")
	escapeOut := filepath.Join(dir, "escapee")
	const big = 4 << 20
	cfg := testConfig(t,
		hostilePlugin(t, "steal", "steal", stealOut),
		hostilePlugin(t, "zombify", "zombify", orphansOut, "-n", "5"),
		hostilePlugin(t, "escape", "fork-escape", escapeOut),
		keyedLiveness(t, "selfstop", liveness.ModeSelfStop),
		keyedLiveness(t, "headless", liveness.ModeMainExit),
		checksPlugin(t, "slowcheck", t.TempDir(), "-delay", "500ms"),
		checksPlugin(t, "hugeerror", t.TempDir(), "-error-bytes", fmt.Sprint(big)),
		keyedDriver(t, "honest", "test.honest"),
	)
	cfg.MinBackoff, cfg.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	cfg.Health = HealthConfig{Interval: DefaultHealthInterval, Timeout: DefaultHealthTimeout}
	cfg.ConfigCheckTimeout = 2 * time.Second
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
	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 2 * time.Second})

	plugins := make([]string, 0, len(cfg.Plugins))
	for _, p := range cfg.Plugins {
		plugins = append(plugins, p.ID)
	}
	var (
		mu        sync.Mutex
		seen      = map[string]map[uint64]*workerSeen{} // plugin → generation → worker
		decisions []chaosDecision
		reasons   = map[string]int{} // deny reasons, for the figures
		kills     = map[string]int{}
		escapees  = map[int]bool{}
		orphans   = map[int]bool{}
	)
	for _, id := range plugins {
		seen[id] = map[uint64]*workerSeen{}
	}
	// markBad records that the generation was seen stopped, a zombie or gone at at.
	markBad := func(id string, gen uint64, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if w := seen[id][gen]; w != nil && w.badAt.IsZero() {
			w.badAt = at
		}
	}
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup

	// Watch every worker: note each generation's pid, and when it is first seen stopped
	// (SIGSTOP), a zombie (its main thread ended, or killed and not yet reaped) or gone. Note
	// the pids the escape and zombify drivers leave behind.
	wg.Go(func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for !stopped() {
			for _, p := range h.Plugins() {
				if p.Worker == nil {
					continue
				}
				mu.Lock()
				if seen[p.ID][p.Worker.Generation] == nil {
					seen[p.ID][p.Worker.Generation] = &workerSeen{pid: p.Worker.PID}
				}
				mu.Unlock()
			}
			mu.Lock()
			var check []struct {
				id  string
				gen uint64
				pid int
			}
			for id, gens := range seen {
				for gen, w := range gens {
					if w.badAt.IsZero() {
						check = append(check, struct {
							id  string
							gen uint64
							pid int
						}{id, gen, w.pid})
					}
				}
			}
			mu.Unlock()
			for _, c := range check {
				if s := procState(c.pid); s == 0 || s == 'T' || s == 't' || s == 'Z' || s == 'X' {
					markBad(c.id, c.gen, time.Now())
				}
			}
			for out, pids := range map[string]map[int]bool{escapeOut: escapees, orphansOut: orphans} {
				if b, err := os.ReadFile(out); err == nil {
					mu.Lock()
					for _, f := range strings.Fields(string(b)) {
						if pid, err := hostpid.Resolve(f); err == nil {
							pids[pid] = true
						}
					}
					mu.Unlock()
				}
			}
			select {
			case <-stop:
			case <-tick.C:
			}
		}
	})

	// Kill a worker of a plugin picked at random every 250 ms.
	wg.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id := plugins[rand.IntN(len(plugins))]
			var w *api.WorkerState
			for _, p := range h.Plugins() {
				if p.ID == id {
					w = p.Worker
				}
			}
			if w == nil {
				continue
			}
			mu.Lock()
			if seen[id][w.Generation] == nil {
				seen[id][w.Generation] = &workerSeen{pid: w.PID}
			}
			kills[id]++
			mu.Unlock()
			_ = syscall.Kill(w.PID, syscall.SIGKILL)
			deadline := time.Now().Add(10 * time.Second)
			for running(w.PID) && time.Now().Before(deadline) {
				time.Sleep(50 * time.Microsecond)
			}
			markBad(id, w.Generation, time.Now())
		}
	})

	// Decide from three goroutines, round robin over the plugins. Every other decision carries
	// one config whose check the host answers from what it keeps while the worker runs; the
	// others carry a config of their own, so that they ask the driver.
	var decideErrs []error
	for g := range 3 {
		wg.Go(func() {
			for i := g; !stopped(); i++ {
				id := plugins[i%len(plugins)]
				config := "kept"
				if (i/len(plugins))%2 == 1 {
					config = fmt.Sprint(g, "-", i)
				}
				req, err := snapshot.ParseRequest(strings.NewReader(`{
					"environment": {"driver": "sandbox", "config": {"decision": "` + config + `"}},
					"lease": {"leasePolicy": "ephemeral", "metadata": {"driver": "sandbox", "sandboxProviderPlugin": true,
						"pluginId": "` + id + `", "provider": "example"}}}`))
				d := chaosDecision{plugin: id, start: time.Now()}
				var doc decision.Document
				var in snapshot.Input
				if err == nil {
					doc, in, err = eng.Decide(t.Context(), req, h)
				}
				d.end = time.Now()
				d.allow = doc.Allow
				facts, _ := in["facts"].(map[string]any)
				if wd, ok := facts["worker"].(map[string]any); ok {
					d.hasWorker = true
					d.generation, _ = wd["generation"].(uint64)
				}
				mu.Lock()
				if err != nil {
					decideErrs = append(decideErrs, err)
				}
				decisions = append(decisions, d)
				for _, r := range doc.Reasons {
					reasons[r]++
				}
				mu.Unlock()
				time.Sleep(time.Millisecond) // pace: the restarts get a share of the machine
			}
		})
	}

	// Ask the checks drivers directly, each time a config of its own.
	type checkAnswer struct {
		plugin     string
		start      time.Time
		generation uint64
		valid      bool
		code       string
		errLen     int
	}
	var answers []checkAnswer
	wg.Go(func() {
		for i := 0; !stopped(); i++ {
			for _, id := range []string{"slowcheck", "hugeerror"} {
				w, ok := h.Worker(id)
				if !ok {
					continue
				}
				a := checkAnswer{plugin: id, start: time.Now(), generation: w.Generation}
				ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
				valid, err := h.ConfigValid(ctx, id, w, "example", map[string]any{"check": i})
				cancel()
				a.valid = valid
				if err != nil {
					a.code, a.errLen = string(coded.CodeOf(err)), len(err.Error())
				}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		}
	})

	// Ask the host's listener, as a client of the service would.
	var asked, forged int
	var askErrs []error
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			resp, err := client.Get("http://" + ln.Addr().String() + "/v1/authorize")
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
				err = errors.Join(err, resp.Body.Close())
			}
			mu.Lock()
			if err != nil {
				askErrs = append(askErrs, err)
			} else {
				asked++
				if strings.Contains(string(body), `"allow":true`) {
					forged++
				}
			}
			mu.Unlock()
		}
	})

	chaosStart := time.Now()
	enough := func() bool {
		mu.Lock()
		defer mu.Unlock()
		total, honest := 0, false
		for _, n := range kills {
			total += n
		}
		decidedOn := map[string]bool{}
		for _, d := range decisions {
			decidedOn[d.plugin] = true
			honest = honest || (d.plugin == "honest" && d.allow)
		}
		checkedOn := map[string]bool{}
		for _, a := range answers {
			checkedOn[a.plugin] = true
		}
		restarted := map[string]bool{}
		for _, p := range h.Plugins() {
			restarted[p.ID] = p.Restarts > 0
		}
		return (total >= hostileChaosKills || time.Since(chaosStart) >= hostileChaosTime) &&
			honest && len(decidedOn) == len(plugins) && checkedOn["slowcheck"] && checkedOn["hugeerror"] && asked > 0 &&
			restarted["selfstop"] && restarted["headless"] && len(escapees) > 0
	}
	for !enough() && time.Since(chaosStart) < hostileChaosBound {
		select {
		case <-t.Context().Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	chaosTook := time.Since(chaosStart)
	close(stop)
	wg.Wait()

	// The steal driver made its attempts at least once.
	_, err = os.Stat(stealOut)
	assert.NoError(t, err, "the steal driver reported its attempts")

	// Every grant against what was seen of its generation when the decision started.
	var grants, falseGrants int
	decided, granted := map[string]int{}, map[string]int{}
	for _, d := range decisions {
		decided[d.plugin]++
		if !d.allow {
			continue
		}
		grants++
		granted[d.plugin]++
		why := ""
		w := seen[d.plugin][d.generation]
		switch {
		case !d.hasWorker:
			why = "no worker in the input"
		case d.plugin == "hugeerror":
			why = "every config check of this driver fails"
		case w != nil && !w.badAt.IsZero() && w.badAt.Before(d.start):
			why = "its worker was seen stopped, a zombie or gone " + d.start.Sub(w.badAt).String() + " before the decision started"
		}
		if why != "" {
			falseGrants++
			t.Errorf("false grant on %s generation %d: %s", d.plugin, d.generation, why)
		}
	}
	// Every config check answered directly: a 4 MiB error is kept short and never valid; a
	// "valid" comes from a generation not yet seen stopped or gone.
	checked, validChecks, falseValid := map[string]int{}, map[string]int{}, 0
	codes := map[string]int{}
	for _, a := range answers {
		checked[a.plugin]++
		codes[a.plugin+" "+a.code]++
		if a.plugin == "hugeerror" {
			assert.False(t, a.valid, "a check answered with an error is not valid")
			assert.LessOrEqual(t, a.errLen, 8<<10, "what is kept of a %d-byte error is short", big)
		}
		if !a.valid {
			continue
		}
		validChecks[a.plugin]++
		if w := seen[a.plugin][a.generation]; w != nil && !w.badAt.IsZero() && w.badAt.Before(a.start) {
			falseValid++
			t.Errorf("config check of %s generation %d valid, though the worker was seen gone before it was asked", a.plugin, a.generation)
		}
	}
	restarts := map[string]uint64{}
	for _, p := range h.Plugins() {
		restarts[p.ID] = p.Restarts
	}
	t.Logf("hostile chaos for %s: %d decisions, %d grants (%d false), %d grants of the honest plugin", chaosTook.Round(time.Millisecond), len(decisions), grants, falseGrants, granted["honest"])
	for _, id := range plugins {
		t.Logf("  %-10s decisions %4d, grants %4d, kills %3d, restarts %3d", id, decided[id], granted[id], kills[id], restarts[id])
	}
	t.Logf("deny reasons: %v", reasons)
	t.Logf("config checks asked directly: %v (valid %v, %d false); codes %v", checked, validChecks, falseValid, codes)
	t.Logf("host listener: %d answers, %d forged, %d failed requests; %d escapees, %d orphans seen", asked, forged, len(askErrs), len(escapees), len(orphans))

	assert.Empty(t, decideErrs, "decisions end in a document")
	assert.Zero(t, falseGrants)
	assert.Zero(t, falseValid)
	assert.Zero(t, granted["hugeerror"])
	assert.Positive(t, granted["honest"], "the honest plugin keeps getting decided and granted between kills")
	for _, id := range plugins {
		assert.Positive(t, decided[id], "%s was decided on", id)
	}
	assert.Positive(t, checked["slowcheck"])
	assert.Positive(t, checked["hugeerror"])
	assert.Positive(t, asked, "the client was answered")
	assert.Zero(t, forged, "no forged answer reaches a client")
	assert.Empty(t, askErrs)
	assert.Positive(t, restarts["selfstop"], "the stopped worker was found and restarted")
	assert.Positive(t, restarts["headless"], "the worker without its main thread was found and restarted")
	assert.NotEmpty(t, escapees, "the escape driver left escapees")

	// Close within its bound; then nothing is left.
	mu.Lock()
	pids := []int{}
	for _, gens := range seen {
		for _, w := range gens {
			pids = append(pids, w.pid)
		}
	}
	for pid := range escapees {
		pids = append(pids, pid)
	}
	for pid := range orphans {
		pids = append(pids, pid)
	}
	mu.Unlock()
	start := time.Now()
	err = h.Close()
	took := time.Since(start)
	closed = true
	require.NoError(t, err, "Close returns within its bound (%s)", closeTimeout)
	t.Logf("Close took %s (bound %s)", took, closeTimeout)
	assert.LessOrEqual(t, took, closeTimeout+time.Second)
	var left []int
	for _, pid := range pids {
		if processExists(pid) {
			left = append(left, pid)
		}
	}
	slices.Sort(left)
	t.Logf("after Close: %d of %d worker, escapee and orphan pids left, %d child processes, %d zombies",
		len(left), len(pids), len(childProcesses(t)), hostZombies())
	assert.Empty(t, left, "%s", describeProcesses(left))
	assert.Empty(t, childProcesses(t), "%s", describeProcesses(childProcesses(t)))
	assert.Zero(t, hostZombies())
	assert.Empty(t, memfdsOfHost(t), "no sealed copy is held once no worker runs")
	if root := containment.setUp().cgroups; root != nil {
		_, err := os.Stat(root.dir)
		assert.True(t, os.IsNotExist(err), "no worker cgroup is left: %v", err)
	}
	require.NoError(t, srv.Close())
	client.CloseIdleConnections()
	goleak.VerifyNone(t)
}
