package pluginhost

import (
	"github.com/authz-dev/authz/driverplugin"
	"github.com/authz-dev/authz/internal/coded"
)

// publishReady makes w the plugin's ready worker with the driver's description, unless the
// plugin key the driver reported is not the plugin's to use: it differs from the key configured
// for this plugin, another plugin is configured with it, or another plugin already holds it
// (first reported, first held). The check and the publication happen under h.keyMu, and the
// readers of every plugin's key (Plugins, FactsFile) take it too, so that no listing ever
// shows one key twice.
func (h *Host) publishReady(m *managed, desc driverplugin.Description, w *worker) error {
	h.keyMu.Lock()
	defer h.keyMu.Unlock()
	if err := h.keyCollision(m, desc.Key); err != nil {
		return err
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
		case o.state.Load().key == key:
			return coded.Errorf(coded.KeyConflict, "the driver reports plugin key %s, which plugin %q already reports: "+
				"every plugin must report its own key; check which binary is configured for plugin %q", quoteShort(key), o.cfg.ID, m.cfg.ID)
		}
	}
	return nil
}
