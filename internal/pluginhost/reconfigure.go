package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/authz-dev/authz/internal/snapshot"
)

// pluginSet is the immutable set of configured plugins. Readers load it once and use that one
// set throughout; Reconfigure publishes a new one.
type pluginSet struct {
	list []*managed // in configuration order
	byID map[string]*managed
}

func newPluginSet(list []*managed) *pluginSet {
	s := &pluginSet{list: list, byID: make(map[string]*managed, len(list))}
	for _, m := range list {
		s.byID[m.cfg.ID] = m
	}
	return s
}

// current returns the plugins configured now.
func (h *Host) current() *pluginSet { return h.set.Load() }

// lineage is what every configuration of one plugin id shares, for the life of the host (it is
// kept when the plugin is removed, so that an id added again continues from it): the last
// generation published, and the end of the last supervisor launched. Supervisors of one id
// never overlap: each waits for the end of the one before it, so generation numbers keep
// increasing and name one worker each. A config check asked about an older generation (that
// of a configuration since replaced, too) is then never answered by a newer worker.
type lineage struct {
	generation atomic.Uint64 // last generation published
	last       chan struct{} // closed when the last supervisor launched has ended (guarded by Host.mu)
}

// newManaged returns plugin p, not yet launched. restarts carries over the count of the
// configuration it replaces, so that the restart counter never goes back. Call it before the
// host is shared, or with h.mu held.
func (h *Host) newManaged(p PluginConfig, restarts uint64) *managed {
	p = clonePlugin(p)
	lin, ok := h.lineages[p.ID]
	if !ok {
		lin = &lineage{}
		h.lineages[p.ID] = lin
	}
	m := &managed{
		cfg:     p,
		enabled: p.IsEnabled(),
		log:     h.log.Named(p.ID),
		ready:   make(chan struct{}),
		lin:     lin,
		retired: make(chan struct{}),
	}
	m.changed = func() { h.changed.Notify(p.ID) }
	m.dlog = newDriverLog(m.log, h.cfg.Limits)
	status := StatusInstalled
	if !m.enabled {
		status = StatusDisabled
	}
	v := &pluginView{status: status, restarts: restarts}
	v.record = snapshot.NewPluginIndex(renderPlugin(p.ID, v))
	m.state.Store(v)
	return m
}

// clonePlugin copies what a PluginConfig shares with its caller (args, the enabled flag).
func clonePlugin(p PluginConfig) PluginConfig {
	p.Args = slices.Clone(p.Args)
	p.Sandbox = SandboxConfig{ReadPaths: slices.Clone(p.Sandbox.ReadPaths), WritePaths: slices.Clone(p.Sandbox.WritePaths), ConnectTCP: slices.Clone(p.Sandbox.ConnectTCP)}
	if p.Enabled != nil {
		enabled := *p.Enabled
		p.Enabled = &enabled
	}
	return p
}

// launch starts m's supervisor under ctx, once the previous supervisor of its id (that of a
// configuration it replaces) has ended. Call it with h.mu held, once the host has started.
func (h *Host) launch(ctx context.Context, m *managed) {
	ctx, m.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	prev := m.lin.last
	m.done, m.lin.last = done, done
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer close(done)
		if prev != nil {
			select {
			case <-prev:
			case <-ctx.Done():
				return
			}
		}
		h.wg.Add(1) // the counter is positive here: supervise calls Done
		h.supervise(ctx, m)
	}()
}

// PluginChanges says what a Reconfigure did, by plugin id, each list in configuration order
// (Removed in the order of the configuration it left).
type PluginChanges struct {
	// Added plugins were not configured before; those enabled are started.
	Added []string
	// Removed plugins are no longer configured: their worker and its descendants were ended,
	// and they are gone from Plugins, FactsFile and the decisions' facts.
	Removed []string
	// Changed plugins had another configuration (pin, path, args, key, enabled flag, user,
	// group, noNewPrivileges, limits, allowWritableBinary): the old worker was ended and, when
	// enabled, the plugin starts again as a new generation under its new configuration.
	Changed []string
	// Unchanged plugins kept their worker, its pid and generation.
	Unchanged []string
	// PinDrift are the plugins, changed or not, whose binary on disk no longer has the
	// configured SHA-256: a worker that runs keeps running the pinned bytes, and the next start
	// fails with PIN_MISMATCH until the pin is updated.
	PinDrift []string
}

// Empty reports whether nothing was added, removed or changed.
func (c PluginChanges) Empty() bool {
	return len(c.Added) == 0 && len(c.Removed) == 0 && len(c.Changed) == 0
}

// ErrStillStopping is returned (wrapped, with the context's error) when the context given to
// Reconfigure ends before every replaced worker has stopped. The new configuration is in
// effect all the same; the old workers finish stopping in the background.
var ErrStillStopping = errors.New("the new plugin configuration is in effect, but replaced workers are still stopping")

// Reconfigure applies a new list of plugins to the host, running or not, and returns what
// changed. The list is first checked with the same rules as New (Config.Validate: unique ids and
// keys, pins, paths, users); an invalid list changes nothing, and the error names each field at
// fault, e.g. "plugins[1].sha256: must be 64 hex characters".
//
// Plugins whose configuration is equal in every field keep their worker (same pid, same
// generation) and their state. Every other plugin is replaced in one step, for every decision
// at once: the new list is published with each changed plugin in its initial state (status
// installed, no manifest, no worker; status disabled when it is disabled) and without the
// removed ones. Only then are the replaced workers ended, and the new configuration of a
// changed plugin starts once its old supervisor has ended, as the next generation. So the old
// generation is retired before the new one is published, and no decision mixes the two: one
// that starts after the switch finds the plugin not ready (plugin_not_ready, then
// worker_not_running until a worker is up), or not found when it was removed; one that read the
// old generation before the switch finishes on it, except that its config check, asked of the
// plugin as configured now, fails (a deny). Plugin keys follow the rules of New: a key
// configured for a plugin, or reported by a running one, is no other plugin's; the key of a
// removed or changed plugin is free as soon as Reconfigure switched.
//
// Reconfigure returns once the replaced workers and their descendants have ended; it does not
// wait for new workers to be ready (WaitStarted does). When ctx ends first, or closeTimeout has
// passed, it returns the changes with ErrStillStopping. Every plugin's binary on disk is hashed
// again: those that no longer match their pin are listed in PinDrift (see Host.Plugins). It is safe to call concurrently with decisions, with itself
// (calls apply one after the other) and with Close (after Close it returns ErrClosed).
// BuiltinProviders and the host's other settings stay as they are (see ReplaceBuiltinProviders).
func (h *Host) Reconfigure(ctx context.Context, plugins []PluginConfig) (PluginChanges, error) {
	check := h.cfg
	check.Plugins = plugins
	check.BuiltinProviders = nil // checked when they were set
	if err := check.Validate(); err != nil {
		return PluginChanges{}, fmt.Errorf("plugin host reconfiguration refused, nothing changed: %w", err)
	}

	h.reconfMu.Lock()
	defer h.reconfMu.Unlock()
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		return PluginChanges{}, ErrClosed
	}
	var (
		changes PluginChanges
		cur     = h.current()
		list    = make([]*managed, 0, len(plugins))
		fresh   []*managed
		kept    = make(map[*managed]bool, len(cur.list))
	)
	for _, p := range plugins {
		old, ok := cur.byID[p.ID]
		switch {
		case ok && samePlugin(old.cfg, p):
			list = append(list, old)
			kept[old] = true
			changes.Unchanged = append(changes.Unchanged, p.ID)
			continue
		case ok:
			changes.Changed = append(changes.Changed, p.ID)
			m := h.newManaged(p, old.state.Load().restarts)
			list, fresh = append(list, m), append(fresh, m)
		default:
			changes.Added = append(changes.Added, p.ID)
			m := h.newManaged(p, 0)
			list, fresh = append(list, m), append(fresh, m)
		}
	}
	next := newPluginSet(list)
	var retired []*managed
	for _, m := range cur.list {
		if kept[m] {
			continue
		}
		retired = append(retired, m)
		if _, ok := next.byID[m.cfg.ID]; !ok {
			changes.Removed = append(changes.Removed, m.cfg.ID)
		}
	}

	// The switch: under keyMu, so that no listing shows a key twice and every key check after
	// it sees the new set.
	h.keyMu.Lock()
	h.set.Store(next)
	h.changed.Notify("")
	h.keyMu.Unlock()

	for _, m := range retired {
		close(m.retired)
		if m.cancel != nil {
			m.cancel() // its supervisor unpublishes and ends the worker and its descendants
		}
		h.forgetConfigChecks(m.cfg.ID, 0) // generation 0 is never a worker's: forget them all
	}
	if h.started {
		for _, m := range fresh {
			if m.enabled {
				h.launch(h.runCtx, m)
			}
		}
	}
	h.mu.Unlock()

	for _, m := range next.list {
		if h.checkPin(m) {
			changes.PinDrift = append(changes.PinDrift, m.cfg.ID)
		}
	}
	if !changes.Empty() || len(changes.PinDrift) > 0 {
		h.log.Info("plugins reconfigured", "added", changes.Added, "removed", changes.Removed,
			"changed", changes.Changed, "unchanged", len(changes.Unchanged), "pin_drift", changes.PinDrift)
	}
	// Every stop ends in a SIGKILL, so the replaced workers end within closeTimeout whatever
	// they do; a context without a deadline gets that one.
	ctx, cancel := context.WithTimeout(ctx, closeTimeout)
	defer cancel()
	for _, m := range retired {
		if m.done == nil {
			continue // never launched
		}
		select {
		case <-m.done:
		case <-ctx.Done():
			var waiting []string
			for _, m := range retired {
				if m.done != nil && !isClosed(m.done) {
					waiting = append(waiting, m.cfg.ID)
				}
			}
			return changes, fmt.Errorf("%w (%s): %w", ErrStillStopping, strings.Join(waiting, ", "), ctx.Err())
		}
	}
	return changes, nil
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// samePlugin reports whether a and b configure the plugin identically, so that its running
// worker may stay. TestSamePluginSeesEveryField fails when a field of PluginConfig is not
// compared here.
func samePlugin(a, b PluginConfig) bool {
	return a.ID == b.ID &&
		a.Path == b.Path &&
		strings.EqualFold(a.SHA256, b.SHA256) &&
		a.Key == b.Key &&
		slices.Equal(a.Args, b.Args) &&
		a.IsEnabled() == b.IsEnabled() &&
		a.AllowWritableBinary == b.AllowWritableBinary &&
		a.User == b.User &&
		a.Group == b.Group &&
		a.NoNewPrivileges == b.NoNewPrivileges &&
		a.ResourceLimits == b.ResourceLimits &&
		slices.Equal(a.Sandbox.ReadPaths, b.Sandbox.ReadPaths) &&
		slices.Equal(a.Sandbox.WritePaths, b.Sandbox.WritePaths) &&
		slices.Equal(a.Sandbox.ConnectTCP, b.Sandbox.ConnectTCP)
}

// ReplaceBuiltinProviders replaces the built-in providers reported as facts, checked as New
// checks Config.BuiltinProviders; invalid providers change nothing. Decisions that start after
// it returns see the new providers.
func (h *Host) ReplaceBuiltinProviders(providers map[string]map[string]any) error {
	check := Config{BuiltinProviders: providers}
	if err := check.Validate(); err != nil {
		return fmt.Errorf("built-in providers refused, nothing changed: %w", err)
	}
	b, err := normalizeBuiltins(providers)
	if err != nil {
		return fmt.Errorf("built-in providers refused, nothing changed: %w", err)
	}
	h.builtins.Store(&b)
	h.changed.Notify("")
	return nil
}
