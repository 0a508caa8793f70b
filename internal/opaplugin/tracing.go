package opaplugin

import (
	"context"

	"github.com/open-policy-agent/opa/v1/plugins"
	opaserver "github.com/open-policy-agent/opa/v1/server"
	"go.opentelemetry.io/otel/trace"

	"github.com/authz-dev/authz/internal/server"
)

// gateTracing traces the gate's decisions with OPA's tracer provider, the one OPA builds from
// its distributed_tracing configuration: the gate's spans go where OPA's own go, under the same
// service name and sampling. Off when OPA has no distributed_tracing.
func gateTracing(m *plugins.Manager) server.Tracing {
	tp := m.TracerProvider()
	if tp == nil { // a nil *TracerProvider in the interface would not read as "off"
		return server.Tracing{}
	}
	return server.Tracing{Provider: tp}
}

// withTrace adds the decision's trace and span ids to its entry in OPA's decision log, as OPA
// does for its own decisions, so that a log entry leads to its trace.
func withTrace(ctx context.Context, info *opaserver.Info) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		info.TraceID, info.SpanID = sc.TraceID().String(), sc.SpanID().String()
	}
}
