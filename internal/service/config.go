package service

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.yaml.in/yaml/v3"

	"github.com/authz-dev/authz/internal/configcheck"
	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
)

// Defaults of the service besides those of the server and the plugin host.
const (
	DefaultEvalTimeout = 5 * time.Second
	ExamplePluginID    = "example.sandbox"
	// ExamplePluginKey is the plugin key the built-in example driver reports; the default
	// configuration sets it as the example plugin's key, so no other plugin's driver can take it.
	ExamplePluginKey = "example.sandbox"
)

// Config is the whole configuration of `authz serve`, composed from the configuration each
// part reads: the HTTP server's, the plugin host's and the decision engine's, plus what only
// the composition reads (the facts file, the service log). The YAML file writes every field at
// the top level, with the names the parts give them; the flags write into the same fields.
type Config struct {
	// Server is the HTTP server: addr, tls, authentication, limits, decisionLog, http, ...
	Server server.Config `yaml:",inline"`
	// Host is the plugin host: plugins, builtinProviders, pluginStartTimeout and
	// configCheckTimeout. A file that lists plugins replaces the default list (the built-in
	// example driver); `plugins: []` starts none.
	Host pluginhost.Config `yaml:",inline"`
	// Decision is the decision engine: evalTimeout and decisionCache.
	Decision DecisionConfig `yaml:",inline"`
	// Policy says where the policy comes from: the embedded policy (the default), a bundle file
	// or directory (bundle, watch, verificationKey, verificationKeyId, signingAlg, scope, as
	// the flags of `opa run`), or an OPA configuration document under opa: (remote bundles,
	// decision logs, status), handed to OPA's plugin manager.
	Policy policy.Config `yaml:",inline"`
	// Facts, when set, is a static facts file used instead of live plugins: Host is then not
	// started.
	Facts string `yaml:"facts"`
	// Log configures the service's own log (hclog, on stderr).
	Log LogConfig `yaml:"log"`
	// File is the configuration file the configuration was read from (LoadConfig); "" for
	// none. Run warns when others may read it.
	File string `yaml:"-"`
}

// DecisionConfig is what the service sets of the decision engine.
type DecisionConfig struct {
	// EvalTimeout bounds one decision (input assembly and evaluation).
	EvalTimeout time.Duration `yaml:"evalTimeout"`
	// Cache is "on" (the default) or "off": whether repeated decisions are answered from the
	// engine's decision cache.
	Cache string `yaml:"decisionCache"`
}

// LogConfig configures the service log.
type LogConfig struct {
	// Level is trace, debug, info, warn, error or off.
	Level string `yaml:"level"`
	// JSON writes the log as JSON lines.
	JSON bool `yaml:"json"`
}

// DefaultConfig is the configuration of `authz serve` with no file and no flags: the server's
// and the plugin host's defaults, and the built-in example driver as plugin example.sandbox.
func DefaultConfig() Config {
	host := pluginhost.DefaultConfig()
	host.Plugins = []pluginhost.PluginConfig{{
		ID:   ExamplePluginID,
		Path: pluginhost.SelfExecutable,
		Key:  ExamplePluginKey,
		Args: []string{"example-driver"},
	}}
	return Config{
		Server:   server.DefaultConfig(),
		Host:     host,
		Decision: DecisionConfig{EvalTimeout: DefaultEvalTimeout, Cache: "on"},
		Log:      LogConfig{Level: "info"},
	}
}

// LoadConfig reads the configuration file at path over DefaultConfig (see ParseConfig).
func LoadConfig(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, err
	}
	defer f.Close()
	cfg, err := ParseConfig(f)
	if err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	cfg.File = path
	return cfg, nil
}

// warnReadableFile logs a WARN when others may read the configuration file: it may hold
// credentials (OPA services' credentials under opa:), and a root host's drivers run as other
// users.
func warnReadableFile(log hclog.Logger, path string) {
	if path == "" {
		return
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm()&0o004 == 0 {
		return
	}
	log.Warn(fmt.Sprintf("the configuration file is readable by others and may hold credentials: chmod 600 %s", path),
		"file", path, "mode", fmt.Sprintf("%04o", fi.Mode().Perm()))
}

// ParseConfig reads a YAML configuration over DefaultConfig. Unknown fields are rejected; an
// empty document gives the defaults. The result is neither resolved nor validated: Run does
// both. Errors name the field, e.g.
// "config: evalTimeout (line 3): cannot unmarshal !!int `5` into time.Duration": each is a
// *configcheck.DocumentError named config, around a *configcheck.FieldError when it names a
// field (configcheck.Under names them below an enclosing configuration's field).
func ParseConfig(r io.Reader) (Config, error) {
	src, err := io.ReadAll(r)
	if err != nil {
		return Config{}, configErr(err)
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
		return Config{}, configErr(err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, configErr(errors.New("more than one YAML document: write one mapping"))
	}
	if cfg.Host.BuiltinProviders == nil {
		cfg.Host.BuiltinProviders = map[string]map[string]any{}
	}
	return cfg, nil
}

// Resolve makes the plugin paths absolute and pins "@self" (pluginhost.Config.Resolve).
func (c Config) Resolve() (Config, error) {
	host, err := c.Host.Resolve()
	if err != nil {
		return c, err
	}
	c.Host = host
	return c, nil
}

// Validate checks the configuration: each part's own checks, then those that relate the
// parts. Every problem is reported, one per line, each naming its field the way the YAML file
// spells it (e.g. "plugins[0].sha256: must be 64 hex characters"). Plugin paths must have
// been resolved (Resolve).
func (c Config) Validate() error {
	v := &configcheck.Problems{}
	v.Include(c.Server.Validate())
	v.Include(c.Host.Validate())
	v.Include(c.Policy.Validate())
	if c.Decision.Cache != "on" && c.Decision.Cache != "off" {
		v.Add("decisionCache", "must be on or off, got %q", c.Decision.Cache)
	}
	if c.Decision.EvalTimeout <= 0 {
		v.Add("evalTimeout", "must be a positive duration such as 5s, got %v", c.Decision.EvalTimeout)
	}
	if hclog.LevelFromString(c.Log.Level) == hclog.NoLevel {
		v.Add("log.level", "must be one of trace, debug, info, warn, error, off; got %q", c.Log.Level)
	}
	c.validateTimeouts(v)
	return v.Err()
}

// validateTimeouts relates the decision's time-out to the driver's config check inside it and
// to the time the server gives a response.
func (c Config) validateTimeouts(v *configcheck.Problems) {
	eval := c.Decision.EvalTimeout
	if eval <= 0 {
		return
	}
	check := c.Host.ConfigCheckTimeout
	if check == 0 {
		check = pluginhost.DefaultConfigCheckTimeout
	}
	if check >= eval {
		v.Add("configCheckTimeout", "must be shorter than evalTimeout (%v), or a slow driver config check would use up the whole decision and every such decision would fail with EVAL_TIMEOUT", eval)
	}
	if w := c.Server.HTTP.WriteTimeout; w > 0 && w <= eval {
		v.Add("http.writeTimeout", "must be longer than evalTimeout (%v), or a slow decision could never be answered", eval)
	}
}

// configErr tells err with the configuration's name: "config: ...".
func configErr(err error) error { return &configcheck.DocumentError{Name: "config", Err: err} }

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
			errs = append(errs, configErr(errors.New(e)))
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
		if len(cands) == 0 {
			errs = append(errs, configErr(fmt.Errorf("line %d: %s", line, msg)))
			continue
		}
		fe := &configcheck.FieldError{Field: cands[0].path, Line: line, Err: errors.New(msg)}
		for _, c := range cands[1:] {
			fe.Or = append(fe.Or, c.path)
		}
		errs = append(errs, configErr(fe))
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
