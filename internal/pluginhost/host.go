// Package pluginhost owns the driver plugin processes. A Host starts every enabled plugin as a
// go-plugin subprocess (gRPC only, AutoMTLS, the binary pinned by its SHA-256, an explicit start
// timeout, no inherited environment), supervises it, restarts it with capped exponential
// back-off, and answers the snapshot.Facts questions from its current state: plugin records,
// live workers, built-in providers and driver config checks.
//
// A worker is the live process of a plugin. Each successful start gets a new generation number
// (1, 2, 3, …) and re-reads the plugin's manifest and methods; a worker that exits is gone at
// once, so a decision never reads methods of a dead process, and so is one that stops answering
// its health checks (it is then killed and restarted). No stop waits on a driver: a bounded
// graceful request, then SIGKILL. Reconfigure applies a new plugin
// list to a running host; the generations of a plugin id keep counting across it.
//
// On Linux the host executes a sealed in-memory copy of exactly the bytes it hashed, talks to a
// worker only over the unix socket that worker itself serves (SO_PEERCRED), publishes it only
// while it still runs that copy, watches it by pidfd rather than by its pipes, runs it in its own
// process group and, as a child subreaper, ends and reaps its descendants (docs/drivers.md,
// "What the pin and the host vouch for"). Each driver runs under a launcher that is the init of
// its own pid namespace (and, under a non-root host, user namespace), in a session of its own,
// under Landlock and a seccomp filter (docs/drivers.md, "What a driver can and cannot do"); a
// program that hosts drivers registers the launcher with sandbox.Init first thing in main.
//
// The containment itself (the launcher, its init and namespaces, limits, Landlock, seccomp, the
// contained process and its liveness) is internal/sandbox's: newProc asks sandbox.NewProcess
// for the go-plugin runner.Runner and adds what only the host knows (the pinned copy, the peer
// check of the driver's socket, its cgroup, the reaper) through a sandbox.Spec and its hooks.
//
// # Lock order
//
// A goroutine holding a lock of this list takes only locks after it, never one before it:
//
//  1. Host.reconfMu (Reconfigure).
//  2. Host.mu. Held by Start while it sets the containment up once (hostContainment.once, then
//     sandbox.Host's once; the start-up WARN takes cgroupRoot.mu) and by Reconfigure while it
//     takes keyMu and forgets retired plugins' config checks (configChecks.mu).
//  3. Host.keyMu (publishReady, the switch of Reconfigure; read by Plugins and FactsFile).
//  4. managed.updateMu (publishReady: keyMu, then the plugin's updateMu).
//  5. sandbox.Process.mu: held through Process.Start, during which the hooks a start runs take
//     reaper.mu (Started), sealedCopies.mu (Release) and cgroupRoot.mu and reaper.mu (Cleanup,
//     after a failed start). Kill and Pid take it alone.
//  6. Leaves, under which nothing is taken: reaper.mu, cgroupRoot.mu, sealedCopies.mu,
//     dynamicIDs.mu, configChecks.mu, proc.mu (the descendants killed: Kill's hooks take it with
//     Process.mu released), sandbox.Process.fdMu, the driver log's and the broker guard's.
//
// A decision takes none of them: what the kernel and the launcher report of a worker (its exit,
// its stops) reaches it through atomics (sandbox.Process.Alive, Answering; Running adds one
// pread), never a lock.
package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/changes"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Plugin statuses (docs/contract.md, "The facts (host state)"). The host uses the first four.
const (
	StatusInstalled = "installed" // enabled, first start not finished yet
	StatusReady     = "ready"     // handshake, Describe and SupportedMethods succeeded, manifest valid
	StatusDisabled  = "disabled"  // turned off in the configuration
	StatusError     = "error"     // bad pin, failed start, invalid manifest; see LastError
)

// Errors of the host. They are wrapped with details; test with errors.Is.
var (
	ErrClosed        = errors.New("plugin host is closed")
	errUnknownPlugin = errors.New("no such plugin")
	errNoWorker      = errors.New("plugin has no running worker")
	errStaleWorker   = errors.New("worker generation is no longer running")
)

// Host supervises the driver plugins of one Config. It is safe for concurrent use.
type Host struct {
	cfg      Config
	log      hclog.Logger
	set      atomic.Pointer[pluginSet] // the configured plugins; replaced whole by Reconfigure
	builtins atomic.Pointer[map[string]map[string]any]

	mu       sync.Mutex // guards started, closing, runCtx, lineages and the supervisors' handles
	started  bool
	closing  bool
	runCtx   context.Context // the supervisors' context, once started
	cancel   context.CancelFunc
	closed   chan struct{} // closed by Close
	wg       sync.WaitGroup
	lineages map[string]*lineage // by plugin id, kept after a plugin is removed
	reconfMu sync.Mutex          // serialises Reconfigure

	checks *configChecks // the config checks' answers and each plugin's share of them

	keyMu  sync.RWMutex // held to change a plugin's key (publishReady) and to list every key
	reaper *reaper      // ends the descendants of drivers

	readyLog  sync.Once     // logs once that every enabled plugin has started
	running   atomic.Bool   // set by Start
	everReady atomic.Bool   // the host has been ready since it started (ReadinessStarted)
	stopped   chan struct{} // closed once Close has seen every goroutine end (guarded by mu)

	changed changes.Listeners[string] // told the plugin id of every change of the facts ("" for any)
}

var _ snapshot.Facts = (*Host)(nil)

// managed is one configured plugin.
type managed struct {
	cfg       PluginConfig
	enabled   bool
	log       hclog.Logger
	dlog      *driverLog                 // the driver's output, relayed to log within Limits
	state     atomic.Pointer[pluginView] // read without locks by the Facts methods
	updateMu  sync.Mutex                 // serialises writers of state
	ready     chan struct{}              // closed when the plugin is ready for the first time
	changed   func()                     // tells the host's listeners that state changed
	readyOnce sync.Once

	lin     *lineage           // shared by every configuration of this plugin id
	cancel  context.CancelFunc // ends the supervisor; nil: never launched (guarded by Host.mu)
	done    chan struct{}      // closed when the supervisor has ended; nil: never launched
	retired chan struct{}      // closed when a reconfiguration took the plugin out of service
}

// pluginView is an immutable snapshot of a plugin's state. Writers publish a modified copy.
type pluginView struct {
	status        string
	lastError     string
	lastErrorCode coded.Code // the code of lastError (coded.PinMismatch, …)
	key           string
	drivers       []driverplugin.EnvironmentDriver // last valid manifest
	restarts      uint64
	worker        *worker // nil: no live worker
	pinDrift      bool    // the binary on disk no longer has the pinned SHA-256

	// record is the plugin record rendered from status, key and drivers when the view was
	// published, indexed by driverKey: one generation's record, shared by every decision that
	// reads this view, which carries only the entries of the keys it looks up.
	record *snapshot.PluginIndex
}

// worker is one live process of a plugin.
type worker struct {
	pid        int
	generation uint64
	startedAt  time.Time
	methods    []string
	driver     driverplugin.Driver
	conn       *grpc.ClientConn // the driver's connection, for health checks
	dropped    atomic.Bool      // set when the host gave up on the worker (it no longer answers)
	guard      *guard           // ends the process when the driver abuses the host
	proc       *proc
	done       <-chan struct{}  // closed when the process has exited
	facts      *snapshot.Worker // what decisions read, rendered once
}

// alive reports whether the process still runs, as the events about it said (proc.alive: its
// pidfd, the init's reports, its reaping), without a system call: a worker whose process exited
// is gone as soon as the kernel said so, before its supervisor has noticed, and so is one the
// host gave up on (it no longer answers) while it is being killed.
func (w *worker) alive() bool { return !w.dropped.Load() && w.proc.alive() }

// answering reports whether the worker is alive and its process is not stopped (SIGSTOP, a
// tracer): what a decision reads.
func (w *worker) answering() bool { return !w.dropped.Load() && w.proc.answering() }

// New checks cfg and returns a host that has started nothing yet.
func New(cfg Config) (*Host, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("plugin host configuration: %w", err)
	}
	cfg = cfg.withDefaults()
	builtins, err := normalizeBuiltins(cfg.BuiltinProviders)
	if err != nil {
		return nil, fmt.Errorf("plugin host configuration: %w", err)
	}
	h := &Host{
		cfg:      cfg,
		log:      cfg.Logger,
		closed:   make(chan struct{}),
		checks:   newConfigChecks(),
		lineages: map[string]*lineage{},
	}
	h.builtins.Store(&builtins)
	list := make([]*managed, 0, len(cfg.Plugins))
	for _, p := range cfg.Plugins {
		list = append(list, h.newManaged(p, 0))
	}
	h.set.Store(newPluginSet(list))
	return h, nil
}

// normalizeBuiltins deep-copies the built-in providers through JSON, so that they hold exactly
// the values a facts file would.
func normalizeBuiltins(in map[string]map[string]any) (map[string]map[string]any, error) {
	out := make(map[string]map[string]any, len(in))
	for key, b := range in {
		raw, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("builtinProviders[%q]: not JSON: %w", key, err)
		}
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("builtinProviders[%q]: %w", key, err)
		}
		out[key] = v
	}
	return out, nil
}

// Start launches one supervisor per enabled plugin and returns without waiting for any plugin
// (see WaitStarted). The supervisors run until Close, or until ctx is done.
func (h *Host) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closing:
		return ErrClosed
	case h.started:
		return errors.New("plugin host already started")
	}
	h.started = true
	closeInheritedOnExec()
	h.reaper = newReaper(h.log)
	ctx, h.cancel = context.WithCancel(ctx)
	h.runCtx = ctx
	for _, m := range h.current().list {
		if m.enabled {
			h.launch(ctx, m)
		}
	}
	h.wg.Add(2)
	go h.reapOrphans(ctx)
	go h.checkPinsEvery(ctx)
	h.running.Store(true)
	return nil
}

// checkPinsEvery re-hashes every enabled plugin's binary on disk every Health.PinCheckInterval
// until ctx ends (checkPin).
func (h *Host) checkPinsEvery(ctx context.Context) {
	defer h.wg.Done()
	t := time.NewTicker(h.cfg.Health.PinCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, m := range h.current().list {
			if ctx.Err() != nil {
				return
			}
			h.checkPin(m)
		}
	}
}

// checkPin hashes the enabled plugin's binary at its path and reports whether it no longer has
// the pinned SHA-256 (or cannot be read). The running worker is left alone: it runs the sealed
// copy of the pinned bytes. A change either way is logged, and Plugins shows it as pinDrift.
func (h *Host) checkPin(m *managed) bool {
	if h.cfg.InsecureSkipPinCheck || !m.enabled {
		return false
	}
	sum, err := FileSHA256(m.cfg.Path)
	drift := err != nil || !strings.EqualFold(sum, m.cfg.SHA256)
	was := m.state.Load().pinDrift
	if drift != was {
		m.update(func(v *pluginView) { v.pinDrift = drift })
	}
	switch {
	case drift && !was && err != nil:
		m.log.Warn("the plugin binary on disk can no longer be read to check its pin; the running worker keeps the pinned bytes, "+
			"and the next start will fail until the file is back", "path", m.cfg.Path, "error", err)
	case drift && !was:
		m.log.Warn("the plugin binary on disk no longer matches its pin; the running worker keeps the pinned bytes, "+
			"and the next start will fail with PIN_MISMATCH: configure the new sha256 and send SIGHUP, or put the pinned binary back",
			"path", m.cfg.Path, "sha256", sum, "pinned", m.cfg.SHA256)
	case !drift && was:
		m.log.Info("the plugin binary on disk matches its pin again", "path", m.cfg.Path)
	}
	return drift
}

// orphanReapInterval is how often the host reaps drivers' orphans that ended on their own.
const orphanReapInterval = time.Second

// reapOrphans reaps, until ctx ends, the zombies the host inherited as a child subreaper from
// its drivers, so that a driver that leaves short-lived orphans does not fill the process table.
func (h *Host) reapOrphans(ctx context.Context) {
	defer h.wg.Done()
	t := time.NewTicker(orphanReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.reaper.reapZombies()
		}
	}
}

// closeTimeout bounds Close: every worker is asked to exit, killed after stopGrace, and
// reaped; past this the host gives up waiting and says which plugins are still stopping.
const closeTimeout = stopGrace + killWait + 5*time.Second

// Close stops every supervisor, kills every worker and waits until the processes are reaped and
// the host's goroutines have ended, for closeTimeout at most: no worker can hold it up, since
// every stop ends in a SIGKILL. It is safe to call more than once.
func (h *Host) Close() error {
	h.mu.Lock()
	if !h.closing {
		h.closing = true
		close(h.closed)
		if h.cancel != nil {
			h.cancel()
		}
		h.stopped = make(chan struct{})
		go func(stopped chan<- struct{}) {
			h.wg.Wait()
			close(stopped)
		}(h.stopped)
	}
	stopped := h.stopped
	h.mu.Unlock()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case <-stopped:
		return nil
	case <-t.C:
	}
	var waiting []string
	for _, m := range h.current().list {
		if m.done != nil && !isClosed(m.done) {
			waiting = append(waiting, m.cfg.ID)
		}
	}
	if len(waiting) == 0 {
		return fmt.Errorf("plugin host closed, but after %s some of its goroutines are still ending", closeTimeout)
	}
	return fmt.Errorf("plugin host closed, but after %s these plugins are still stopping: %s", closeTimeout, strings.Join(waiting, ", "))
}

// WaitStarted waits until every enabled plugin has been ready at least once; after a
// Reconfigure meanwhile, every plugin configured now. When ctx ends first, the error names each
// plugin still waiting with its status and last error.
func (h *Host) WaitStarted(ctx context.Context) error {
wait:
	for {
		plugins := h.current().list
		for _, m := range plugins {
			if !m.enabled {
				continue
			}
			select {
			case <-m.ready:
			case <-m.retired: // reconfigured meanwhile: wait for the plugins configured now
				continue wait
			case <-h.closed:
				return ErrClosed
			case <-ctx.Done():
				var waiting []string
				for _, m := range plugins {
					select {
					case <-m.ready:
						continue
					default:
					}
					if !m.enabled {
						continue
					}
					v := m.state.Load()
					s := fmt.Sprintf("%s (status %s", m.cfg.ID, v.status)
					if v.lastError != "" {
						s += ": " + v.lastError
					}
					waiting = append(waiting, s+")")
				}
				return fmt.Errorf("waiting for plugins to start: %w; not ready yet: %s", ctx.Err(), strings.Join(waiting, "; "))
			}
		}
		return nil
	}
}

// Ready reports whether the host can serve decisions, as Config.Readiness says:
//
//   - ReadinessStarted (the default): every enabled plugin has been ready at least once (a host
//     with no enabled plugin is ready), and from then on for good. A plugin that fails later, or
//     one added by Reconfigure that never starts, shows in Plugins and in the log, and the
//     decisions that need it deny; it does not make the host unready, which would take a
//     service out of its load balancer for the failure of one driver.
//   - ReadinessAllPlugins: every enabled plugin configured now has a live worker.
//
// It does not wait; WaitStarted does.
func (h *Host) Ready() bool {
	if h.cfg.Readiness == ReadinessAllPlugins {
		return h.allLive()
	}
	if h.everReady.Load() {
		return true
	}
	if !h.allStartedOnce() {
		return false
	}
	if h.running.Load() {
		h.everReady.Store(true)
	}
	return true
}

// allStartedOnce reports whether every enabled plugin configured now has been ready once.
func (h *Host) allStartedOnce() bool {
	for _, m := range h.current().list {
		if !m.enabled {
			continue
		}
		select {
		case <-m.ready:
		default:
			return false
		}
	}
	return true
}

// allLive reports whether every enabled plugin configured now has a live worker.
func (h *Host) allLive() bool {
	for _, m := range h.current().list {
		if !m.enabled {
			continue
		}
		if w := m.state.Load().worker; w == nil || !w.alive() {
			return false
		}
	}
	return true
}

// markReady records that the plugin has been ready once, and logs when that makes the host
// ready.
func (h *Host) markReady(m *managed) {
	m.readyOnce.Do(func() {
		close(m.ready)
		if h.allStartedOnce() {
			h.everReady.Store(true)
			h.readyLog.Do(func() { h.log.Info("all enabled plugins started; ready") })
		}
	})
}

// Plugin implements snapshot.Facts: one load of the plugin's current view gives its record and
// its worker, both of one generation. It calls no plugin and copies nothing: the record and its
// index by driverKey were rendered when the view was published, and a worker whose process has
// exited or is stopped is left out.
func (h *Host) Plugin(id string) (snapshot.PluginFacts, bool) {
	m, ok := h.current().byID[id]
	if !ok {
		return snapshot.PluginFacts{}, false
	}
	v := m.state.Load()
	pf := snapshot.PluginFacts{Record: v.record.Record(), Index: v.record}
	if w := v.worker; w != nil && w.answering() {
		pf.Worker = w.facts
	}
	return pf, true
}

// renderPlugin renders the plugin record of a view.
func renderPlugin(id string, v *pluginView) map[string]any {
	entries := make([]any, 0, len(v.drivers))
	for _, e := range v.drivers {
		entry := map[string]any{"driverKey": e.DriverKey, "kind": e.Kind}
		if e.SandboxCapabilities != nil {
			// Validated: every value is a bool, so a shallow copy is a deep one.
			entry["sandboxCapabilities"] = maps.Clone(e.SandboxCapabilities)
		}
		if e.SupportsReusableLeases != nil {
			entry["supportsReusableLeases"] = *e.SupportsReusableLeases
		}
		entries = append(entries, entry)
	}
	return map[string]any{
		"id":       id,
		"key":      v.key,
		"status":   v.status,
		"manifest": map[string]any{"environmentDrivers": entries},
	}
}

// Worker returns the plugin's live worker, or false when none runs. It is for status displays
// and tests; a decision reads the plugin and its worker together through Plugin.
func (h *Host) Worker(pluginID string) (*snapshot.Worker, bool) {
	pf, ok := h.Plugin(pluginID)
	if !ok || pf.Worker == nil {
		return nil, false
	}
	return pf.Worker, true
}

// BuiltinProvider implements snapshot.Facts.
func (h *Host) BuiltinProvider(key string) (map[string]any, bool) {
	b, ok := (*h.builtins.Load())[key]
	if !ok {
		return nil, false
	}
	return snapshot.CopyDocument(b).(map[string]any), true
}

// Plugins returns every configured plugin's state, in configuration order.
func (h *Host) Plugins() []api.PluginState {
	h.keyMu.RLock() // no key shown twice (publishReady)
	defer h.keyMu.RUnlock()
	plugins := h.current().list
	out := make([]api.PluginState, 0, len(plugins))
	for _, m := range plugins {
		v := m.state.Load()
		ps := api.PluginState{ID: m.cfg.ID, Key: v.key, Status: v.status, Restarts: v.restarts,
			LastError: v.lastError, LastErrorCode: string(v.lastErrorCode), PinDrift: v.pinDrift}
		if w := v.worker; w != nil && w.alive() {
			ps.Worker = &api.WorkerState{PID: w.pid, Generation: w.generation, StartedAt: w.startedAt, SupportedMethods: slices.Clone(w.methods),
				Containment: w.proc.containment()}
		}
		out = append(out, ps)
	}
	return out
}

// FactsFile renders the host's current state as a facts file (docs/contract.md, "The facts (host state)"), so that a
// decision can be replayed with `authz decide --facts`. Workers carry their supportedMethods;
// config checks are per request and not part of the file.
func (h *Host) FactsFile() snapshot.File {
	h.keyMu.RLock() // no key shown twice (publishReady)
	defer h.keyMu.RUnlock()
	plugins, builtins := h.current().list, *h.builtins.Load()
	f := snapshot.File{
		Plugins:          make([]map[string]any, 0, len(plugins)),
		Workers:          map[string]map[string]any{},
		BuiltinProviders: make(map[string]map[string]any, len(builtins)),
	}
	for _, m := range plugins {
		v := m.state.Load()
		f.Plugins = append(f.Plugins, v.record.Record())
		if w := v.worker; w != nil && w.alive() {
			methods := make([]any, len(w.methods))
			for i, s := range w.methods {
				methods[i] = s
			}
			f.Workers[m.cfg.ID] = map[string]any{"supportedMethods": methods}
		}
	}
	for key, b := range builtins {
		f.BuiltinProviders[key] = snapshot.CopyDocument(b).(map[string]any)
	}
	return f
}

// OnFactsChange calls fn after every change of the facts: with a plugin's id when its record or
// worker changed (a worker that exited, was dropped or started; a status, manifest or error
// that changed), with "" when any may have (plugins added or removed, built-in providers
// replaced). fn must return quickly and must not block or call cancel; it runs on the goroutine
// that made the change. A decision made after fn was called sees the change.
func (h *Host) OnFactsChange(fn func(pluginID string)) (cancel func()) { return h.changed.Add(fn) }

// update publishes a modified copy of the plugin's state.
func (m *managed) update(change func(v *pluginView)) {
	m.updateMu.Lock()
	defer m.updateMu.Unlock()
	next := *m.state.Load()
	change(&next)
	next.record = snapshot.NewPluginIndex(renderPlugin(m.cfg.ID, &next))
	m.state.Store(&next)
	if m.changed != nil {
		m.changed()
	}
}
