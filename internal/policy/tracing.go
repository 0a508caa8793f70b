package policy

import (
	"context"
	"crypto/tls"

	"github.com/open-policy-agent/opa/v1/plugins"
	opatracing "github.com/open-policy-agent/opa/v1/tracing"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

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

// clientTracing, among a manager's tracing options, makes each request of its HTTP clients a
// client span of tp that sends W3C trace context (tracing.NewClientTransport), as OPA's
// otelhttp transport does under `opa run`.
type clientTracing struct{ tp trace.TracerProvider }

// managerTracing are the plugin manager options that trace OPA's plugins with tp, as `opa run`
// sets them: the manager's tracer provider, and W3C trace context on its HTTP clients. extra
// are further options of the HTTP clients' transports (remotebound.go).
func managerTracing(tp *sdktrace.TracerProvider, extra ...any) []func(*plugins.Manager) {
	var out []func(*plugins.Manager)
	var opts []any
	if tp != nil {
		out = append(out, plugins.WithTracerProvider(tp))
		opts = append(opts, clientTracing{tp: tp})
	}
	if opts = append(opts, extra...); len(opts) > 0 {
		out = append(out, plugins.WithDistributedTracingOpts(opatracing.NewOptions(opts...)))
	}
	return out
}
