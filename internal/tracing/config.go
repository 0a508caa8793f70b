package tracing

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/gobwas/glob"

	"github.com/authz-dev/authz/internal/configcheck"
)

// Defaults of distributed_tracing, those of OPA, except the service name.
const (
	DefaultServiceName = "authz"
	defaultGRPCAddress = "localhost:4317"
	defaultHTTPAddress = "localhost:4318"
)

// Config is the distributed_tracing section of the opa section (OPA's, read the same way), with
// the keys and meaning OPA gives them. Tracing is off when Type is "" (the section absent, or without a type).
type Config struct {
	// Type is the OTLP transport: "grpc" or "http" (protobuf over HTTP); "" turns tracing off.
	Type string `json:"type"`
	// Address is the collector's host:port (localhost:4317 for grpc, localhost:4318 for http).
	Address string `json:"address"`
	// ServiceName is the resource's service.name ("authz").
	ServiceName string `json:"service_name"`
	// SamplePercentage is the share of new traces recorded, 0 to 100 (100). A caller's
	// traceparent decides for its own trace: sampled or not, the decision follows it.
	SamplePercentage *float64 `json:"sample_percentage"`
	// Encryption is "off", "tls" or "mtls" ("off").
	Encryption string `json:"encryption"`
	// AllowInsecureTLS skips the verification of the collector's certificate.
	AllowInsecureTLS bool `json:"allow_insecure_tls"`
	// TLSCertFile and TLSPrivateKeyFile are the client certificate (mtls).
	TLSCertFile       string `json:"tls_cert_file"`
	TLSPrivateKeyFile string `json:"tls_private_key_file"`
	// TLSCACertFile is the CA bundle that verifies the collector (the system's when empty).
	TLSCACertFile string `json:"tls_ca_cert_file"`
	// ExcludePaths are glob patterns ('/' separates segments, ** spans them) of request paths
	// whose decisions are not traced.
	ExcludePaths []string `json:"exclude_paths"`
	// Resource adds service.version, service.instance.id, service.namespace and
	// deployment.environment to the resource.
	Resource struct {
		ServiceVersion        string `json:"service_version"`
		ServiceInstanceID     string `json:"service_instance_id"`
		ServiceNamespace      string `json:"service_namespace"`
		DeploymentEnvironment string `json:"deployment_environment"`
	} `json:"resource"`
	// BatchSpanProcessorOptions tune the batching of exported spans (OpenTelemetry's defaults).
	BatchSpanProcessorOptions struct {
		Blocking           bool `json:"blocking"`
		BatchTimeoutMs     *int `json:"batch_timeout_ms"`
		ExportTimeoutMs    *int `json:"export_timeout_ms"`
		MaxExportBatchSize *int `json:"max_export_batch_size"`
		MaxQueueSize       *int `json:"max_queue_size"`
	} `json:"batch_span_processor_options"`

	excluded []*glob.Pattern
}

// The keys OPA documents for distributed_tracing and its blocks.
var (
	sectionKeys = []string{"type", "address", "service_name", "sample_percentage", "encryption", "allow_insecure_tls",
		"tls_cert_file", "tls_private_key_file", "tls_ca_cert_file", "exclude_paths", "resource", "batch_span_processor_options"}
	resourceKeys = []string{"service_version", "service_instance_id", "service_namespace", "deployment_environment"}
	batchKeys    = []string{"blocking", "batch_timeout_ms", "export_timeout_ms", "max_export_batch_size", "max_queue_size"}
)

// Section is where the section sits in the configuration file, as problems name its keys.
const Section = "opa.distributed_tracing"

// Enabled says whether spans are exported.
func (t *Config) Enabled() bool { return t != nil && t.Type != "" }

// Excluded says whether decisions asked on path are left untraced (exclude_paths).
func (t *Config) Excluded(path string) bool {
	for _, g := range t.excluded {
		if g.Match(path) {
			return true
		}
	}
	return false
}

// ParseConfig reads the distributed_tracing section (raw, as the YAML or JSON decoder made it;
// nil when absent) and checks it. Every problem is reported, naming the key as the file spells
// it (below Section). A section that is absent (or has no type) has tracing off.
func ParseConfig(raw any) (*Config, error) {
	if raw == nil {
		return &Config{}, nil
	}
	top, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: is %s, want a mapping (type, address, service_name, ...)", Section, jsonKind(raw))
	}
	p := &problems{}
	p.unknownKeys(top)
	if err := p.Err(); err != nil {
		return nil, err
	}
	t, err := decodeSection(top)
	if err != nil {
		return nil, err
	}
	switch t.Type {
	case "", "grpc", "http":
	default:
		p.add("type", "%q is not a transport: use grpc or http (OTLP), or remove the key to turn tracing off", t.Type)
	}
	if t.Type == "" {
		if len(top) > 0 {
			p.add("type", "is not set, so nothing would be traced: set type: grpc or type: http, or remove distributed_tracing")
		}
		return t, p.Err()
	}
	t.setDefaults()
	for _, check := range []func(*problems){t.checkExporter, t.checkEncryption, t.checkBatch, t.compileExcluded} {
		check(p)
	}
	if err := p.Err(); err != nil {
		return nil, err
	}
	return t, nil
}

// problems are the problems of the distributed_tracing section, each named by its key
// below opa.distributed_tracing.
type problems struct{ configcheck.Problems }

func (p *problems) add(key, format string, args ...any) {
	p.Add(Section+"."+key, format, args...)
}

// unknownKeys reports the keys of the section, and of its resource and
// batch_span_processor_options blocks, that are not OPA's, and blocks that are not mappings.
func (p *problems) unknownKeys(top map[string]any) {
	unknown := func(prefix string, m map[string]any, known []string) {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if !slices.Contains(known, k) {
				p.add(prefix+k, "is not a key of OPA's distributed_tracing that authz supports (known: %s): remove it or check its spelling", strings.Join(known, ", "))
			}
		}
	}
	unknown("", top, sectionKeys)
	for _, block := range []struct {
		name  string
		known []string
	}{{"resource", resourceKeys}, {"batch_span_processor_options", batchKeys}} {
		switch v := top[block.name].(type) {
		case nil:
		case map[string]any:
			unknown(block.name+".", v, block.known)
		default:
			p.add(block.name, "is %s, want a mapping", jsonKind(v))
		}
	}
}

// decodeSection reads the section's values into a Config; a value of the wrong type is
// named by its key.
func decodeSection(top map[string]any) (*Config, error) {
	b, err := json.Marshal(top)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Section, err)
	}
	t := &Config{}
	if err := json.Unmarshal(b, t); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%s.%s: is a %s, want %s", Section, te.Field, te.Value, jsonType(te.Type.String()))
		}
		return nil, fmt.Errorf("%s: %w", Section, err)
	}
	return t, nil
}

// setDefaults fills in OPA's defaults: the transport's default address, service name "authz",
// every new trace sampled, no encryption.
func (t *Config) setDefaults() {
	if t.Address == "" {
		t.Address = defaultGRPCAddress
		if t.Type == "http" {
			t.Address = defaultHTTPAddress
		}
	}
	if t.ServiceName == "" {
		t.ServiceName = DefaultServiceName
	}
	if t.SamplePercentage == nil {
		all := 100.0
		t.SamplePercentage = &all
	}
	if t.Encryption == "" {
		t.Encryption = "off"
	}
}

// checkExporter checks the collector's address and the sample percentage.
func (t *Config) checkExporter(p *problems) {
	if strings.Contains(t.Address, "://") {
		p.add("address", "%q: give host:port, as OPA reads it (no scheme; encryption chooses TLS)", t.Address)
	}
	if pct := *t.SamplePercentage; pct < 0 || pct > 100 {
		p.add("sample_percentage", "%v is not a percentage: give a number from 0 to 100", pct)
	}
}

// checkEncryption checks encryption and the files it reads.
func (t *Config) checkEncryption(p *problems) {
	files := []struct{ name, value string }{{"tls_cert_file", t.TLSCertFile}, {"tls_private_key_file", t.TLSPrivateKeyFile}, {"tls_ca_cert_file", t.TLSCACertFile}}
	switch t.Encryption {
	case "off":
		for _, f := range files {
			if f.value != "" {
				p.add(f.name, "is set but encryption is off: set encryption: tls or mtls, or remove it")
			}
		}
	case "tls", "mtls":
		if (t.TLSCertFile == "") != (t.TLSPrivateKeyFile == "") {
			p.add("tls_cert_file", "tls_cert_file and tls_private_key_file go together: give both or neither")
		}
		if t.Encryption == "mtls" && t.TLSCertFile == "" {
			p.add("tls_cert_file", "encryption mtls needs the client certificate: set tls_cert_file and tls_private_key_file")
		}
		for _, f := range files {
			if f.value == "" {
				continue
			}
			if _, err := os.Stat(f.value); err != nil {
				p.add(f.name, "%v: give a readable PEM file", err)
			}
		}
	default:
		p.add("encryption", "%q is not a scheme: use off, tls or mtls", t.Encryption)
	}
}

// checkBatch checks the batch span processor's bounds.
func (t *Config) checkBatch(p *problems) {
	bo := t.BatchSpanProcessorOptions
	for _, f := range []struct {
		name string
		v    *int
	}{
		{"batch_timeout_ms", bo.BatchTimeoutMs}, {"export_timeout_ms", bo.ExportTimeoutMs},
		{"max_export_batch_size", bo.MaxExportBatchSize}, {"max_queue_size", bo.MaxQueueSize},
	} {
		if f.v != nil && *f.v <= 0 {
			p.add("batch_span_processor_options."+f.name, "%d: must be positive", *f.v)
		}
	}
}

// compileExcluded compiles exclude_paths.
func (t *Config) compileExcluded(p *problems) {
	for i, pat := range t.ExcludePaths {
		g, err := glob.Compile(pat, '/')
		if err != nil {
			p.add(fmt.Sprintf("exclude_paths[%d]", i), "%q is not a glob pattern: %v", pat, err)
			continue
		}
		t.excluded = append(t.excluded, g)
	}
}

// jsonKind names the YAML/JSON kind of v for messages.
func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case float64, int, int64, uint64, json.Number:
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}

func jsonType(goType string) string {
	switch {
	case strings.Contains(goType, "float"), strings.Contains(goType, "int"):
		return "a number"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	case strings.Contains(goType, "[]"):
		return "a list of strings"
	case strings.Contains(goType, "struct"):
		return "a mapping"
	}
	return "a string"
}
