package pluginhost

import (
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/configcheck"
)

// Defaults of Config. A zero duration in Config means its default.
const (
	DefaultStartTimeout       = 10 * time.Second
	DefaultConfigCheckTimeout = 2 * time.Second
	DefaultMinBackoff         = 100 * time.Millisecond
	defaultMaxBackoff         = 5 * time.Second

	DefaultHealthInterval         = time.Second
	DefaultHealthTimeout          = time.Second
	DefaultHealthPinCheckInterval = time.Minute
)

// Readiness modes (Config.Readiness).
const (
	// ReadinessStarted: ready once every enabled plugin configured at the start has been ready
	// once, and from then on whatever the plugins do (the default).
	ReadinessStarted = "started"
	// ReadinessAllPlugins: ready only while every enabled plugin configured now has a live
	// worker.
	ReadinessAllPlugins = "allPlugins"
)

// HealthConfig says how the host checks that running workers still answer and that the pinned
// binaries on disk are still the pinned ones. Zero durations mean their defaults.
type HealthConfig struct {
	// Interval is the time between two health checks of a worker (go-plugin's gRPC health
	// service), and between two looks at its main thread.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one health check. A worker that does not answer within it is dropped from
	// the facts at once, killed and restarted as a new generation.
	Timeout time.Duration `yaml:"timeout"`
	// PinCheckInterval is the time between two hashes of each plugin's binary on disk; one that
	// no longer matches its pin is logged and shown as pinDrift.
	PinCheckInterval time.Duration `yaml:"pinCheckInterval"`
}

// SelfExecutable is the plugin path that stands for the running executable itself
// (os.Executable()). Its SHA-256 pin may be left empty: Resolve computes it.
const SelfExecutable = "@self"

// PluginConfig is one installed driver plugin, as the configuration file writes it (the yaml
// names) and as the host runs it.
type PluginConfig struct {
	// ID is the plugin id that leases pin (lease.metadata.pluginId). Non-empty and unique.
	ID string `yaml:"id"`
	// Path is the driver binary: an absolute path once resolved (Resolve turns a relative path
	// and SelfExecutable into one).
	Path string `yaml:"path"`
	// SHA256 is the hex SHA-256 of the binary at Path (64 hex characters). The host refuses to
	// start a binary with another hash. Compute it with `sha256sum PATH`.
	SHA256 string `yaml:"sha256"`
	// Key, when set, is the plugin key the driver must report: a driver that reports another key
	// is refused, and no other plugin may report this one. Empty: the plugin key is whatever the
	// driver reports, as long as no other plugin holds it.
	Key string `yaml:"key"`
	// Args are passed to the binary.
	Args []string `yaml:"args"`
	// Enabled turns the plugin off when false; nil means enabled.
	Enabled *bool `yaml:"enabled"`
	// AllowWritableBinary starts the plugin (with a loud warning at every start) even when its
	// binary or the directory holding it is writable by group or others. By default the host
	// refuses: whoever can write there can replace the driver.
	AllowWritableBinary bool `yaml:"allowWritableBinary"`

	// Least privilege, all optional (Linux). See docs/drivers.md for the trade-offs.

	// User and Group run the driver as this user and group (a name or a numeric id), with no
	// supplementary groups. Switching needs the privilege to (root, or CAP_SETUID and
	// CAP_SETGID). With User alone, the group is the user's primary group. Empty: a host that
	// is not root runs the driver as its own user; a root host runs it as an unprivileged user
	// of the plugin's own (a dynamic uid; docs/drivers.md, "Least privilege").
	// A driver runs as root only with User "root" (or "0"), explicitly.
	User  string `yaml:"user"`
	Group string `yaml:"group"`
	// NoNewPrivileges sets no_new_privs on the driver: neither it nor anything it executes can
	// gain privileges (setuid binaries, file capabilities).
	NoNewPrivileges bool `yaml:"noNewPrivileges"`
	// ResourceLimits are resource limits of the driver process; a zero field leaves the host's limit.
	ResourceLimits ResourceLimits `yaml:"limits"`
	// Sandbox widens what the driver's Landlock sandbox lets it reach (Linux; docs/drivers.md,
	// "What a driver can and cannot do"). By default a driver reads system libraries,
	// certificates and name resolution files, writes only its private temporary directory
	// (TMPDIR), binds no TCP port and connects to none.
	Sandbox SandboxConfig `yaml:"sandbox"`
}

// SandboxConfig is what a driver may reach beyond its default sandbox.
type SandboxConfig struct {
	// ReadPaths are files or directories (absolute; directories with everything below) the
	// driver may read and execute.
	ReadPaths []string `yaml:"readPaths"`
	// WritePaths are files or directories (absolute) the driver may read, write, execute,
	// create in and remove from.
	WritePaths []string `yaml:"writePaths"`
	// ConnectTCP are the TCP ports the driver may connect to (on any address: its API's
	// port, 443 for HTTPS). Landlock cannot bound the address, only the port.
	ConnectTCP []uint16 `yaml:"connectTCP"`
}

// Default limits of a driver, where its plugin sets none.
const (
	// DefaultFileSizeBytes is RLIMIT_FSIZE: 1 GiB.
	DefaultFileSizeBytes = 1 << 30
	// DefaultProcesses is RLIMIT_NPROC (processes and threads) where it counts only the
	// driver: a driver in a user namespace of its own, or of a uid of its own. Elsewhere (a
	// driver of the host's uid without a user namespace) it would count the host's threads too,
	// and no default applies.
	DefaultProcesses = 1024
	// DefaultOpenFiles is RLIMIT_NOFILE: a driver inherited the service's (often tens of
	// thousands), and with DefaultProcesses processes could hold a good part of the machine's
	// file table (fs.file-max), which every unprivileged process shares.
	DefaultOpenFiles = 1024
	// DefaultDataBytes is RLIMIT_DATA: 4 GiB of heap and other private writable memory. A Go
	// driver's heap counts, the address space the runtime reserves does not (an idle test
	// driver has about 40 MiB, one built with the race detector about 300 MiB, and about four
	// times its heap as it grows); a driver that needs more sets limits.dataBytes.
	DefaultDataBytes = 4 << 30
	// DefaultTempDirBytes is the size of the driver's private temporary directory (TMPDIR) where
	// it is a tmpfs of its own: 64 MiB, what all its files there hold together (kept in memory,
	// and counted in the worker's cgroup memory). A driver that unpacks or caches more sets
	// limits.tempDirBytes.
	DefaultTempDirBytes = 64 << 20
	// minTempDirBytes is the smallest limits.tempDirBytes accepted.
	minTempDirBytes = 1 << 20
)

// ResourceLimits are per-driver resource limits (setrlimit), applied to the driver process right after
// it starts; its children inherit them.
type ResourceLimits struct {
	// AddressSpaceBytes is RLIMIT_AS: the driver's virtual memory, in bytes.
	AddressSpaceBytes uint64 `yaml:"addressSpaceBytes"`
	// Processes is RLIMIT_NPROC: counted per user, so it bounds every process of the driver's
	// user, not the driver's alone; ignored by the kernel for root.
	Processes uint64 `yaml:"processes"`
	// OpenFiles is RLIMIT_NOFILE: descriptors the driver may hold open. Zero: the default,
	// DefaultOpenFiles.
	OpenFiles uint64 `yaml:"openFiles"`
	// CPUSeconds is RLIMIT_CPU: CPU time in seconds, after which the kernel ends the driver
	// (the supervisor then restarts it).
	CPUSeconds uint64 `yaml:"cpuSeconds"`
	// DataBytes is RLIMIT_DATA: the driver's heap and other private writable memory, in bytes
	// (unlike RLIMIT_AS, the address space a Go program reserves does not count). Zero: the
	// default, DefaultDataBytes.
	DataBytes uint64 `yaml:"dataBytes"`
	// TempDirBytes is the size of the driver's private temporary directory (TMPDIR, where its
	// socket is too), a tmpfs in a mount namespace of the driver's own: all its files there
	// together, in bytes (a write past it fails with ENOSPC), and one file or directory per
	// 16 KiB of it (at least 1024). Zero: the default, DefaultTempDirBytes. Where the kernel
	// refuses the mount namespace, TMPDIR is a plain directory (the host says so).
	TempDirBytes uint64 `yaml:"tempDirBytes"`
	// FileSizeBytes is RLIMIT_FSIZE: the largest file the driver may write, in bytes. Zero: the
	// default, DefaultFileSizeBytes.
	FileSizeBytes uint64 `yaml:"fileSizeBytes"`
	// MemoryMax is memory.max of the worker's cgroup (v2): the memory of the driver and every
	// descendant together, in bytes. It needs the memory controller delegated to the host;
	// Validate refuses it where it cannot be applied.
	MemoryMax uint64 `yaml:"memoryMax"`
	// PidsMax is pids.max of the worker's cgroup (v2): how many processes and threads the driver
	// and its descendants may have together. It needs the pids controller delegated to the host;
	// Validate refuses it where it cannot be applied.
	PidsMax uint64 `yaml:"pidsMax"`
}

// IsEnabled reports whether the plugin is enabled (Enabled nil or true).
func (p PluginConfig) IsEnabled() bool { return p.Enabled == nil || *p.Enabled }

// Config configures a Host. The fields with a yaml name are those of the configuration file;
// the others are set by the program.
type Config struct {
	// Plugins are the installed driver plugins.
	Plugins []PluginConfig `yaml:"plugins"`
	// BuiltinProviders are the built-in sandbox providers reported as facts (the facts'
	// builtinProviders), e.g. {"fake": {"execute": true, "supportsReusableLeases": false}}.
	// Each is an object with only those two fields, both booleans.
	BuiltinProviders map[string]map[string]any `yaml:"builtinProviders"`
	// StartTimeout bounds one start of a worker: the go-plugin handshake, and then Describe and
	// SupportedMethods. Zero means DefaultStartTimeout.
	StartTimeout time.Duration `yaml:"pluginStartTimeout"`
	// ConfigCheckTimeout bounds one CheckConfig call, the driver's config check inside a
	// decision. Zero means DefaultConfigCheckTimeout.
	ConfigCheckTimeout time.Duration `yaml:"configCheckTimeout"`
	// ConfigCheck bounds each plugin's config checks: how many run at once, how long a failure
	// is kept, and when a plugin whose checks time out fails fast. Zero fields mean their
	// defaults.
	ConfigCheck ConfigCheckConfig `yaml:"configCheck"`
	// Health configures the health checks of running workers and of pinned binaries.
	Health HealthConfig `yaml:"health"`
	// Readiness is what Ready reports: ReadinessStarted (empty means it) or
	// ReadinessAllPlugins.
	Readiness string `yaml:"readiness"`
	// InsecureSkipPinCheck starts binaries without checking their SHA-256. Development only:
	// the host logs a loud warning at every start.
	InsecureSkipPinCheck bool `yaml:"-"`
	// MinBackoff and MaxBackoff bound the wait before a restart; it doubles after every failed
	// or short-lived start and goes back to MinBackoff once a worker stayed up for at least
	// twice MaxBackoff. Zero means DefaultMinBackoff / defaultMaxBackoff.
	MinBackoff time.Duration `yaml:"-"`
	MaxBackoff time.Duration `yaml:"-"`
	// Limits bound what a driver may report and how much of the host its output may use. Zero
	// fields mean their defaults.
	Limits Limits `yaml:"-"`
	// Logger receives the host's log and every plugin's stderr. Nil means hclog's default logger.
	Logger hclog.Logger `yaml:"-"`
	// SocketDir is where each worker start gets a private directory for its unix socket
	// (removed when the worker ends, and after a failed start). Empty means os.TempDir().
	SocketDir string `yaml:"-"`
}

// DefaultConfig returns a configuration with no plugins and every default set.
func DefaultConfig() Config {
	return Config{
		BuiltinProviders:   map[string]map[string]any{},
		StartTimeout:       DefaultStartTimeout,
		ConfigCheckTimeout: DefaultConfigCheckTimeout,
		MinBackoff:         DefaultMinBackoff,
		MaxBackoff:         defaultMaxBackoff,
		Health: HealthConfig{
			Interval:         DefaultHealthInterval,
			Timeout:          DefaultHealthTimeout,
			PinCheckInterval: DefaultHealthPinCheckInterval,
		},
		Readiness: ReadinessStarted,
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
		c.MaxBackoff = max(defaultMaxBackoff, c.MinBackoff)
	}
	if c.Health.Interval == 0 {
		c.Health.Interval = DefaultHealthInterval
	}
	if c.Health.Timeout == 0 {
		c.Health.Timeout = DefaultHealthTimeout
	}
	if c.Health.PinCheckInterval == 0 {
		c.Health.PinCheckInterval = DefaultHealthPinCheckInterval
	}
	if c.Readiness == "" {
		c.Readiness = ReadinessStarted
	}
	if c.Logger == nil {
		c.Logger = hclog.Default()
	}
	c.Limits = c.Limits.withDefaults()
	c.ConfigCheck = c.ConfigCheck.withDefaults()
	return c
}

// Resolve returns the configuration with every plugin path made absolute: SelfExecutable
// becomes the running executable (pinned by its own SHA-256 unless a pin is configured), a
// relative path is taken from the working directory. Pins are written in lower case. It is the
// step between a configuration file and New; an empty path is left for Validate to report.
func (c Config) Resolve() (Config, error) {
	plugins := make([]PluginConfig, len(c.Plugins))
	var self, selfSum string
	for i, p := range c.Plugins {
		switch {
		case p.Path == SelfExecutable:
			if self == "" {
				var err error
				if self, selfSum, err = selfExecutable(); err != nil {
					return c, &configcheck.FieldError{Field: fmt.Sprintf("plugins[%d].path", i), Err: err}
				}
			}
			p.Path = self
			if p.SHA256 == "" {
				p.SHA256 = selfSum
			}
		case p.Path != "" && !filepath.IsAbs(p.Path):
			abs, err := filepath.Abs(p.Path)
			if err != nil {
				return c, &configcheck.FieldError{Field: fmt.Sprintf("plugins[%d].path", i), Err: err}
			}
			p.Path = abs
		}
		p.SHA256 = strings.ToLower(p.SHA256)
		plugins[i] = p
	}
	c.Plugins = plugins
	return c, nil
}

// selfExecutable returns the running executable, its links resolved, and its SHA-256.
func selfExecutable() (path, sum string, err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", "", fmt.Errorf("find the authz executable: %w", err)
	}
	if exe, err = filepath.EvalSymlinks(exe); err != nil {
		return "", "", err
	}
	if sum, err = FileSHA256(exe); err != nil {
		return "", "", fmt.Errorf("pin the authz executable: %w", err)
	}
	return exe, sum, nil
}

// Validate checks the configuration and returns every problem, each naming its field the way
// the configuration file spells it, e.g. "plugins[1].sha256: must be 64 hex characters".
// Paths must be absolute: Resolve a configuration read from a file first.
func (c Config) Validate() error {
	v := &configcheck.Problems{}
	c.validatePlugins(v)
	c.validateBuiltinProviders(v)
	c.validateDurations(v)
	c.ConfigCheck.validate(v)
	c.Limits.validate(v)
	return v.Err()
}

// validatePlugins checks each plugin and that ids and configured keys are unique.
func (c Config) validatePlugins(v *configcheck.Problems) {
	ids := map[string]int{}
	keys := map[string]int{}
	for i, p := range c.Plugins {
		field := fmt.Sprintf("plugins[%d]", i)
		validatePluginID(v, field, p.ID, ids, i)
		if p.Key != "" {
			if err := checkPluginKey(p.Key); err != nil {
				v.Add(field+".key", "%s", err)
			} else if prev, dup := keys[p.Key]; dup {
				v.Add(field+".key", "%q is already the key of plugins[%d]: plugin keys must be unique", p.Key, prev)
			} else {
				keys[p.Key] = i
			}
		}
		switch {
		case p.Path == "":
			v.Add(field+".path", "must not be empty: name the driver executable (or %q for authz itself)", SelfExecutable)
		case !filepath.IsAbs(p.Path):
			v.Add(field+".path", "%q must be an absolute path", p.Path)
		}
		if _, err := resolveCredential(p.User, p.Group); err != nil {
			v.Add(field+".user", "%v", err)
		}
		validateCgroupLimits(v, field+".limits", p.ResourceLimits)
		if b := p.ResourceLimits.TempDirBytes; b != 0 && b < minTempDirBytes {
			v.Add(field+".limits.tempDirBytes", "%d is less than %d (1 MiB); zero means the default, %d (64 MiB)", b, minTempDirBytes, DefaultTempDirBytes)
		}
		for j, path := range p.Sandbox.ReadPaths {
			if !filepath.IsAbs(path) {
				v.Add(fmt.Sprintf("%s.sandbox.readPaths[%d]", field, j), "%q must be an absolute path", path)
			}
		}
		for j, path := range p.Sandbox.WritePaths {
			if !filepath.IsAbs(path) {
				v.Add(fmt.Sprintf("%s.sandbox.writePaths[%d]", field, j), "%q must be an absolute path", path)
			}
		}
		switch {
		case p.SHA256 == "" && c.InsecureSkipPinCheck:
			// Allowed in development only; Start warns.
		case !isSHA256Hex(p.SHA256):
			v.Add(field+".sha256", "must be 64 hex characters (compute it with: sha256sum %s)", orPlaceholder(p.Path))
		}
	}
}

// validatePluginID checks one plugin id and records it in seen.
func validatePluginID(v *configcheck.Problems, field, id string, seen map[string]int, i int) {
	prev, dup := seen[id]
	switch {
	case id == "":
		v.Add(field+".id", "must not be empty")
	case strings.TrimSpace(id) != id:
		v.Add(field+".id", "must not start or end with white space: %q", id)
	case dup:
		v.Add(field+".id", "%q is already the id of plugins[%d]: plugin ids must be unique", id, prev)
	default:
		seen[id] = i
	}
}

// builtinProviderFields are the fields of a built-in provider in the facts.
var builtinProviderFields = []string{"execute", "supportsReusableLeases"}

// validateBuiltinProviders checks the built-in providers. The schema is closed: a built-in
// provider has exactly the fields the facts give one, and anything else (a credential pasted in
// by mistake) would be shown on GET /v1/facts and in every decision log line.
func (c Config) validateBuiltinProviders(v *configcheck.Problems) {
	for _, name := range slices.Sorted(maps.Keys(c.BuiltinProviders)) {
		b := c.BuiltinProviders[name]
		if name == "" {
			v.Add("builtinProviders", "provider keys must not be empty")
		}
		if b == nil {
			v.Add("builtinProviders."+name, "must be an object such as {execute: true}, not empty")
		}
		for _, k := range slices.Sorted(maps.Keys(b)) {
			field := fmt.Sprintf("builtinProviders.%s.%s", name, k)
			if !slices.Contains(builtinProviderFields, k) {
				v.Add(field, "unknown field: a built-in provider has only %s", strings.Join(builtinProviderFields, " and "))
				continue
			}
			if _, isBool := b[k].(bool); !isBool {
				v.Add(field, "must be true or false (unquoted), got %s", describeValue(b[k]))
			}
		}
	}
}

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

// validateDurations checks the time-outs and the back-off.
func (c Config) validateDurations(v *configcheck.Problems) {
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"pluginStartTimeout", c.StartTimeout},
		{"configCheckTimeout", c.ConfigCheckTimeout},
		{"minBackoff", c.MinBackoff},
		{"maxBackoff", c.MaxBackoff},
		{"health.interval", c.Health.Interval},
		{"health.timeout", c.Health.Timeout},
		{"health.pinCheckInterval", c.Health.PinCheckInterval},
	} {
		if d.v < 0 {
			v.Add(d.field, "must not be negative (zero means the default)")
		}
	}
	if c.MinBackoff > 0 && c.MaxBackoff > 0 && c.MaxBackoff < c.MinBackoff {
		v.Add("maxBackoff", "%s must be at least minBackoff (%s)", c.MaxBackoff, c.MinBackoff)
	}
	if d := c.Health.Timeout; d > 0 && d < minHealthTimeout {
		v.Add("health.timeout", "%s is too short for a busy host to answer in (at least %s; zero means the default, %s)", d, minHealthTimeout, DefaultHealthTimeout)
	}
	switch c.Readiness {
	case "", ReadinessStarted, ReadinessAllPlugins:
	default:
		v.Add("readiness", "%q is neither %q nor %q", c.Readiness, ReadinessStarted, ReadinessAllPlugins)
	}
}

// minHealthTimeout is the shortest health.timeout accepted: below it, a healthy worker on a
// loaded machine would be killed for being slow.
const minHealthTimeout = 10 * time.Millisecond

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

// Defaults of ConfigCheckConfig.
const (
	DefaultConfigCheckMaxConcurrent   = 4
	DefaultConfigCheckMaxWait         = 250 * time.Millisecond
	DefaultConfigCheckFailureTTL      = time.Second
	DefaultConfigCheckBreakerTimeouts = 5
	DefaultConfigCheckBreakerCooldown = 10 * time.Second
)

// ConfigCheckConfig bounds the config checks of each plugin (the configCheck section of the
// configuration file). Every plugin has its own share: what one plugin or its callers do does
// not hold up the checks of another. A zero field means its default.
type ConfigCheckConfig struct {
	// MaxConcurrent bounds the config checks of one plugin in progress at once (identical
	// checks in progress are one). Default DefaultConfigCheckMaxConcurrent.
	MaxConcurrent int `yaml:"maxConcurrent"`
	// MaxWait bounds how long a check waits for its turn when MaxConcurrent are in progress;
	// then the config is not valid (CONFIG_CHECK_SHED). Default DefaultConfigCheckMaxWait.
	MaxWait time.Duration `yaml:"maxWait"`
	// FailureTTL is how long a check that failed (an error or a time-out) is kept: the same
	// check within it is not valid without asking the driver again. Answers ("valid", "not
	// valid") are kept while the worker runs. Default DefaultConfigCheckFailureTTL.
	FailureTTL time.Duration `yaml:"failureTTL"`
	// BreakerTimeouts is how many consecutive time-outs open the plugin's breaker: its checks
	// are then not valid at once (CONFIG_CHECK_UNAVAILABLE) for BreakerCooldown, after which
	// one check is let through as a probe; an answer closes the breaker, a time-out opens it
	// again. A new worker starts closed. Defaults DefaultConfigCheckBreakerTimeouts and
	// DefaultConfigCheckBreakerCooldown.
	BreakerTimeouts int           `yaml:"breakerTimeouts"`
	BreakerCooldown time.Duration `yaml:"breakerCooldown"`
}

// withDefaults fills zero fields.
func (c ConfigCheckConfig) withDefaults() ConfigCheckConfig {
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultConfigCheckMaxConcurrent
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultConfigCheckMaxWait
	}
	if c.FailureTTL == 0 {
		c.FailureTTL = DefaultConfigCheckFailureTTL
	}
	if c.BreakerTimeouts == 0 {
		c.BreakerTimeouts = DefaultConfigCheckBreakerTimeouts
	}
	if c.BreakerCooldown == 0 {
		c.BreakerCooldown = DefaultConfigCheckBreakerCooldown
	}
	return c
}

// validate reports every negative field.
func (c ConfigCheckConfig) validate(v *configcheck.Problems) {
	if c.MaxConcurrent < 0 {
		v.Add("configCheck.maxConcurrent", "must not be negative (zero means the default, %d)", DefaultConfigCheckMaxConcurrent)
	}
	if c.BreakerTimeouts < 0 {
		v.Add("configCheck.breakerTimeouts", "must not be negative (zero means the default, %d)", DefaultConfigCheckBreakerTimeouts)
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{
		{"configCheck.maxWait", c.MaxWait},
		{"configCheck.failureTTL", c.FailureTTL},
		{"configCheck.breakerCooldown", c.BreakerCooldown},
	} {
		if d.v < 0 {
			v.Add(d.field, "must not be negative (zero means the default)")
		}
	}
}

// validateCgroupLimits refuses memoryMax and pidsMax where this host cannot apply them.
func validateCgroupLimits(v *configcheck.Problems, field string, l ResourceLimits) {
	if l.MemoryMax == 0 && l.PidsMax == 0 {
		return
	}
	err := cgroupLimitsProblem()
	if err == nil {
		return
	}
	for _, f := range []struct {
		name string
		v    uint64
	}{{"memoryMax", l.MemoryMax}, {"pidsMax", l.PidsMax}} {
		if f.v != 0 {
			v.Add(field+"."+f.name, "cannot be applied here: %v; remove it, or run authz where the cgroup v2 memory and pids controllers are delegated to it", err)
		}
	}
}
