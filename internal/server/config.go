package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.yaml.in/yaml/v3"

	"github.com/authz-dev/authz/internal/policy"
)

// SelfExecutable is the plugin path that stands for the authz executable itself
// (os.Executable()). Its SHA-256 pin may be left empty: it is computed at start.
const SelfExecutable = "@self"

// Defaults of the service (docs/service.md, "Configuration").
const (
	DefaultAddr               = "127.0.0.1:8181"
	DefaultMaxBodyBytes       = 1 << 20 // 1 MiB
	DefaultEvalTimeout        = 5 * time.Second
	DefaultConfigCheckTimeout = 2 * time.Second
	DefaultPluginStartTimeout = 10 * time.Second
	DefaultShutdownTimeout    = 15 * time.Second
	ExamplePluginID           = "example.sandbox"
)

// Config is the whole configuration of `authz serve`. The YAML file and the flags both write into
// it; DefaultConfig gives the values used for everything the file and the flags leave out.
type Config struct {
	// Addr is "host:port" or "unix:///absolute/path".
	Addr string `yaml:"addr"`
	// TLS serves HTTPS when both Cert and Key are set.
	TLS TLSConfig `yaml:"tls"`
	// Plugins are the driver plugins the host starts. A file that lists plugins replaces the
	// default list (the built-in example driver); `plugins: []` starts none.
	Plugins []PluginConfig `yaml:"plugins"`
	// BuiltinProviders is the facts' builtinProviders (docs/contract.md section 4).
	BuiltinProviders map[string]map[string]any `yaml:"builtinProviders"`
	// Facts, when set, is a static facts file used instead of live plugins: Plugins and
	// BuiltinProviders are then not used.
	Facts string `yaml:"facts"`
	// DecisionLog configures the one-line-per-decision log.
	DecisionLog DecisionLogConfig `yaml:"decisionLog"`
	// MaxBodyBytes bounds a request body; a larger one is answered 413.
	MaxBodyBytes int64 `yaml:"maxBodyBytes"`
	// EvalTimeout bounds one decision (input assembly and evaluation).
	EvalTimeout time.Duration `yaml:"evalTimeout"`
	// DecisionCache is "on" (the default) or "off": whether repeated decisions are answered
	// from the engine's decision cache.
	DecisionCache string `yaml:"decisionCache"`
	// ConfigCheckTimeout bounds the driver's config check inside one decision.
	ConfigCheckTimeout time.Duration `yaml:"configCheckTimeout"`
	// PluginStartTimeout bounds the start of one plugin worker.
	PluginStartTimeout time.Duration `yaml:"pluginStartTimeout"`
	// ShutdownTimeout bounds the graceful shutdown: in-flight requests still running after it
	// are cut off.
	ShutdownTimeout time.Duration `yaml:"shutdownTimeout"`
	// HTTP holds the server's connection limits.
	HTTP HTTPConfig `yaml:"http"`
	// Log configures the service's own log (hclog, on stderr).
	Log LogConfig `yaml:"log"`

	// Authentication controls who may use the API (docs/service.md, "Authentication").
	Authentication AuthConfig `yaml:"authentication"`

	// Limits bounds what the service holds at once: connections, requests being read, requests
	// being decided. They bound its memory and file descriptors whatever the load.
	Limits LimitsConfig `yaml:"limits"`

	// Policy says where the policy comes from (docs/service.md, "Policy"): its keys (bundle,
	// watch, verificationKey, verificationKeyId, signingAlg, scope, opa) sit at the top level,
	// as the flags of `opa run` and an OPA configuration document under opa:.
	Policy policy.Config `yaml:",inline"`
}

// AuthConfig is the access control of the API: who may ask for decisions and who may read the
// inspection endpoints. The health endpoints are always open.
type AuthConfig struct {
	// Mode is "off" (the default), "token" (a bearer token from TokensFile) or "tls" (a client
	// certificate signed by ClientCAFile; needs tls.cert and tls.key). Flag --authentication.
	Mode string `yaml:"mode"`
	// TokensFile holds the bearer tokens, one per line with its scopes: "TOKEN decide",
	// "TOKEN inspect" or "TOKEN decide,inspect". Flag --authentication-tokens-file.
	TokensFile string `yaml:"tokensFile"`
	// ClientCAFile is the PEM CA certificate(s) that sign accepted client certificates.
	// Flag --tls-ca-cert-file.
	ClientCAFile string `yaml:"clientCAFile"`
	// AllowedHosts are host names (without port) accepted in the Host header of plain-HTTP
	// requests that arrive at a loopback address, besides localhost, 127.0.0.1 and [::1];
	// "*" accepts any. Flag --allowed-host (repeatable).
	AllowedHosts []string `yaml:"allowedHosts"`
}

func (c AuthConfig) mode() string {
	if c.Mode == "" {
		return AuthOff
	}
	return c.Mode
}

// LimitsConfig bounds the connections and the decision requests the service holds at once
// (docs/service.md, "Limits and memory").
type LimitsConfig struct {
	// MaxConnections caps the open client connections. At the cap, the oldest idle
	// connection is closed to make room; when none is idle, new connections wait in the
	// kernel's accept queue. It is lowered at start so that FDReserve descriptors remain.
	MaxConnections int `yaml:"maxConnections"`
	// FDReserve is the number of file descriptors (RLIMIT_NOFILE) kept free of connections,
	// for plugin restarts, the decision log and the service's own files.
	FDReserve int `yaml:"fdReserve"`
	// MaxReading caps the decision requests admitted at once: each holds at most
	// maxBodyBytes of body from the moment it is admitted until it is answered.
	MaxReading int `yaml:"maxReading"`
	// MaxDeciding caps the admitted requests whose body is being decoded, evaluated and
	// logged at once, the stage that costs memory in proportion to the body.
	MaxDeciding int `yaml:"maxDeciding"`
	// QueueWait is how long a decision request waits for a slot of either kind before it is
	// answered 503 SERVICE_OVERLOADED with Retry-After.
	QueueWait time.Duration `yaml:"queueWait"`
}

// Defaults of LimitsConfig.
const (
	DefaultMaxConnections = 256
	DefaultFDReserve      = 64
	DefaultMaxReading     = 32
	DefaultMaxDeciding    = 4
	DefaultQueueWait      = time.Second
)

// validateLimits checks the Limits block.
func (c Config) validateLimits(add func(field, format string, args ...any)) {
	for _, f := range []struct {
		field string
		v     int
	}{
		{"limits.maxConnections", c.Limits.MaxConnections},
		{"limits.maxReading", c.Limits.MaxReading},
		{"limits.maxDeciding", c.Limits.MaxDeciding},
	} {
		if f.v <= 0 {
			add(f.field, "must be a positive number, got %d", f.v)
		}
	}
	if c.Limits.FDReserve < 16 {
		add("limits.fdReserve", "must be at least 16 (plugin restarts need descriptors), got %d", c.Limits.FDReserve)
	}
	if c.Limits.MaxDeciding > c.Limits.MaxReading && c.Limits.MaxReading > 0 {
		add("limits.maxDeciding", "must not be more than limits.maxReading (%d): a request is decided only after it was admitted to be read", c.Limits.MaxReading)
	}
	if c.Limits.QueueWait <= 0 {
		add("limits.queueWait", "must be a positive duration such as 1s, got %v", c.Limits.QueueWait)
	}
}

// TLSConfig names a PEM certificate (chain) and its key.
type TLSConfig struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// PluginConfig is one driver plugin (pluginhost.PluginConfig without the runtime options).
type PluginConfig struct {
	ID string `yaml:"id"`
	// Path is the driver executable, or SelfExecutable.
	Path string `yaml:"path"`
	// SHA256 is the hex digest the executable must have (64 hex characters).
	SHA256 string   `yaml:"sha256"`
	Args   []string `yaml:"args"`
	// Key, when set, is the plugin key the driver must report; no other plugin may report it.
	Key string `yaml:"key"`
	// Enabled is true when absent.
	Enabled *bool `yaml:"enabled"`
	// AllowWritableBinary starts the driver (with a warning) even when its binary or directory
	// is writable by group or others; by default such a driver is refused.
	AllowWritableBinary bool `yaml:"allowWritableBinary"`
	// User and Group run the driver as this user and group (name or numeric id).
	User  string `yaml:"user"`
	Group string `yaml:"group"`
	// NoNewPrivileges: the driver can never gain privileges (setuid binaries, file capabilities).
	NoNewPrivileges bool `yaml:"noNewPrivileges"`
	// Limits are the driver's resource limits; zero leaves the host's.
	Limits PluginLimits `yaml:"limits"`
}

// PluginLimits are a driver's resource limits.
type PluginLimits struct {
	AddressSpaceBytes uint64 `yaml:"addressSpaceBytes"`
	Processes         uint64 `yaml:"processes"`
	OpenFiles         uint64 `yaml:"openFiles"`
	CPUSeconds        uint64 `yaml:"cpuSeconds"`
}

// IsEnabled reports whether the plugin is to be started.
func (p PluginConfig) IsEnabled() bool { return p.Enabled == nil || *p.Enabled }

// DecisionLogConfig configures the decision log.
type DecisionLogConfig struct {
	// Path is a file to append to, "-" for stderr, "" for no decision log.
	Path string `yaml:"path"`
	// Required answers a decision whose line could not be written with 503
	// DECISION_LOG_UNAVAILABLE instead of the decision.
	Required bool `yaml:"required"`
	// Mask lists JSON pointers into the log line, below /input, whose values are replaced by
	// MaskedValue. A segment "*" matches every member of an object or element of an array.
	Mask []string `yaml:"mask"`
}

// HTTPConfig holds the limits that keep a slow or hostile client from holding the server.
type HTTPConfig struct {
	ReadHeaderTimeout time.Duration `yaml:"readHeaderTimeout"`
	ReadTimeout       time.Duration `yaml:"readTimeout"`
	WriteTimeout      time.Duration `yaml:"writeTimeout"`
	IdleTimeout       time.Duration `yaml:"idleTimeout"`
	MaxHeaderBytes    int           `yaml:"maxHeaderBytes"`
}

// LogConfig configures the service log.
type LogConfig struct {
	// Level is trace, debug, info, warn, error or off.
	Level string `yaml:"level"`
	// JSON writes the log as JSON lines.
	JSON bool `yaml:"json"`
}

// DefaultConfig is the configuration of `authz serve` with no file and no flags: 127.0.0.1:8181,
// the built-in example driver as plugin example.sandbox, no decision log.
func DefaultConfig() Config {
	return Config{
		Addr: DefaultAddr,
		Plugins: []PluginConfig{{
			ID:   ExamplePluginID,
			Path: SelfExecutable,
			Args: []string{"example-driver"},
		}},
		BuiltinProviders: map[string]map[string]any{},
		DecisionLog: DecisionLogConfig{
			// Sandbox provider configs commonly carry credentials.
			Mask: []string{"/input/environment/config"},
		},
		MaxBodyBytes:       DefaultMaxBodyBytes,
		EvalTimeout:        DefaultEvalTimeout,
		DecisionCache:      "on",
		ConfigCheckTimeout: DefaultConfigCheckTimeout,
		PluginStartTimeout: DefaultPluginStartTimeout,
		ShutdownTimeout:    DefaultShutdownTimeout,
		HTTP: HTTPConfig{
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       30 * time.Second,
			MaxHeaderBytes:    64 << 10,
		},
		Log: LogConfig{Level: "info"},
		Limits: LimitsConfig{
			MaxConnections: DefaultMaxConnections,
			FDReserve:      DefaultFDReserve,
			MaxReading:     DefaultMaxReading,
			MaxDeciding:    DefaultMaxDeciding,
			QueueWait:      DefaultQueueWait,
		},
	}
}

// ParseConfig reads a YAML configuration over DefaultConfig. Unknown fields are rejected; an
// empty document gives the defaults. The result is not validated: call Validate. Errors name
// the field, e.g. "config: evalTimeout (line 3): cannot unmarshal !!int `5` into time.Duration".
func ParseConfig(r io.Reader) (Config, error) {
	src, err := io.ReadAll(r)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(src))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return DefaultConfig(), nil
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return Config{}, namedTypeErrors(src, te)
		}
		return Config{}, fmt.Errorf("config: %w", err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("config: more than one YAML document: write one mapping")
	}
	if cfg.BuiltinProviders == nil {
		cfg.BuiltinProviders = map[string]map[string]any{}
	}
	return cfg, nil
}

var yamlErrLine = regexp.MustCompile("^line ([0-9]+): (.*)$")
var yamlErrValue = regexp.MustCompile("`([^`]*)`")

// namedTypeErrors rewrites yaml's "line N: ..." errors to name the field at that line.
func namedTypeErrors(src []byte, te *yaml.TypeError) error {
	var root yaml.Node
	_ = yaml.Unmarshal(src, &root)
	errs := make([]error, 0, len(te.Errors))
	for _, e := range te.Errors {
		m := yamlErrLine.FindStringSubmatch(e)
		if m == nil {
			errs = append(errs, fmt.Errorf("config: %s", e))
			continue
		}
		line, _ := strconv.Atoi(m[1])
		var cands []yamlField
		fieldsAtLine(&root, line, "", &cands)
		msg := m[2]
		if v := yamlErrValue.FindStringSubmatch(msg); v != nil {
			// A scalar was refused: name the fields that hold that value.
			var same []yamlField
			for _, c := range cands {
				if c.scalar && c.value == v[1] {
					same = append(same, c)
				}
			}
			if len(same) > 0 {
				cands = same
				// Quote the value as it was written: `"true"` is a string, not the boolean.
				msg = strings.Replace(msg, v[0], writtenScalar(same[0]), 1)
			}
		} else if len(cands) > 1 {
			// A collection was refused: the outermost field on the line holds it.
			cands = cands[:1]
		}
		names := make([]string, len(cands))
		for i, c := range cands {
			names[i] = c.path
		}
		if len(names) == 0 {
			errs = append(errs, fmt.Errorf("config: line %d: %s", line, msg))
			continue
		}
		errs = append(errs, fmt.Errorf("config: %s (line %d): %s", strings.Join(names, " or "), line, msg))
	}
	return errors.Join(errs...)
}

type yamlField struct {
	path, value string
	scalar      bool
	style       yaml.Style
}

// writtenScalar renders a scalar as the file wrote it: quoted when it was quoted.
func writtenScalar(f yamlField) string {
	switch {
	case f.style&yaml.DoubleQuotedStyle != 0:
		return strconv.Quote(f.value)
	case f.style&yaml.SingleQuotedStyle != 0:
		return "'" + strings.ReplaceAll(f.value, "'", "''") + "'"
	}
	return "`" + f.value + "`"
}

// fieldsAtLine collects the fields whose key or scalar value is on line.
func fieldsAtLine(n *yaml.Node, line int, path string, out *[]yamlField) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			fieldsAtLine(c, line, path, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if k.Line == line {
				*out = append(*out, yamlField{path: p, value: v.Value, scalar: v.Kind == yaml.ScalarNode, style: v.Style})
			}
			if v.Kind != yaml.ScalarNode {
				fieldsAtLine(v, line, p, out)
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			if c.Kind == yaml.ScalarNode {
				if c.Line == line {
					*out = append(*out, yamlField{path: p, value: c.Value, scalar: true, style: c.Style})
				}
				continue
			}
			fieldsAtLine(c, line, p, out)
		}
	}
}

var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// Validate checks the configuration. Every problem is reported, one per line, each naming its
// field the way the YAML file spells it (e.g. "plugins[0].sha256: must be 64 hex characters").
func (c Config) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}

	if _, _, err := ParseAddr(c.Addr); err != nil {
		add("addr", "%v", err)
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		if c.TLS.Cert == "" {
			add("tls.cert", "must be set together with tls.key")
		} else {
			add("tls.key", "must be set together with tls.cert")
		}
	}

	c.Authentication.validate(c.TLS.Cert != "" && c.TLS.Key != "", add)

	ids := map[string]int{}
	for i, p := range c.Plugins {
		f := fmt.Sprintf("plugins[%d]", i)
		switch {
		case p.ID == "":
			add(f+".id", "must be a non-empty string")
		case strings.TrimSpace(p.ID) != p.ID:
			add(f+".id", "must not start or end with white space: %q", p.ID)
		default:
			if j, dup := ids[p.ID]; dup {
				add(f+".id", "%q is already the id of plugins[%d]: plugin ids must be unique", p.ID, j)
			} else {
				ids[p.ID] = i
			}
		}
		if p.Path == "" {
			add(f+".path", "must name the driver executable (or %q for authz itself)", SelfExecutable)
		}
		if p.SHA256 != "" || p.Path != SelfExecutable {
			if !sha256Hex.MatchString(p.SHA256) {
				add(f+".sha256", "must be 64 hex characters (the SHA-256 of the executable: sha256sum FILE)")
			}
		}
	}

	for _, name := range slices.Sorted(maps.Keys(c.BuiltinProviders)) {
		b := c.BuiltinProviders[name]
		if name == "" {
			add("builtinProviders", "provider keys must be non-empty")
		}
		if b == nil {
			add("builtinProviders."+name, "must be an object such as {execute: true}, not empty")
		}
		// The schema is closed, as everywhere else in the file: a built-in provider has exactly
		// the fields the facts give one, and anything else (a credential pasted in by mistake)
		// would be shown on GET /v1/facts and in every decision log line.
		for _, k := range slices.Sorted(maps.Keys(b)) {
			f := fmt.Sprintf("builtinProviders.%s.%s", name, k)
			if !slices.Contains(builtinProviderFields, k) {
				add(f, "unknown field: a built-in provider has only %s", strings.Join(builtinProviderFields, " and "))
				continue
			}
			if _, isBool := b[k].(bool); !isBool {
				add(f, "must be true or false (unquoted), got %s", describeValue(b[k]))
			}
		}
	}

	for i, m := range c.DecisionLog.Mask {
		if _, err := parseMask(m); err != nil {
			add(fmt.Sprintf("decisionLog.mask[%d]", i), "%v", err)
		}
	}
	if c.DecisionLog.Required && c.DecisionLog.Path == "" {
		add("decisionLog.required", "needs decisionLog.path (a file, or - for stderr)")
	}

	if c.DecisionCache != "on" && c.DecisionCache != "off" {
		add("decisionCache", "must be on or off, got %q", c.DecisionCache)
	}
	if c.MaxBodyBytes <= 0 {
		add("maxBodyBytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	positive := []struct {
		field string
		d     time.Duration
	}{
		{"evalTimeout", c.EvalTimeout},
		{"configCheckTimeout", c.ConfigCheckTimeout},
		{"pluginStartTimeout", c.PluginStartTimeout},
		{"shutdownTimeout", c.ShutdownTimeout},
		{"http.readHeaderTimeout", c.HTTP.ReadHeaderTimeout},
		{"http.readTimeout", c.HTTP.ReadTimeout},
		{"http.writeTimeout", c.HTTP.WriteTimeout},
		{"http.idleTimeout", c.HTTP.IdleTimeout},
	}
	for _, p := range positive {
		if p.d <= 0 {
			add(p.field, "must be a positive duration such as 5s, got %v", p.d)
		}
	}
	if c.ConfigCheckTimeout > 0 && c.EvalTimeout > 0 && c.ConfigCheckTimeout >= c.EvalTimeout {
		add("configCheckTimeout", "must be shorter than evalTimeout (%v), or a slow driver config check would use up the whole decision and every such decision would fail with EVAL_TIMEOUT", c.EvalTimeout)
	}
	if c.HTTP.WriteTimeout > 0 && c.EvalTimeout > 0 && c.HTTP.WriteTimeout <= c.EvalTimeout {
		add("http.writeTimeout", "must be longer than evalTimeout (%v), or a slow decision could never be answered", c.EvalTimeout)
	}
	if c.HTTP.MaxHeaderBytes < 1024 {
		add("http.maxHeaderBytes", "must be at least 1024, got %d", c.HTTP.MaxHeaderBytes)
	}
	if hclog.LevelFromString(c.Log.Level) == hclog.NoLevel {
		add("log.level", "must be one of trace, debug, info, warn, error, off; got %q", c.Log.Level)
	}
	c.validateLimits(add)
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// builtinProviderFields are the fields of a built-in provider in the facts.
var builtinProviderFields = []string{"execute", "supportsReusableLeases"}

// describeValue names a configuration value the way it was written: a string quoted (so that
// "true" reads as the string it is), anything else as YAML would print it.
func describeValue(v any) string {
	switch t := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("the string %q", t)
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%v", v)
}

// ParseAddr splits a listen address into a network ("tcp" or "unix") and an address:
// "host:port" or "unix:///absolute/path".
func ParseAddr(addr string) (network, address string, err error) {
	if rest, ok := strings.CutPrefix(addr, "unix://"); ok {
		if !strings.HasPrefix(rest, "/") {
			return "", "", fmt.Errorf("%q: a unix socket address is unix:///absolute/path", addr)
		}
		return "unix", rest, nil
	}
	if strings.Contains(addr, "://") {
		return "", "", fmt.Errorf("%q: want host:port or unix:///path", addr)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", "", fmt.Errorf("%q: want host:port (e.g. 127.0.0.1:8181) or unix:///path", addr)
	}
	return "tcp", addr, nil
}
