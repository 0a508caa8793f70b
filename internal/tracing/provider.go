package tracing

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.7.0"
	"google.golang.org/grpc/credentials"
)

// NewProvider returns the tracer provider that exports spans as t says, through OTLP, as
// OPA's own does for the same section: a batch span processor, a parent-based sampler with
// sample_percentage for new traces, and the resource's service attributes. Shut it down (which
// flushes the spans not yet exported) when the service stops. It is nil when tracing is off.
func NewProvider(ctx context.Context, t *Config) (*sdktrace.TracerProvider, error) {
	if !t.Enabled() {
		return nil, nil
	}
	tlsConfig, err := t.TLSConfig()
	if err != nil {
		return nil, err
	}
	var exp *otlptrace.Exporter
	if t.Type == "grpc" {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(t.Address)}
		if tlsConfig == nil {
			opts = append(opts, otlptracegrpc.WithInsecure())
		} else {
			opts = append(opts, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tlsConfig)))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	} else {
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(t.Address)}
		if tlsConfig == nil {
			opts = append(opts, otlptracehttp.WithInsecure())
		} else {
			opts = append(opts, otlptracehttp.WithTLSClientConfig(tlsConfig))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Section, err)
	}
	attrs := []attribute.KeyValue{semconv.ServiceNameKey.String(t.ServiceName)}
	for _, a := range []struct {
		key   attribute.Key
		value string
	}{
		{semconv.ServiceVersionKey, t.Resource.ServiceVersion}, {semconv.ServiceInstanceIDKey, t.Resource.ServiceInstanceID},
		{semconv.ServiceNamespaceKey, t.Resource.ServiceNamespace}, {semconv.DeploymentEnvironmentKey, t.Resource.DeploymentEnvironment},
	} {
		if a.value != "" {
			attrs = append(attrs, a.key.String(a.value))
		}
	}
	bo := t.BatchSpanProcessorOptions
	var batch []sdktrace.BatchSpanProcessorOption
	if bo.Blocking {
		batch = append(batch, sdktrace.WithBlocking())
	}
	if bo.BatchTimeoutMs != nil {
		batch = append(batch, sdktrace.WithBatchTimeout(time.Duration(*bo.BatchTimeoutMs)*time.Millisecond))
	}
	if bo.ExportTimeoutMs != nil {
		batch = append(batch, sdktrace.WithExportTimeout(time.Duration(*bo.ExportTimeoutMs)*time.Millisecond))
	}
	if bo.MaxExportBatchSize != nil {
		batch = append(batch, sdktrace.WithMaxExportBatchSize(*bo.MaxExportBatchSize))
	}
	if bo.MaxQueueSize != nil {
		batch = append(batch, sdktrace.WithMaxQueueSize(*bo.MaxQueueSize))
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*t.SamplePercentage/100))),
		sdktrace.WithSpanProcessor(sdktrace.NewBatchSpanProcessor(exp, batch...)),
	), nil
}

// TLSConfig is the client TLS configuration of encryption tls and mtls; nil when it is off.
func (t *Config) TLSConfig() (*tls.Config, error) {
	if t.Encryption == "off" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: t.AllowInsecureTLS} //nolint:gosec // allow_insecure_tls is the operator's explicit choice, as in OPA
	if t.TLSCACertFile != "" {
		pem, err := os.ReadFile(t.TLSCACertFile)
		if err != nil {
			return nil, fmt.Errorf("%s.tls_ca_cert_file: %w", Section, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.tls_ca_cert_file: %s holds no PEM certificate", Section, t.TLSCACertFile)
		}
	}
	if t.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.TLSCertFile, t.TLSPrivateKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.tls_cert_file: %w", Section, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
