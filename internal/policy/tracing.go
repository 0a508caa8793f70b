package policy

import (
	"context"
	"crypto/tls"

	_ "github.com/open-policy-agent/opa/v1/features/tracing" // OPA's HTTP clients trace through otelhttp
	"github.com/open-policy-agent/opa/v1/plugins"
	opatracing "github.com/open-policy-agent/opa/v1/tracing"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/authz-dev/authz/internal/tracing"
)

// DefaultTracingServiceName is the service name of the spans when distributed_tracing names none.
const DefaultTracingServiceName = tracing.DefaultServiceName

// TracingConfig is the distributed_tracing section of the opa section (tracing.Config).
type TracingConfig struct{ tracing.Config }

// Tracing reads the distributed_tracing section of the opa section and checks it
// (tracing.ParseConfig). A configuration without the section (or without its type) has tracing
// off.
func (c Config) Tracing() (*TracingConfig, error) {
	t, err := tracing.ParseConfig(c.OPA["distributed_tracing"])
	if t == nil {
		return nil, err
	}
	return &TracingConfig{Config: *t}, err
}

// tlsConfig is the client TLS configuration of the collector (tracing.Config.TLSConfig).
func (t *TracingConfig) tlsConfig() (*tls.Config, error) { return t.TLSConfig() }

// NewTracerProvider returns the tracer provider of t (tracing.NewProvider); nil when tracing is
// off.
func NewTracerProvider(ctx context.Context, t *TracingConfig) (*sdktrace.TracerProvider, error) {
	return tracing.NewProvider(ctx, &t.Config)
}

// managerTracing are the plugin manager options that trace OPA's plugins with tp, as `opa run`
// sets them: the manager's tracer provider, and W3C trace context on its HTTP clients. extra
// are further options of the HTTP clients' transports (remotebound.go).
func managerTracing(tp *sdktrace.TracerProvider, extra ...any) []func(*plugins.Manager) {
	var out []func(*plugins.Manager)
	var opts []any
	if tp != nil {
		out = append(out, plugins.WithTracerProvider(tp))
		opts = append(opts, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(propagation.TraceContext{}))
	}
	if opts = append(opts, extra...); len(opts) > 0 {
		out = append(out, plugins.WithDistributedTracingOpts(opatracing.NewOptions(opts...)))
	}
	return out
}
