package pluginhost

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
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
	// Key, when set, is the plugin key the driver must report: a driver that reports another key
	// is refused, and no other plugin may report this one. Empty: the plugin key is whatever the
	// driver reports, as long as no other plugin holds it.
	Key string `json:"key,omitempty"`
	// Args are passed to the binary.
	Args []string `json:"args,omitempty"`
	// Enabled turns the plugin off when false; nil means enabled.
	Enabled *bool `json:"enabled,omitempty"`
	// AllowWritableBinary starts the plugin (with a loud warning at every start) even when its
	// binary or the directory holding it is writable by group or others. By default the host
	// refuses: whoever can write there can replace the driver.
	AllowWritableBinary bool `json:"allowWritableBinary,omitempty"`

	// Least privilege, all optional (Linux). See docs/drivers.md for the trade-offs.

	// User and Group run the driver as this user and group (a name or a numeric id), with no
	// supplementary groups. Empty means the host's. Switching needs the privilege to (root, or
	// CAP_SETUID and CAP_SETGID). With User alone, the group is the user's primary group.
	User  string `json:"user,omitempty"`
	Group string `json:"group,omitempty"`
	// NoNewPrivileges sets no_new_privs on the driver: neither it nor anything it executes can
	// gain privileges (setuid binaries, file capabilities).
	NoNewPrivileges bool `json:"noNewPrivileges,omitempty"`
	// ResourceLimits are resource limits of the driver process; a zero field leaves the host's limit.
	ResourceLimits ResourceLimits `json:"limits,omitzero"`
}

// ResourceLimits are per-driver resource limits (setrlimit), applied to the driver process right after
// it starts; its children inherit them.
type ResourceLimits struct {
	// AddressSpaceBytes is RLIMIT_AS: the driver's virtual memory, in bytes.
	AddressSpaceBytes uint64 `json:"addressSpaceBytes,omitempty"`
	// Processes is RLIMIT_NPROC: counted per user, so it bounds every process of the driver's
	// user, not the driver's alone; ignored by the kernel for root.
	Processes uint64 `json:"processes,omitempty"`
	// OpenFiles is RLIMIT_NOFILE: descriptors the driver may hold open.
	OpenFiles uint64 `json:"openFiles,omitempty"`
	// CPUSeconds is RLIMIT_CPU: CPU time in seconds, after which the kernel ends the driver
	// (the supervisor then restarts it).
	CPUSeconds uint64 `json:"cpuSeconds,omitempty"`
}

// IsEnabled reports whether the plugin is enabled (Enabled nil or true).
func (p PluginConfig) IsEnabled() bool { return p.Enabled == nil || *p.Enabled }

// Config configures a Host.
type Config struct {
	// Plugins are the installed driver plugins.
	Plugins []PluginConfig
	// BuiltinProviders are the built-in sandbox providers reported as facts (docs/contract.md section 4),
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
	// Limits bound what a driver may report and how much of the host its output may use. Zero
	// fields mean their defaults.
	Limits Limits
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
	c.Limits = c.Limits.withDefaults()
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
	keys := map[string]int{}
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
		if p.Key != "" {
			if prev, dup := keys[p.Key]; dup {
				fail(field+".key", "%q is already the key of plugins[%d]: plugin keys must be unique", p.Key, prev)
			} else {
				keys[p.Key] = i
			}
		}
		switch {
		case p.Path == "":
			fail(field+".path", "must not be empty")
		case !filepath.IsAbs(p.Path):
			fail(field+".path", "%q must be an absolute path", p.Path)
		}
		if _, err := resolveCredential(p.User, p.Group); err != nil {
			fail(field+".user", "%v", err)
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
	errs = append(errs, c.Limits.validate()...)
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

// resolveCredential resolves user and group (names or numeric ids) to the credential a driver
// runs with; nil when both are empty.
func resolveCredential(userName, groupName string) (*syscall.Credential, error) {
	if userName == "" && groupName == "" {
		return nil, nil
	}
	cred := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Groups: []uint32{}}
	if userName != "" {
		u, err := user.Lookup(userName)
		if err != nil {
			if u, err = user.LookupId(userName); err != nil {
				return nil, fmt.Errorf("no user %q", userName)
			}
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("user %q has no numeric uid and gid", userName)
		}
		cred.Uid, cred.Gid = uint32(uid), uint32(gid)
	}
	if groupName != "" {
		g, err := user.LookupGroup(groupName)
		if err != nil {
			if g, err = user.LookupGroupId(groupName); err != nil {
				return nil, fmt.Errorf("no group %q", groupName)
			}
		}
		gid, err := strconv.ParseUint(g.Gid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("group %q has no numeric gid", groupName)
		}
		cred.Gid = uint32(gid)
	}
	return cred, nil
}
