package pluginhost

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"

	"github.com/authz-dev/authz/internal/snapshot"
)

// maxConfigCacheEntries bounds the CheckConfig result cache; past it the cache starts afresh.
const maxConfigCacheEntries = 4096

// configKey names one config check: the plugin, its worker generation, the driver key and the
// SHA-256 of the config's canonical JSON.
type configKey struct {
	pluginID   string
	generation uint64
	driverKey  string
	configSum  [sha256.Size]byte
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
