package tracing

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// shutdownTimeout bounds the export of the spans still buffered when tracing stops.
const shutdownTimeout = 5 * time.Second

// Export is the span export of a service that owns its tracer provider (`authz serve`): the
// provider of its distributed_tracing section, whose export failures reach the service log.
type Export struct {
	// Provider records and exports the spans: the decisions' and those of OPA's plugins.
	Provider *sdktrace.TracerProvider
	// Exclude reports the request paths whose decisions are not traced (exclude_paths).
	Exclude func(path string) bool

	log hclog.Logger
}

// StartExport builds the tracer provider of cfg, as OPA does for `opa run`, and sends export
// failures to logger's "tracing" log instead of OpenTelemetry's default logger. It is nil when
// tracing is off. Shutdown flushes it.
func StartExport(ctx context.Context, cfg *Config, logger hclog.Logger) (*Export, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	tp, err := NewProvider(ctx, cfg)
	if err != nil {
		return nil, err
	}
	log := logger.Named("tracing")
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("distributed tracing: spans could not be exported", "error", err)
	}))
	log.Info("decisions are traced", "type", cfg.Type, "address", cfg.Address, "service_name", cfg.ServiceName,
		"sample_percentage", *cfg.SamplePercentage, "encryption", cfg.Encryption)
	return &Export{Provider: tp, Exclude: cfg.Excluded, log: log}, nil
}

// Shutdown exports the spans not yet exported, within shutdownTimeout, and stops the provider.
func (e *Export) Shutdown(ctx context.Context) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := e.Provider.Shutdown(sctx); err != nil {
		e.log.Warn("distributed tracing: spans still buffered at shutdown were lost", "error", err)
	}
}
