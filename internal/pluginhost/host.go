// Package pluginhost owns the driver plugin processes. A Host starts every enabled plugin as a
// go-plugin subprocess (gRPC only, AutoMTLS, the binary pinned by its SHA-256, an explicit start
// timeout, no inherited environment), supervises it, restarts it with capped exponential
// back-off, and answers the snapshot.Facts questions from its current state: plugin records,
// live workers, built-in providers and driver config checks.
//
// A worker is the live process of a plugin. Each successful start gets a new generation number
// (1, 2, 3, …) and re-reads the plugin's manifest and methods; a worker that exits is gone at
// once, so a decision never reads methods of a dead process. Reconfigure applies a new plugin
// list to a running host; the generations of a plugin id keep counting across it.
//
// On Linux the host executes a sealed in-memory copy of exactly the bytes it hashed, talks to a
// worker only over the unix socket that worker itself serves (SO_PEERCRED), publishes it only
// while it still runs that copy, watches it by pidfd rather than by its pipes, runs it in its own
// process group and, as a child subreaper, ends and reaps its descendants (docs/drivers.md,
// "What the pin and the host vouch for").
package pluginhost

import (
	"context"
	"crypto/sha256"
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

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/snapshot"
)

// Plugin statuses (docs/contract.md section 4). The host uses the first four.
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

// maxConfigCacheEntries bounds the CheckConfig result cache; past it the cache starts afresh.
const maxConfigCacheEntries = 4096

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

	cacheMu sync.Mutex
	cache   map[configKey]bool

	keyMu  sync.RWMutex // held to change a plugin's key (publishReady) and to list every key
	reaper *reaper      // ends the descendants of drivers

	readyLog sync.Once // logs once that every enabled plugin has started
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
	lastErrorCode string // the code of lastError (coded.PinMismatch, …)
	key           string
	drivers       []driverplugin.EnvironmentDriver // last valid manifest
	restarts      uint64
	worker        *worker // nil: no live worker

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
	guard      *guard // ends the process when the driver abuses the host
	proc       *proc
	done       <-chan struct{}  // closed when the process has exited
	facts      *snapshot.Worker // what decisions read, rendered once
}

// alive reports whether the process still runs, asking the kernel (a pidfd) without blocking:
// a worker whose process exited is gone at once, even before its supervisor has noticed.
func (w *worker) alive() bool { return w.proc.alive() }

type configKey struct {
	pluginID   string
	generation uint64
	driverKey  string
	configSum  [sha256.Size]byte
}

// PluginState is a plugin's state as GET /v1/plugins shows it (the JSON names) and as the
// service log and tests read it.
type PluginState struct {
	ID     string `json:"id"`
	Key    string `json:"key"`
	Status string `json:"status"`
	// LastErrorCode is the code of the plugin's last failure (coded.PinMismatch,
	// coded.StartTimeout, …; "" when none): all that API callers see of it.
	LastErrorCode string `json:"lastError"`
	Restarts      uint64 `json:"restarts"`
	// Worker is the running worker, nil (JSON null) while none runs.
	Worker *WorkerState `json:"worker"`
	// LastError is the last failure itself. It names paths and digests, so it goes to the
	// service log and never to the API.
	LastError string `json:"-"`
}

// WorkerState describes a live worker.
type WorkerState struct {
	PID              int       `json:"pid"`
	Generation       uint64    `json:"generation"`
	StartedAt        time.Time `json:"startedAt"`
	SupportedMethods []string  `json:"supportedMethods"`
	// Containment is how the worker is kept out of the host's reach (containment.go).
	Containment *Containment `json:"containment"`
}

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
		cache:    map[configKey]bool{},
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
	h.wg.Add(1)
	go h.reapOrphans(ctx)
	return nil
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

// Close stops every supervisor, kills every worker and waits until the processes are reaped and
// the host's goroutines have ended. It is safe to call more than once.
func (h *Host) Close() error {
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		h.wg.Wait()
		return nil
	}
	h.closing = true
	close(h.closed)
	if h.cancel != nil {
		h.cancel()
	}
	h.mu.Unlock()
	h.wg.Wait()
	return nil
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

// Ready reports whether every enabled plugin has been ready at least once (a host with no
// enabled plugin is ready). It does not wait; WaitStarted does.
func (h *Host) Ready() bool {
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

// markReady records that the plugin has been ready once, and logs when that makes the host
// ready.
func (h *Host) markReady(m *managed) {
	m.readyOnce.Do(func() {
		close(m.ready)
		if h.Ready() {
			h.readyLog.Do(func() { h.log.Info("all enabled plugins started; ready") })
		}
	})
}

// Plugin implements snapshot.Facts: one load of the plugin's current view gives its record and
// its worker, both of one generation. It calls no plugin and copies nothing: the record and its
// index by driverKey were rendered when the view was published, and a worker whose process has
// exited is left out.
func (h *Host) Plugin(id string) (snapshot.PluginFacts, bool) {
	m, ok := h.current().byID[id]
	if !ok {
		return snapshot.PluginFacts{}, false
	}
	v := m.state.Load()
	pf := snapshot.PluginFacts{Record: v.record.Record(), Index: v.record}
	if w := v.worker; w != nil && w.alive() {
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

// ConfigValid implements snapshot.Facts: it asks worker w of the plugin whether it accepts
// config for driverKey, bounded by ConfigCheckTimeout and ctx. Answers are cached per plugin,
// worker generation, driver key and config (by the SHA-256 of its canonical JSON); errors and
// time-outs are not cached. A worker other than the running one, an error or a time-out is
// "not valid" (false with the error). A config that is not a JSON object is not valid, without
// asking the driver.
func (h *Host) ConfigValid(ctx context.Context, pluginID string, w *snapshot.Worker, driverKey string, config any) (bool, error) {
	m, ok := h.current().byID[pluginID]
	if !ok {
		return false, fmt.Errorf("%w: %q", errUnknownPlugin, pluginID)
	}
	if w == nil {
		return false, fmt.Errorf("%w: plugin %q", errNoWorker, pluginID)
	}
	cfg, ok := config.(map[string]any)
	if !ok {
		return false, nil
	}
	cur := m.state.Load().worker
	if cur == nil || !cur.alive() {
		return false, fmt.Errorf("%w: plugin %q", errNoWorker, pluginID)
	}
	if cur.generation != w.Generation {
		return false, fmt.Errorf("%w: plugin %q was asked about generation %d, the running worker is generation %d",
			errStaleWorker, pluginID, w.Generation, cur.generation)
	}
	canonical, err := json.Marshal(cfg) // map keys sorted: canonical
	if err != nil {
		return false, fmt.Errorf("plugin %q: config is not JSON: %w", pluginID, err)
	}
	key := configKey{pluginID: pluginID, generation: cur.generation, driverKey: driverKey, configSum: sha256.Sum256(canonical)}
	h.cacheMu.Lock()
	valid, hit := h.cache[key]
	h.cacheMu.Unlock()
	if hit {
		return valid, nil
	}

	cctx, cancel := context.WithTimeout(ctx, h.cfg.ConfigCheckTimeout)
	defer cancel()
	valid, reason, err := cur.driver.CheckConfig(cctx, driverKey, cfg)
	if err != nil {
		return false, fmt.Errorf("plugin %q (generation %d): check config for driver key %q: %w", pluginID, cur.generation, driverKey, err)
	}
	if !valid {
		m.log.Debug("driver does not accept the config", "driverKey", driverKey, "generation", cur.generation, "reason", reason)
	}
	if m.state.Load().worker == cur { // still the running worker: worth remembering
		h.cacheMu.Lock()
		if len(h.cache) >= maxConfigCacheEntries {
			clear(h.cache)
		}
		h.cache[key] = valid
		h.cacheMu.Unlock()
	}
	return valid, nil
}

// forgetConfigChecks drops the cached answers of older workers of the plugin.
func (h *Host) forgetConfigChecks(pluginID string, current uint64) {
	h.cacheMu.Lock()
	defer h.cacheMu.Unlock()
	for k := range h.cache {
		if k.pluginID == pluginID && k.generation != current {
			delete(h.cache, k)
		}
	}
}

// Plugins returns every configured plugin's state, in configuration order.
func (h *Host) Plugins() []PluginState {
	h.keyMu.RLock() // no key shown twice (publishReady)
	defer h.keyMu.RUnlock()
	plugins := h.current().list
	out := make([]PluginState, 0, len(plugins))
	for _, m := range plugins {
		v := m.state.Load()
		ps := PluginState{ID: m.cfg.ID, Key: v.key, Status: v.status, Restarts: v.restarts,
			LastError: v.lastError, LastErrorCode: v.lastErrorCode}
		if w := v.worker; w != nil && w.alive() {
			ps.Worker = &WorkerState{PID: w.pid, Generation: w.generation, StartedAt: w.startedAt, SupportedMethods: slices.Clone(w.methods),
				Containment: w.proc.containment()}
		}
		out = append(out, ps)
	}
	return out
}

// FactsFile renders the host's current state as a facts file (docs/contract.md section 4), so that a
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

// update publishes a modified copy of the plugin's state.
func (m *managed) update(change func(v *pluginView)) {
	m.updateMu.Lock()
	defer m.updateMu.Unlock()
	next := *m.state.Load()
	change(&next)
	next.record = snapshot.NewPluginIndex(renderPlugin(m.cfg.ID, &next))
	m.state.Store(&next)
}
