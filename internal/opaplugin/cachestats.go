package opaplugin

import "github.com/authz-dev/authz/internal/decision"

// CacheStats are the decision cache's counters of the active policy's engine, for GET /metrics
// (authz_decision_cache_*_total), as under `authz serve`. Each policy the gate activates has an
// engine of its own, whose counters start at zero: Prometheus reads the drop as a counter reset.
func (g *gate) CacheStats() decision.CacheStats { return g.active.Load().engine.CacheStats() }
