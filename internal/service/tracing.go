package service

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
)

// tracingShutdownTimeout bounds the export of the spans still buffered when the service stops.
const tracingShutdownTimeout = 5 * time.Second

// tracing is the distributed tracing of a gate that owns its tracer provider.
type tracing struct {
	server   server.Tracing           // what the HTTP server traces with; zero when off
	provider *sdktrace.TracerProvider // also traces OPA's plugins (policy.Options); nil when off
	stop     func()                   // flushes the spans not yet exported; nil when off
}

// startTracing builds the tracer provider of the opa section's distributed_tracing, as OPA
// does for `opa run`. Without that section tracing is off: the zero tracing. stop flushes the
// spans not yet exported, within tracingShutdownTimeout.
func startTracing(ctx context.Context, cfg policy.Config, logger hclog.Logger) (tracing, error) {
	tc, err := cfg.Tracing()
	if err != nil {
		return tracing{}, &ConfigError{Err: err}
	}
	if !tc.Enabled() {
		return tracing{}, nil
	}
	tp, err := policy.NewTracerProvider(ctx, tc)
	if err != nil {
		return tracing{}, &ConfigError{Err: err}
	}
	log := logger.Named("tracing")
	// Export failures reach the service log, not OpenTelemetry's default logger.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("distributed tracing: spans could not be exported", "error", err)
	}))
	log.Info("decisions are traced", "type", tc.Type, "address", tc.Address, "service_name", tc.ServiceName,
		"sample_percentage", *tc.SamplePercentage, "encryption", tc.Encryption)
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("distributed tracing: spans still buffered at shutdown were lost", "error", err)
		}
	}
	return tracing{server: server.Tracing{Provider: tp, Exclude: tc.Excluded}, provider: tp, stop: stop}, nil
}
