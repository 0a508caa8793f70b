package pluginhost

import (
	"context"

	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/coded"
)

// publishReady makes w the plugin's ready worker with the driver's description, unless the
// plugin key the driver reported is not the plugin's to use: it differs from the key configured
// for this plugin, another plugin is configured with it, or another plugin without a configured
// key already holds it (first reported, first held). A configured key wins whatever the start
// order: the plugin configured with it takes it from a plugin that merely reports it, whose
// worker is refused (KEY_CONFLICT) and ended. The check and the publication happen under
// h.keyMu, and the readers of every plugin's key (Plugins, FactsFile) take it too, so that no
// listing ever shows one key twice.
func (h *Host) publishReady(m *managed, desc driverplugin.Description, w *worker) error {
	h.keyMu.Lock()
	defer h.keyMu.Unlock()
	if err := h.keyCollision(m, desc.Key); err != nil {
		return err
	}
	if m.cfg.Key != "" {
		h.takeKey(m, desc.Key)
	}
	m.update(func(v *pluginView) {
		v.status = StatusReady // lastError stays: it tells why the previous worker went away
		v.key = desc.Key
		v.drivers = desc.EnvironmentDrivers
		v.worker = w
	})
	return nil
}

// keyCollision explains why plugin m may not use key. Call with h.keyMu held.
func (h *Host) keyCollision(m *managed, key string) error {
	if m.cfg.Key != "" && key != m.cfg.Key {
		return coded.Errorf(coded.KeyConflict, "the driver reports plugin key %s, but plugin %q is configured with key %q: "+
			"check that the configured binary is the intended driver", quoteShort(key), m.cfg.ID, m.cfg.Key)
	}
	for _, o := range h.current().list {
		if o == m {
			continue
		}
		switch {
		case o.cfg.Key == key:
			return coded.Errorf(coded.KeyConflict, "the driver reports plugin key %s, which is configured for plugin %q: "+
				"every plugin must report its own key; check which binary is configured for plugin %q", quoteShort(key), o.cfg.ID, m.cfg.ID)
		case o.state.Load().key == key && m.cfg.Key != key:
			return coded.Errorf(coded.KeyConflict, "the driver reports plugin key %s, which plugin %q already reports: "+
				"every plugin must report its own key; check which binary is configured for plugin %q", quoteShort(key), o.cfg.ID, m.cfg.ID)
		}
	}
	return nil
}

// takeKey ends the hold on key of every other plugin that reports it without being configured
// with it: its worker is unpublished at once (decisions deny with worker_not_running), its
// status is error with KEY_CONFLICT, and its process is ended; its next start is refused, as the
// key is configured for m. Call with h.keyMu held.
func (h *Host) takeKey(m *managed, key string) {
	for _, o := range h.current().list {
		if o == m || o.state.Load().key != key {
			continue
		}
		err := coded.Errorf(coded.KeyConflict, "the driver reports plugin key %s, which is configured for plugin %q: "+
			"every plugin must report its own key; check which binary is configured for plugin %q", quoteShort(key), m.cfg.ID, o.cfg.ID)
		var evicted *worker
		o.update(func(v *pluginView) {
			evicted = v.worker
			v.status = StatusError
			v.key = ""
			v.drivers = nil
			v.worker = nil
			v.lastError, v.lastErrorCode = capText(err.Error(), h.cfg.Limits.MaxLastErrorBytes), coded.KeyConflict
		})
		o.log.Error("plugin refused: another plugin is configured with the key its driver reports", "key", key, "configured_for", m.cfg.ID)
		if evicted != nil {
			evicted.dropped.Store(true)
			h.wg.Add(1) // under the caller's supervisor's count: Close waits for it
			go func() {
				defer h.wg.Done()
				_ = evicted.proc.Kill(context.Background())
			}()
		}
	}
}
