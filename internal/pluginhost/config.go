package pluginhost

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Defaults of Config. A zero duration in Config means its default.
const (
	DefaultStartTimeout       = 10 * time.Second
	DefaultConfigCheckTimeout = 2 * time.Second
	DefaultMinBackoff         = 100 * time.Millisecond
	DefaultMaxBackoff         = 5 * time.Second
)

// PluginConfig is one installed driver plugin.
type PluginConfig struct {
	// ID is the plugin id that leases pin (lease.metadata.pluginId). Non-empty and unique.
	ID string `json:"id"`
	// Path is the absolute path of the driver binary.
	Path string `json:"path"`
	// SHA256 is the hex SHA-256 of the binary at Path (64 hex characters). The host refuses to
	// start a binary with another hash. Compute it with `sha256sum PATH`.
	SHA256 string `json:"sha256"`
	// Args are passed to the binary.
	Args []string `json:"args,omitempty"`
	// Enabled turns the plugin off when false; nil means enabled.
	Enabled *bool `json:"enabled,omitempty"`
	// AllowWritableBinary starts the plugin (with a loud warning at every start) even when its
	// binary or the directory holding it is writable by group or others. By default the host
	// refuses: whoever can write there can replace the driver.
	AllowWritableBinary bool `json:"allowWritableBinary,omitempty"`
}

// IsEnabled reports whether the plugin is enabled (Enabled nil or true).
func (p PluginConfig) IsEnabled() bool { return p.Enabled == nil || *p.Enabled }

// Config configures a Host.
type Config struct {
	// Plugins are the installed driver plugins.
	Plugins []PluginConfig
	// BuiltinProviders are the built-in sandbox providers reported as facts (SPEC section 4),
	// e.g. {"fake": {"execute": true, "supportsReusableLeases": false}}. Values must be objects.
	BuiltinProviders map[string]map[string]any
	// StartTimeout bounds one start of a worker: the go-plugin handshake, and then Describe and
	// SupportedMethods. Zero means DefaultStartTimeout.
	StartTimeout time.Duration
	// ConfigCheckTimeout bounds one CheckConfig call. Zero means DefaultConfigCheckTimeout.
	ConfigCheckTimeout time.Duration
	// InsecureSkipPinCheck starts binaries without checking their SHA-256. Development only:
	// the host logs a loud warning at every start.
	InsecureSkipPinCheck bool
	// MinBackoff and MaxBackoff bound the wait before a restart; it doubles after every failed
	// or short-lived start and goes back to MinBackoff once a worker stayed up for at least
	// twice MaxBackoff. Zero means DefaultMinBackoff / DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives the host's log and every plugin's stderr. Nil means hclog's default logger.
	Logger hclog.Logger
	// SocketDir is where each worker start gets a private directory for its unix socket
	// (removed when the worker ends, and after a failed start). Empty means os.TempDir().
	SocketDir string
}

// DefaultConfig returns a configuration with no plugins and every default set.
func DefaultConfig() Config {
	return Config{
		BuiltinProviders:   map[string]map[string]any{},
		StartTimeout:       DefaultStartTimeout,
		ConfigCheckTimeout: DefaultConfigCheckTimeout,
		MinBackoff:         DefaultMinBackoff,
		MaxBackoff:         DefaultMaxBackoff,
	}
}

// withDefaults fills zero durations and the logger.
func (c Config) withDefaults() Config {
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.ConfigCheckTimeout == 0 {
		c.ConfigCheckTimeout = DefaultConfigCheckTimeout
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = max(DefaultMaxBackoff, c.MinBackoff)
	}
	if c.Logger == nil {
		c.Logger = hclog.Default()
	}
	return c
}

// Validate checks the configuration and returns every problem, each naming its field, e.g.
// "plugins[1].sha256: must be 64 hex characters".
func (c Config) Validate() error {
	var errs []error
	fail := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, args...)))
	}
	seen := map[string]int{}
	for i, p := range c.Plugins {
		field := fmt.Sprintf("plugins[%d]", i)
		switch prev, dup := seen[p.ID]; {
		case p.ID == "":
			fail(field+".id", "must not be empty")
		case dup:
			fail(field+".id", "%q is already the id of plugins[%d]: plugin ids must be unique", p.ID, prev)
		default:
			seen[p.ID] = i
		}
		switch {
		case p.Path == "":
			fail(field+".path", "must not be empty")
		case !filepath.IsAbs(p.Path):
			fail(field+".path", "%q must be an absolute path", p.Path)
		}
		switch {
		case p.SHA256 == "" && c.InsecureSkipPinCheck:
			// Allowed in development only; Start warns.
		case !isSHA256Hex(p.SHA256):
			fail(field+".sha256", "must be 64 hex characters (compute it with: sha256sum %s)", orPlaceholder(p.Path))
		}
	}
	for key, b := range c.BuiltinProviders {
		field := fmt.Sprintf("builtinProviders[%q]", key)
		if key == "" {
			fail(field, "the provider key must not be empty")
		}
		if b == nil {
			fail(field, "must be an object, not null")
		}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"startTimeout", c.StartTimeout},
		{"configCheckTimeout", c.ConfigCheckTimeout},
		{"minBackoff", c.MinBackoff},
		{"maxBackoff", c.MaxBackoff},
	} {
		if d.v < 0 {
			fail(d.field, "must not be negative (zero means the default)")
		}
	}
	if c.MinBackoff > 0 && c.MaxBackoff > 0 && c.MaxBackoff < c.MinBackoff {
		fail("maxBackoff", "%s must be at least minBackoff (%s)", c.MaxBackoff, c.MinBackoff)
	}
	return errors.Join(errs...)
}

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

func orPlaceholder(path string) string {
	if path == "" {
		return "PATH"
	}
	return path
}
