package opaplugin

import (
	"github.com/open-policy-agent/opa/v1/plugins"

	"github.com/authz-dev/authz/internal/tracing"
)

// gateTracing traces the gate's decisions with OPA's tracer provider, the one OPA builds from
// its distributed_tracing configuration: the gate's spans go where OPA's own go, under the same
// service name and sampling. Off when OPA has no distributed_tracing.
func gateTracing(m *plugins.Manager) tracing.Decisions {
	return tracing.DecisionsOf(m.TracerProvider(), nil)
}
