//go:build linux

package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/testutil"
)

// driverCopy writes a copy of the test driver with other bytes (a trailer appended) to
// dir/name: it runs the same drivers under another pin. It returns its path and pin.
func driverCopy(tb testing.TB, dir, name string) (path, sum string) {
	tb.Helper()
	self, _ := driverBinary(tb)
	return testutil.CopyWithTrailer(tb, self, dir, name, "\x00another build of the driver")
}

// keyedDriver is the example driver reporting plugin key key.
func keyedDriver(tb testing.TB, id, key string, flags ...string) PluginConfig {
	tb.Helper()
	return driverPlugin(tb, id, append([]string{"-plugin-key", key}, flags...)...)
}

// reconfigure applies plugins, bounded in time, and fails the test on an error.
func reconfigure(tb testing.TB, h *Host, plugins ...PluginConfig) PluginChanges {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	changes, err := h.Reconfigure(ctx, plugins)
	require.NoError(tb, err)
	return changes
}

// pluginIDs lists the ids of Plugins, in order.
func pluginIDs(h *Host) []string {
	var ids []string
	for _, p := range h.Plugins() {
		ids = append(ids, p.ID)
	}
	return ids
}

// readyWorker waits until the plugin has a live worker whose generation is above after, and
// returns its state.
func readyWorker(tb testing.TB, h *Host, rec *pidRecorder, id string, after uint64) api.PluginState {
	tb.Helper()
	var st api.PluginState
	waitFor(tb, 60*time.Second, id+" ready above generation "+strconv.FormatUint(after, 10), func() bool {
		st = state(tb, h, id)
		return st.Status == StatusReady && st.Worker != nil && st.Worker.Generation > after
	})
	rec.record(h)
	return st
}

// TestReconfigureAddsRemovesAndKeeps: a plugin added is started; a plugin removed is stopped
// with its descendants before Reconfigure returns and is gone from every listing and from the
// decisions; a plugin configured as before keeps its worker, pid and generation. The new list's
// order is the listings' order.
func TestReconfigureAddsRemovesAndKeeps(t *testing.T) {
	runParallel(t)
	pidFile := filepath.Join(t.TempDir(), "child")
	keep := keyedDriver(t, "keep", "acme.keep")
	gone := identityPlugin(t, "gone", "-child-holds-pipes", pidFile)
	h, rec := startHost(t, testConfig(t, keep, gone))
	waitStarted(t, h, rec)
	before := state(t, h, "keep")
	goneWorker := state(t, h, "gone").Worker
	require.NotNil(t, goneWorker)
	child := readPids(t, pidFile)[0]
	require.True(t, running(child))

	added := keyedDriver(t, "added", "acme.added")
	changes := reconfigure(t, h, added, keyedDriver(t, "keep", "acme.keep"))
	assert.Equal(t, PluginChanges{Added: []string{"added"}, Removed: []string{"gone"}, Unchanged: []string{"keep"}}, changes)

	assert.False(t, processExists(goneWorker.PID), "the removed plugin's worker must have ended when Reconfigure returns")
	waitFor(t, 5*time.Second, "the removed worker's child to end", func() bool { return !running(child) })
	_, ok := h.Plugin("gone")
	assert.False(t, ok, "a removed plugin is not a fact")
	assert.Equal(t, []string{"added", "keep"}, pluginIDs(h))
	for _, rec := range h.FactsFile().Plugins {
		assert.NotEqual(t, "gone", rec["id"])
	}
	assert.NotContains(t, h.FactsFile().Workers, "gone")

	st := readyWorker(t, h, rec, "added", 0)
	assert.Equal(t, "acme.added", st.Key)
	after := state(t, h, "keep")
	require.NotNil(t, after.Worker)
	assert.Equal(t, before.Worker.PID, after.Worker.PID, "an unchanged plugin keeps its worker")
	assert.Equal(t, before.Worker.Generation, after.Worker.Generation)
	assert.Equal(t, before.Worker.StartedAt, after.Worker.StartedAt)
	assert.Equal(t, before.Restarts, after.Restarts)

	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})
	doc, _, err := eng.Decide(t.Context(), leaseOn(t, "gone", "identity", `{}`), h)
	require.NoError(t, err)
	assert.False(t, doc.Allow)
	assert.Equal(t, []string{"plugin_not_found"}, doc.Reasons)
	doc, _, err = eng.Decide(t.Context(), leaseOn(t, "added", "example", `{}`), h)
	require.NoError(t, err)
	assert.True(t, doc.Allow, "the added plugin grants: %+v", doc)
}

// TestReconfigureRepinsToNewBinary: a plugin re-pinned to another binary (other bytes, another
// digest) is restarted as the next generation, running exactly the new bytes under its new
// arguments; its old worker has ended when Reconfigure returns, and the other plugin is not
// touched. A pin that does not match the file refuses the start (PIN_MISMATCH).
func TestReconfigureRepinsToNewBinary(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t, keyedDriver(t, "p", "acme.old"), keyedDriver(t, "other", "acme.other")))
	waitStarted(t, h, rec)
	before := state(t, h, "p")
	other := state(t, h, "other")
	_, selfSum := driverBinary(t)
	exeSum, err := FileSHA256("/proc/" + strconv.Itoa(before.Worker.PID) + "/exe")
	require.NoError(t, err)
	require.Equal(t, selfSum, exeSum)

	path, sum := driverCopy(t, t.TempDir(), "driver-v2")
	require.NotEqual(t, selfSum, sum)
	repinned := PluginConfig{ID: "p", Path: path, SHA256: sum, Args: []string{asDriver, "-plugin-key", "acme.new"}}
	changes := reconfigure(t, h, repinned, keyedDriver(t, "other", "acme.other"))
	assert.Equal(t, PluginChanges{Changed: []string{"p"}, Unchanged: []string{"other"}}, changes)
	assert.False(t, processExists(before.Worker.PID), "the old generation must have ended when Reconfigure returns")

	after := readyWorker(t, h, rec, "p", 0)
	assert.Equal(t, before.Worker.Generation+1, after.Worker.Generation, "the generations of an id keep counting")
	assert.NotEqual(t, before.Worker.PID, after.Worker.PID)
	assert.Equal(t, "acme.new", after.Key)
	assert.Equal(t, before.Restarts, after.Restarts, "a reconfiguration is not a crash")
	exeSum, err = FileSHA256("/proc/" + strconv.Itoa(after.Worker.PID) + "/exe")
	require.NoError(t, err)
	assert.Equal(t, sum, exeSum, "the worker runs the new binary's bytes")
	assert.Equal(t, other.Worker.PID, state(t, h, "other").Worker.PID)

	// Pinned to the old digest, the new file is refused.
	wrong := repinned
	wrong.SHA256 = selfSum
	changes = reconfigure(t, h, wrong, keyedDriver(t, "other", "acme.other"))
	assert.Equal(t, []string{"p"}, changes.Changed)
	waitFor(t, 30*time.Second, "a pin mismatch", func() bool {
		st := state(t, h, "p")
		return st.Status == StatusError && st.LastErrorCode == string(coded.PinMismatch)
	})
	assert.False(t, processExists(after.Worker.PID))
	assert.Nil(t, state(t, h, "p").Worker)
}

// TestReconfigureDisablesAndEnables: disabling a plugin stops its worker and shows it disabled;
// enabling it again starts the next generation (not generation 1 again: a config check asked
// about an old generation is never answered by a new worker).
func TestReconfigureDisablesAndEnables(t *testing.T) {
	runParallel(t)
	p := keyedDriver(t, "p", "acme.p")
	h, rec := startHost(t, testConfig(t, p))
	waitStarted(t, h, rec)
	before := state(t, h, "p")

	off := false
	disabled := p
	disabled.Enabled = &off
	assert.Equal(t, []string{"p"}, reconfigure(t, h, disabled).Changed)
	assert.False(t, processExists(before.Worker.PID))
	st := state(t, h, "p")
	assert.Equal(t, StatusDisabled, st.Status)
	assert.Nil(t, st.Worker)
	assert.Empty(t, h.FactsFile().Workers)

	assert.Equal(t, []string{"p"}, reconfigure(t, h, p).Changed)
	after := readyWorker(t, h, rec, "p", 0)
	assert.Equal(t, before.Worker.Generation+1, after.Worker.Generation)

	// Removed and added again, it continues from there too.
	assert.Equal(t, []string{"p"}, reconfigure(t, h).Removed)
	assert.Empty(t, h.Plugins())
	assert.Equal(t, []string{"p"}, reconfigure(t, h, p).Added)
	again := readyWorker(t, h, rec, "p", 0)
	assert.Equal(t, after.Worker.Generation+1, again.Worker.Generation)
}

// TestReconfigureInvalidListChangesNothing: a list that New would refuse is refused whole, with
// an error naming the field; no plugin is started, stopped or restarted. The same list again
// changes nothing either.
func TestReconfigureInvalidListChangesNothing(t *testing.T) {
	runParallel(t)
	a := keyedDriver(t, "a", "acme.a")
	b := keyedDriver(t, "b", "acme.b")
	h, rec := startHost(t, testConfig(t, a, b))
	waitStarted(t, h, rec)
	before := h.Plugins()

	with := func(p PluginConfig, change func(p *PluginConfig)) PluginConfig {
		p = clonePlugin(p)
		change(&p)
		return p
	}
	added := keyedDriver(t, "c", "acme.c")
	tests := []struct {
		name    string
		plugins []PluginConfig
		field   string
	}{
		{name: "duplicate id", plugins: []PluginConfig{a, with(added, func(p *PluginConfig) { p.ID = "a" })}, field: "plugins[1].id"},
		{name: "empty id", plugins: []PluginConfig{with(added, func(p *PluginConfig) { p.ID = "" }), a}, field: "plugins[0].id"},
		{name: "bad hex pin", plugins: []PluginConfig{a, with(b, func(p *PluginConfig) { p.SHA256 = "zz" + p.SHA256[2:] })}, field: "plugins[1].sha256"},
		{name: "short pin", plugins: []PluginConfig{with(a, func(p *PluginConfig) { p.SHA256 = "abc" }), b}, field: "plugins[0].sha256"},
		{name: "duplicate key", plugins: []PluginConfig{
			with(a, func(p *PluginConfig) { p.Key = "acme.a" }), with(added, func(p *PluginConfig) { p.Key = "acme.a" }),
		}, field: "plugins[1].key"},
		{name: "relative path", plugins: []PluginConfig{a, b, with(added, func(p *PluginConfig) { p.Path = "driver" })}, field: "plugins[2].path"},
		{name: "unknown user", plugins: []PluginConfig{with(a, func(p *PluginConfig) { p.User = "no-such-user-authz" })}, field: "plugins[0].user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changes, err := h.Reconfigure(t.Context(), tt.plugins)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.field+": ")
			assert.Contains(t, err.Error(), "nothing changed")
			assert.Equal(t, PluginChanges{}, changes)
			assert.Equal(t, before, h.Plugins())
		})
	}

	changes := reconfigure(t, h, keyedDriver(t, "a", "acme.a"), keyedDriver(t, "b", "acme.b"))
	assert.True(t, changes.Empty())
	assert.Equal(t, []string{"a", "b"}, changes.Unchanged)
	assert.Equal(t, before, h.Plugins())
}

// TestReconfigureKeepsKeysUnique: a plugin added with a configured key that a running plugin
// (without a configured key) already reports takes the key: the running one is refused
// (KEY_CONFLICT) and loses its worker, and no listing shows the key twice; once the other is
// removed, the added plugin keeps its worker.
func TestReconfigureKeepsKeysUnique(t *testing.T) {
	runParallel(t)
	holder := keyedDriver(t, "holder", "acme.shared")
	h, rec := startHost(t, testConfig(t, holder))
	waitStarted(t, h, rec)

	claimer := keyedDriver(t, "claimer", "acme.shared")
	claimer.Key = "acme.shared"
	assert.Equal(t, []string{"claimer"}, reconfigure(t, h, holder, claimer).Added)
	waitFor(t, 30*time.Second, "claimer ready, holder KEY_CONFLICT", func() bool {
		var shown int
		for _, p := range h.Plugins() {
			if p.Key == "acme.shared" {
				shown++
			}
		}
		require.LessOrEqual(t, shown, 1, "no listing shows a key twice")
		return state(t, h, "claimer").Status == StatusReady && state(t, h, "holder").LastErrorCode == string(coded.KeyConflict)
	})
	st := readyWorker(t, h, rec, "claimer", 0)
	assert.Equal(t, "acme.shared", st.Key)
	assert.Nil(t, state(t, h, "holder").Worker)
	assert.Empty(t, state(t, h, "holder").Key)

	assert.Equal(t, PluginChanges{Removed: []string{"holder"}, Unchanged: []string{"claimer"}}, reconfigure(t, h, claimer))
	assert.Equal(t, st.Worker.PID, readyWorker(t, h, rec, "claimer", 0).Worker.PID)
}

// TestReconfigureBeforeStart: a host reconfigured before Start starts the new list.
//
// Sequential: it checks the child processes and goroutines of the whole process.
func TestReconfigureBeforeStart(t *testing.T) {
	h, err := New(testConfig(t, keyedDriver(t, "a", "acme.a")))
	require.NoError(t, err)
	changes, err := h.Reconfigure(t.Context(), []PluginConfig{keyedDriver(t, "b", "acme.b")})
	require.NoError(t, err)
	assert.Equal(t, PluginChanges{Added: []string{"b"}, Removed: []string{"a"}}, changes)
	assert.Equal(t, []string{"b"}, pluginIDs(h))
	rec := &pidRecorder{pids: map[int]bool{}}
	t.Cleanup(func() {
		require.NoError(t, h.Close())
		assert.Empty(t, childProcesses(t))
		goleak.VerifyNone(t)
	})
	require.NoError(t, h.Start(t.Context()))
	waitStarted(t, h, rec)
	assert.Equal(t, StatusReady, state(t, h, "b").Status)
}

// reconfigDecision is one decision made while the plugin was reconfigured.
type reconfigDecision struct {
	allow      bool
	reasons    []string
	key        string // of the plugin record in the input
	status     string // of the plugin record in the input
	generation uint64 // of the worker in the input; 0: none
}

// TestReconfigureNeverMixesGenerations: decisions run from several goroutines while one plugin
// is switched back and forth between two configurations: an honest driver (plugin key
// acme.honest, grants duplex) and another binary that declares duplex without implementing it
// (acme.lying, never grants). Every input carries a plugin record and a worker of the same
// configuration: a worker's generation always ran under the key its record shows. Only the
// honest configuration grants; between the two, decisions deny as not ready or not running.
func TestReconfigureNeverMixesGenerations(t *testing.T) {
	runParallel(t)
	honest := keyedDriver(t, "p", "acme.honest")
	path, sum := driverCopy(t, t.TempDir(), "lying-driver")
	lying := PluginConfig{ID: "p", Path: path, SHA256: sum, Args: []string{asDriver, "-plugin-key", "acme.lying", "-omit-method", "duplexChannelOpen"}}
	h, rec := startHost(t, testConfig(t, honest))
	waitStarted(t, h, rec)
	eng := decisiontest.EmbeddedEngine(t, decision.Options{ConfigCheckTimeout: 5 * time.Second})
	req := leaseOn(t, "p", "example", `{}`)

	var (
		mu        sync.Mutex
		decisions []reconfigDecision
		keyOf     = map[uint64]string{} // generation → the plugin key it reported
	)
	note := func() api.PluginState {
		st := state(t, h, "p")
		mu.Lock()
		keyOf[st.Worker.Generation] = st.Key
		mu.Unlock()
		return st
	}
	last := note()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt() // also when the test fails early
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				doc, in, err := eng.Decide(t.Context(), req, h)
				if !assert.NoError(t, err) {
					return
				}
				d := reconfigDecision{allow: doc.Allow, reasons: doc.Reasons}
				facts, _ := in["facts"].(map[string]any)
				if rec, ok := facts["plugin"].(map[string]any); ok {
					d.key, _ = rec["key"].(string)
					d.status, _ = rec["status"].(string)
				}
				if w, ok := facts["worker"].(map[string]any); ok {
					d.generation, _ = w["generation"].(uint64)
				}
				mu.Lock()
				decisions = append(decisions, d)
				mu.Unlock()
				time.Sleep(time.Millisecond) // paced, so that the starts get a share of a small machine
			}
		})
	}
	// decided waits (bounded) until a few decisions ran on the current configuration's worker.
	decided := func(gen uint64) {
		waitFor(t, 30*time.Second, fmt.Sprintf("decisions on generation %d", gen), func() bool {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, d := range decisions {
				if d.generation == gen {
					n++
				}
			}
			return n >= 10
		})
	}
	const switches = 6
	var stopping, starting []time.Duration
	for i := range switches {
		decided(last.Worker.Generation)
		next := lying
		if i%2 == 1 {
			next = honest
		}
		start := time.Now()
		assert.Equal(t, []string{"p"}, reconfigure(t, h, next).Changed)
		stopping = append(stopping, time.Since(start))
		readyWorker(t, h, rec, "p", last.Worker.Generation)
		starting = append(starting, time.Since(start))
		last = note()
	}
	decided(last.Worker.Generation)
	halt()

	var grants, lyingDenies, gapDenies int
	for _, d := range decisions {
		if d.generation != 0 {
			want, known := keyOf[d.generation]
			if assert.True(t, known, "generation %d was never published as ready", d.generation) {
				assert.Equal(t, want, d.key, "generation %d ran as %s, but the record beside it is of %q", d.generation, want, d.key)
			}
		}
		switch {
		case d.allow:
			grants++
			assert.Equal(t, "acme.honest", d.key, "a grant that is not the honest configuration's")
			assert.Equal(t, "acme.honest", keyOf[d.generation], "a grant by a generation of the lying configuration")
		case d.key == "acme.lying":
			lyingDenies++
			assert.Subset(t, []string{"method_not_verified", "worker_not_running", "capability_narrowed"}, d.reasons)
		default:
			gapDenies++
			assert.Subset(t, []string{"plugin_not_ready", "worker_not_running", "capability_narrowed"}, d.reasons, "%+v", d)
		}
	}
	t.Logf("%d decisions over %d switches: %d grants, %d denies by the lying configuration, %d other denies; "+
		"Reconfigure returned after %v, the new generation was ready after %v",
		len(decisions), switches, grants, lyingDenies, gapDenies, stopping, starting)
	assert.Positive(t, grants)
	assert.Positive(t, lyingDenies)
	assert.Equal(t, uint64(switches+1), last.Worker.Generation, "one generation per configuration")
}

// TestReconfigureConcurrentCallsAndClose: Reconfigure called from several goroutines at once
// applies the lists one after the other, and Close in the middle of them ends everything: each
// call returns nil or ErrClosed, no process or goroutine is left behind (startHost checks).
func TestReconfigureConcurrentCallsAndClose(t *testing.T) {
	runParallel(t)
	a := keyedDriver(t, "a", "acme.a")
	b := keyedDriver(t, "b", "acme.b")
	bRejecting := keyedDriver(t, "b", "acme.b", "-reject-config")
	lists := [][]PluginConfig{{a}, {a, b}, {bRejecting}, {bRejecting, a}, {}}
	h, rec := startHost(t, testConfig(t, a))

	run := func(rounds int, closeAfter bool) {
		var wg sync.WaitGroup
		var returned atomic.Int64 // calls that returned
		for g := range 3 {
			wg.Go(func() {
				for i := range rounds {
					_, err := h.Reconfigure(t.Context(), lists[(g+i)%len(lists)])
					returned.Add(1)
					if closeAfter && errors.Is(err, ErrClosed) {
						return
					}
					assert.NoError(t, err)
					rec.record(h)
					time.Sleep(time.Duration(20*g) * time.Millisecond)
				}
			})
		}
		if closeAfter {
			// Close once a few calls returned, while the others are still coming.
			waitFor(t, 60*time.Second, "a few Reconfigure calls", func() bool { return returned.Load() >= 3 })
			require.NoError(t, h.Close())
		}
		wg.Wait()
	}
	run(6, false)

	// Serialised: the last call's list is what runs.
	final := reconfigure(t, h, a, b)
	assert.Len(t, slices.Concat(final.Added, final.Changed, final.Unchanged), 2, "%+v", final)
	waitStarted(t, h, rec)
	for _, id := range []string{"a", "b"} {
		st := state(t, h, id)
		assert.Equal(t, StatusReady, st.Status, id)
	}
	assert.Equal(t, []string{"a", "b"}, pluginIDs(h))

	run(20, true)
	_, err := h.Reconfigure(t.Context(), lists[1])
	assert.ErrorIs(t, err, ErrClosed)
	assert.Empty(t, slices.DeleteFunc(h.Plugins(), func(p api.PluginState) bool { return p.Worker == nil }), "no worker after Close")
}

// TestReplaceBuiltinProviders: invalid providers are refused whole with the field named; valid
// ones replace the old in BuiltinProvider and FactsFile.
func TestReplaceBuiltinProviders(t *testing.T) {
	cfg := testConfig(t)
	cfg.BuiltinProviders = map[string]map[string]any{"fake": {"execute": true}}
	h, err := New(cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, h.Close()) }()

	tests := []struct {
		name      string
		providers map[string]map[string]any
		field     string
	}{
		{name: "empty key", providers: map[string]map[string]any{"": {}}, field: `builtinProviders: provider keys must not be empty`},
		{name: "null provider", providers: map[string]map[string]any{"other": nil}, field: `builtinProviders.other: must be an object`},
		{name: "unknown field", providers: map[string]map[string]any{"other": {"f": func() {}}}, field: `builtinProviders.other.f: unknown field`},
		{name: "not a boolean", providers: map[string]map[string]any{"other": {"execute": "yes"}}, field: `builtinProviders.other.execute`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := h.ReplaceBuiltinProviders(tt.providers)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.field)
			b, ok := h.BuiltinProvider("fake")
			assert.True(t, ok)
			assert.Equal(t, map[string]any{"execute": true}, b)
		})
	}

	next := map[string]map[string]any{"other": {"execute": false, "supportsReusableLeases": true}}
	require.NoError(t, h.ReplaceBuiltinProviders(next))
	next["other"]["execute"] = true // the host holds its own copy
	_, ok := h.BuiltinProvider("fake")
	assert.False(t, ok)
	b, ok := h.BuiltinProvider("other")
	assert.True(t, ok)
	assert.Equal(t, map[string]any{"execute": false, "supportsReusableLeases": true}, b)
	assert.Equal(t, map[string]map[string]any{"other": {"execute": false, "supportsReusableLeases": true}}, h.FactsFile().BuiltinProviders)
}

// TestWaitStartedFollowsReconfigure: WaitStarted, waiting for a plugin that never starts, waits
// for the plugins configured now once a Reconfigure replaced it: it returns when those are
// ready, not before.
func TestWaitStartedFollowsReconfigure(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t, driverPlugin(t, "hangs", "-hang-at-start")))
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		waited <- h.WaitStarted(ctx)
	}()
	select {
	case err := <-waited:
		t.Fatalf("WaitStarted returned %v before any plugin was ready", err)
	case <-time.After(200 * time.Millisecond):
	}
	assert.Equal(t, PluginChanges{Added: []string{"a"}, Removed: []string{"hangs"}}, reconfigure(t, h, keyedDriver(t, "a", "acme.a")))
	require.NoError(t, <-waited)
	assert.Equal(t, StatusReady, state(t, h, "a").Status, "WaitStarted returned before the plugin configured now was ready")
	rec.record(h)
}

// TestReconfigureReturnsWhileStillStopping: when its context ends before a replaced worker
// has stopped, Reconfigure returns the changes with ErrStillStopping and the context's error;
// the new list is in effect and the worker stops all the same.
func TestReconfigureReturnsWhileStillStopping(t *testing.T) {
	runParallel(t)
	h, rec := startHost(t, testConfig(t, keyedDriver(t, "a", "acme.a")))
	waitStarted(t, h, rec)
	pid := state(t, h, "a").Worker.PID

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	changes, err := h.Reconfigure(ctx, nil)
	require.ErrorIs(t, err, ErrStillStopping)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "(a)")
	assert.Equal(t, PluginChanges{Removed: []string{"a"}}, changes)
	assert.Empty(t, h.Plugins())
	waitFor(t, 30*time.Second, "the removed worker to end", func() bool { return !processExists(pid) })
}

// TestReconfigureDuringStartIsQuick: a plugin removed while its worker is still being set up
// (pin checked, process about to start or starting) stops at once, not at the start timeout.
//
// Sequential: it checks the child processes of the whole test process.
func TestReconfigureDuringStartIsQuick(t *testing.T) {
	cfg := testConfig(t, driverPlugin(t, "hangs", "-hang-at-start"))
	cfg.StartTimeout = time.Minute
	h, _ := startHost(t, cfg)
	for i := range 3 {
		start := time.Now()
		changes := reconfigure(t, h, keyedDriver(t, "hangs", "acme.hangs", "-hang-at-start", "-config-delay", strconv.Itoa(i)+"s"))
		assert.Equal(t, []string{"hangs"}, changes.Changed)
		took := time.Since(start)
		t.Logf("replaced a starting plugin in %s", took)
		assert.Less(t, took, 10*time.Second, "Reconfigure must not wait for the start timeout")
	}
	start := time.Now()
	reconfigure(t, h)
	assert.Less(t, time.Since(start), 10*time.Second)
	assert.Empty(t, childProcesses(t))
}
