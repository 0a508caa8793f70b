package policy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.yaml.in/yaml/v3"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy/policytest"
)

// tracingConfig reads a configuration file whose opa section is the YAML given.
func tracingConfig(t testing.TB, opa string) Config {
	t.Helper()
	var c Config
	require.NoError(t, yaml.Unmarshal([]byte("opa:\n"+opa), &c))
	return c
}

// certFiles writes a self-signed certificate and its key, and returns their paths.
func certFiles(t testing.TB) (cert, key string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	require.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(priv)
	require.NoError(t, err)
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600))
	return cert, key
}

func TestTracingConfigValid(t *testing.T) {
	cert, key := certFiles(t)
	tests := []struct {
		name  string
		opa   string
		check func(t *testing.T, tc *TracingConfig)
	}{
		{"absent: off", "  labels: {region: eu}\n", func(t *testing.T, tc *TracingConfig) {
			assert.False(t, tc.Enabled())
		}},
		{"grpc with OPA's defaults", "  distributed_tracing: {type: grpc}\n", func(t *testing.T, tc *TracingConfig) {
			assert.True(t, tc.Enabled())
			assert.Equal(t, "localhost:4317", tc.Address)
			assert.Equal(t, "authz", tc.ServiceName)
			assert.InDelta(t, 100.0, *tc.SamplePercentage, 0)
			assert.Equal(t, "off", tc.Encryption)
		}},
		{"http default address", "  distributed_tracing: {type: http}\n", func(t *testing.T, tc *TracingConfig) {
			assert.Equal(t, "localhost:4318", tc.Address)
		}},
		{"every key", `  distributed_tracing:
    type: http
    address: collector:4318
    service_name: gate
    sample_percentage: 12.5
    encryption: mtls
    allow_insecure_tls: true
    tls_cert_file: ` + cert + `
    tls_private_key_file: ` + key + `
    tls_ca_cert_file: ` + cert + `
    exclude_paths: ["/v1/capabilities", "/v1/data/**"]
    resource:
      service_version: "1.2"
      service_instance_id: i-1
      service_namespace: sandboxes
      deployment_environment: prod
    batch_span_processor_options:
      blocking: true
      batch_timeout_ms: 100
      export_timeout_ms: 1000
      max_export_batch_size: 10
      max_queue_size: 100
`, func(t *testing.T, tc *TracingConfig) {
			assert.Equal(t, "collector:4318", tc.Address)
			assert.Equal(t, "gate", tc.ServiceName)
			assert.InDelta(t, 12.5, *tc.SamplePercentage, 0)
			assert.True(t, tc.AllowInsecureTLS)
			assert.Equal(t, "prod", tc.Resource.DeploymentEnvironment)
			assert.True(t, tc.BatchSpanProcessorOptions.Blocking)
			assert.Equal(t, 100, *tc.BatchSpanProcessorOptions.MaxQueueSize)
			assert.True(t, tc.Excluded("/v1/capabilities"))
			assert.True(t, tc.Excluded("/v1/data/authz/decision"))
			assert.False(t, tc.Excluded("/v1/authorize"))
			c, err := tc.tlsConfig()
			require.NoError(t, err)
			assert.Len(t, c.Certificates, 1)
			assert.NotNil(t, c.RootCAs)
		}},
		{"tls with a CA only", "  distributed_tracing: {type: grpc, encryption: tls, tls_ca_cert_file: " + cert + "}\n", func(t *testing.T, tc *TracingConfig) {
			c, err := tc.tlsConfig()
			require.NoError(t, err)
			assert.Empty(t, c.Certificates)
			assert.False(t, c.InsecureSkipVerify)
		}},
		{"sample_percentage 0", "  distributed_tracing: {type: grpc, sample_percentage: 0}\n", func(t *testing.T, tc *TracingConfig) {
			assert.Zero(t, *tc.SamplePercentage)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tracingConfig(t, tt.opa)
			require.NoError(t, c.Validate())
			tc, err := c.Tracing()
			require.NoError(t, err)
			tt.check(t, tc)
		})
	}
}

func TestTracingConfigInvalid(t *testing.T) {
	cert, _ := certFiles(t)
	tests := []struct {
		name string
		opa  string
		want []string // each a line of the error
	}{
		{"not a mapping", "  distributed_tracing: grpc\n", []string{"opa.distributed_tracing: is a string, want a mapping"}},
		{"unknown type", "  distributed_tracing: {type: zipkin}\n", []string{`opa.distributed_tracing.type: "zipkin" is not a transport`}},
		{"no type", "  distributed_tracing: {address: collector:4317}\n", []string{"opa.distributed_tracing.type: is not set"}},
		{"unknown key", "  distributed_tracing: {type: grpc, adress: collector:4317}\n", []string{"opa.distributed_tracing.adress: is not a key"}},
		{"unknown resource key", "  distributed_tracing: {type: grpc, resource: {service_vers: x}}\n", []string{"opa.distributed_tracing.resource.service_vers: is not a key"}},
		{"unknown batch key", "  distributed_tracing: {type: grpc, batch_span_processor_options: {queue: 1}}\n", []string{"opa.distributed_tracing.batch_span_processor_options.queue: is not a key"}},
		{"resource not a mapping", "  distributed_tracing: {type: grpc, resource: x}\n", []string{"opa.distributed_tracing.resource: is a string, want a mapping"}},
		{"address with a scheme", "  distributed_tracing: {type: http, address: 'http://collector:4318'}\n", []string{"opa.distributed_tracing.address:", "give host:port"}},
		{"sample_percentage over 100", "  distributed_tracing: {type: grpc, sample_percentage: 101}\n", []string{"opa.distributed_tracing.sample_percentage: 101 is not a percentage"}},
		{"sample_percentage negative", "  distributed_tracing: {type: grpc, sample_percentage: -1}\n", []string{"opa.distributed_tracing.sample_percentage: -1 is not a percentage"}},
		{"sample_percentage a string", "  distributed_tracing: {type: grpc, sample_percentage: lots}\n", []string{"opa.distributed_tracing.sample_percentage: is a string, want a number"}},
		{"unknown encryption", "  distributed_tracing: {type: grpc, encryption: ssl}\n", []string{`opa.distributed_tracing.encryption: "ssl" is not a scheme`}},
		{"mtls without a certificate", "  distributed_tracing: {type: grpc, encryption: mtls}\n", []string{"opa.distributed_tracing.tls_cert_file: encryption mtls needs the client certificate"}},
		{"certificate without key", "  distributed_tracing: {type: grpc, encryption: tls, tls_cert_file: " + cert + "}\n", []string{"opa.distributed_tracing.tls_cert_file: tls_cert_file and tls_private_key_file go together"}},
		{"missing CA file", "  distributed_tracing: {type: grpc, encryption: tls, tls_ca_cert_file: /nonexistent/ca.pem}\n", []string{"opa.distributed_tracing.tls_ca_cert_file:", "no such file"}},
		{"files with encryption off", "  distributed_tracing: {type: grpc, tls_ca_cert_file: " + cert + "}\n", []string{"opa.distributed_tracing.tls_ca_cert_file: is set but encryption is off"}},
		{"batch size zero", "  distributed_tracing: {type: grpc, batch_span_processor_options: {max_queue_size: 0}}\n", []string{"opa.distributed_tracing.batch_span_processor_options.max_queue_size: 0: must be positive"}},
		{"bad exclude pattern", "  distributed_tracing: {type: grpc, exclude_paths: ['/v1/[']}\n", []string{"opa.distributed_tracing.exclude_paths[0]:", "is not a glob pattern"}},
		{"every problem at once", "  distributed_tracing: {type: grpc, sample_percentage: 200, encryption: ssl}\n", []string{"sample_percentage: 200", `encryption: "ssl"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tracingConfig(t, tt.opa)
			_, err := c.Tracing()
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			// The configuration's validation reports it too, beside its other checks.
			verr := c.Validate()
			require.Error(t, verr)
			assert.Contains(t, verr.Error(), strings.Split(err.Error(), "\n")[0])
		})
	}
}

func TestNewTracerProvider(t *testing.T) {
	cert, key := certFiles(t)
	tests := []struct {
		name, opa string
		on        bool
	}{
		{"off", "  labels: {}\n", false},
		{"grpc", "  distributed_tracing: {type: grpc, address: 127.0.0.1:1}\n", true},
		{"http mtls", "  distributed_tracing: {type: http, address: 127.0.0.1:1, encryption: mtls, tls_cert_file: " + cert + ", tls_private_key_file: " + key + "}\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc, err := tracingConfig(t, tt.opa).Tracing()
			require.NoError(t, err)
			tp, err := NewTracerProvider(t.Context(), tc)
			require.NoError(t, err)
			if !tt.on {
				assert.Nil(t, tp)
				return
			}
			require.NotNil(t, tp)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = tp.Shutdown(ctx) // nothing listens on port 1: the flush of no spans may fail; it must return
		})
	}
	t.Run("unreadable key pair", func(t *testing.T) {
		tc, err := tracingConfig(t, "  distributed_tracing: {type: http, encryption: mtls, tls_cert_file: "+cert+", tls_private_key_file: "+cert+"}\n").Tracing()
		require.NoError(t, err)
		_, err = NewTracerProvider(t.Context(), tc)
		require.ErrorContains(t, err, "opa.distributed_tracing.tls_cert_file")
	})
}

// TestOPAPluginsTracedWithTheProvider: with a tracer provider, OPA's bundle downloads are client
// spans of it, and carry W3C trace context to the bundle server, as under `opa run`.
func TestOPAPluginsTracedWithTheProvider(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	srv := policytest.NewBundleServer(t)
	srv.Publish(policytest.MakeBundle(t, policytest.BundleSpec{Revision: "traced-0"}))
	eng := decision.New(decision.Options{})
	src, err := New(remoteConfig(srv, "", false, ""), eng, Options{TracerProvider: tp})
	require.NoError(t, err)
	require.NoError(t, src.Start(t.Context()))
	t.Cleanup(func() { src.Close(context.Background()) })
	policytest.WaitFor(t, "the bundle to be activated", 20*time.Second, src.Ready)
	policytest.WaitFor(t, "a client span of the download", 10*time.Second, func() bool {
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindClient {
				return true
			}
		}
		return false
	})
}
