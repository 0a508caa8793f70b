package server

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/authz-dev/authz/internal/audit"
	"github.com/authz-dev/authz/internal/configcheck"
	"github.com/authz-dev/authz/internal/watch"
)

// Defaults of the server (docs/service.md, "Configuration").
const (
	defaultAddr            = "127.0.0.1:8181"
	defaultMaxBodyBytes    = 1 << 20 // 1 MiB
	defaultShutdownTimeout = 15 * time.Second
)

// Config is what the HTTP server reads: its address, TLS, access control, request limits and
// the decision log. The yaml names are those of the service's configuration file, which
// composes this with the configuration of the plugin host and the decision engine.
type Config struct {
	// Addr is "host:port" or "unix:///absolute/path".
	Addr string `yaml:"addr"`
	// TLS serves HTTPS when both Cert and Key are set.
	TLS TLSConfig `yaml:"tls"`
	// DecisionLog configures the one-line-per-decision log.
	DecisionLog DecisionLogConfig `yaml:"decisionLog"`
	// MaxBodyBytes bounds a request body; a larger one is answered 413.
	MaxBodyBytes int64 `yaml:"maxBodyBytes"`
	// ShutdownTimeout bounds the graceful shutdown: in-flight requests still running after it
	// are cut off.
	ShutdownTimeout time.Duration `yaml:"shutdownTimeout"`
	// HTTP holds the server's connection limits.
	HTTP HTTPConfig `yaml:"http"`

	// Authentication controls who may use the API (docs/service.md, "Authentication").
	Authentication AuthConfig `yaml:"authentication"`

	// Limits bounds what the service holds at once: connections, requests being read, requests
	// being decided. They bound its memory and file descriptors whatever the load.
	Limits LimitsConfig `yaml:"limits"`

	// Watches tunes the watches of POST /v1/authorize/watch (docs/service.md, "Watching a
	// grant"). The section is "watches": "watch" is the bundle option of `opa run`'s --watch.
	Watch WatchConfig `yaml:"watches"`
}

// WatchConfig tunes the watches.
type WatchConfig struct {
	// PingInterval is the longest a watch's stream stays silent: a comment line ": ping" is
	// sent at least this often, so that a client can tell a live stream from a dead one.
	PingInterval time.Duration `yaml:"pingInterval"`
	// RecheckInterval re-decides every watched request this often, whether or not a change was
	// signalled (a driver's config check signals none).
	RecheckInterval time.Duration `yaml:"recheckInterval"`
	// Max caps the open watches; past it a new watch is answered 503 WATCH_LIMIT. An idle
	// watch holds no admission slot.
	Max int `yaml:"max"`
	// MaxBytes caps the bytes of the distinct request bodies the open watches hold (each is
	// kept as sent, to be decided again); past it a new watch is answered 503 WATCH_LIMIT.
	MaxBytes int64 `yaml:"maxBytes"`
	// MaxPerCaller caps the open watches of one caller (its token, else its client
	// certificate, else its peer address); 0 is a quarter of Max. Past it, its new watch is
	// answered 503 WATCH_LIMIT while other callers may still open theirs.
	MaxPerCaller int `yaml:"maxPerCaller"`
	// MaxBytesPerCaller caps the bytes of the distinct request bodies one caller's watches
	// hold; 0 is a quarter of MaxBytes.
	MaxBytesPerCaller int64 `yaml:"maxBytesPerCaller"`
}

// deprecatedWatchKey is a key of limits that watches replaces, read for one release.
type deprecatedWatchKey struct {
	old, new string
	set      bool
}

// deprecatedWatchKeys are the limits.maxWatch* keys, each with the watches key that replaces
// it and whether c sets it.
func (c Config) deprecatedWatchKeys() []deprecatedWatchKey {
	return []deprecatedWatchKey{
		{"limits.maxWatches", "watches.max", c.Limits.MaxWatches != 0},
		{"limits.maxWatchBytes", "watches.maxBytes", c.Limits.MaxWatchBytes != 0},
		{"limits.maxWatchesPerCaller", "watches.maxPerCaller", c.Limits.MaxWatchesPerCaller != 0},
		{"limits.maxWatchBytesPerCaller", "watches.maxBytesPerCaller", c.Limits.MaxWatchBytesPerCaller != 0},
	}
}

// watches is c's watch settings, a deprecated limits.maxWatch* key that is set in place of the
// watches key that replaces it.
func (c Config) watches() WatchConfig {
	w := c.Watch
	if c.Limits.MaxWatches != 0 {
		w.Max = c.Limits.MaxWatches
	}
	if c.Limits.MaxWatchBytes != 0 {
		w.MaxBytes = c.Limits.MaxWatchBytes
	}
	if c.Limits.MaxWatchesPerCaller != 0 {
		w.MaxPerCaller = c.Limits.MaxWatchesPerCaller
	}
	if c.Limits.MaxWatchBytesPerCaller != 0 {
		w.MaxBytesPerCaller = c.Limits.MaxWatchBytesPerCaller
	}
	return w
}

// watchKey is the name of a watch setting as c spells it: the deprecated key when it is set.
func (c Config) watchKey(key string) string {
	for _, k := range c.deprecatedWatchKeys() {
		if k.new == key && k.set {
			return k.old
		}
	}
	return key
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
	// MinBodyRate is the slowest a request body may come, in bytes a second, once BodyGrace
	// has passed since it was admitted: a slower one is cut and answered 408 REQUEST_TIMEOUT,
	// giving its reading place back. Per request (per stream under HTTP/2). 0 turns it off.
	MinBodyRate int64 `yaml:"minBodyRate"`
	// BodyGrace is how long a body may take before MinBodyRate applies.
	BodyGrace time.Duration `yaml:"bodyGrace"`
	// MaxDeciding caps the admitted requests whose body is being decoded, evaluated and
	// logged at once, the stage that costs memory in proportion to the body.
	MaxDeciding int `yaml:"maxDeciding"`
	// QueueWait is how long a decision request waits for a slot of either kind before it is
	// answered 503 SERVICE_OVERLOADED with Retry-After.
	QueueWait time.Duration `yaml:"queueWait"`
	// Deprecated: watches.max, watches.maxBytes, watches.maxPerCaller and
	// watches.maxBytesPerCaller (WatchConfig); these keys are read for one release, in place of
	// those when set (not 0), with a WARN naming the new key.
	MaxWatches             int   `yaml:"maxWatches"`
	MaxWatchBytes          int64 `yaml:"maxWatchBytes"`
	MaxWatchesPerCaller    int   `yaml:"maxWatchesPerCaller"`
	MaxWatchBytesPerCaller int64 `yaml:"maxWatchBytesPerCaller"`
}

// defaultMaxLineBytes is decisionLog.maxLineBytes when the file does not set it; minLineBytes
// is the least it may be (a decision's line with its facts is about 2 KiB).
const (
	defaultMaxLineBytes = 64 << 10
	minLineBytes        = 4 << 10
)

// Defaults of LimitsConfig.
const (
	defaultMaxConnections = 256
	defaultFDReserve      = 64
	defaultMaxReading     = 12
	defaultMaxDeciding    = 2
	defaultMinBodyRate    = 4 << 10
	defaultBodyGrace      = 2 * time.Second
	defaultQueueWait      = time.Second
	defaultMaxWatches     = watch.DefaultMaxWatches
	defaultMaxWatchBytes  = watch.DefaultMaxBytes
)

// validateLimits checks the Limits block.
func (c Config) validateLimits(v *configcheck.Problems) {
	for _, f := range []struct {
		field string
		v     int
	}{
		{"limits.maxConnections", c.Limits.MaxConnections},
		{"limits.maxReading", c.Limits.MaxReading},
		{"limits.maxDeciding", c.Limits.MaxDeciding},
		{c.watchKey("watches.max"), c.watches().Max},
	} {
		if f.v <= 0 {
			v.Add(f.field, "must be a positive number, got %d", f.v)
		}
	}
	if c.Limits.FDReserve < 16 {
		v.Add("limits.fdReserve", "must be at least 16 (plugin restarts need descriptors), got %d", c.Limits.FDReserve)
	}
	if c.Limits.MaxDeciding > c.Limits.MaxReading && c.Limits.MaxReading > 0 {
		v.Add("limits.maxDeciding", "must not be more than limits.maxReading (%d): a request is decided only after it was admitted to be read", c.Limits.MaxReading)
	}
	if c.Limits.QueueWait <= 0 {
		v.Add("limits.queueWait", "must be a positive duration such as 1s, got %v", c.Limits.QueueWait)
	}
	if c.Limits.MinBodyRate < 0 {
		v.Add("limits.minBodyRate", "must be 0 (off) or a positive number of bytes a second, got %d", c.Limits.MinBodyRate)
	}
	if c.Limits.BodyGrace <= 0 && c.Limits.MinBodyRate > 0 {
		v.Add("limits.bodyGrace", "must be a positive duration such as 2s, got %v", c.Limits.BodyGrace)
	}
	w := c.watches()
	if w.MaxPerCaller < 0 {
		v.Add(c.watchKey("watches.maxPerCaller"), "must be 0 (a quarter of watches.max) or a positive number, got %d", w.MaxPerCaller)
	}
	if w.MaxBytesPerCaller < 0 {
		v.Add(c.watchKey("watches.maxBytesPerCaller"), "must be 0 (a quarter of watches.maxBytes) or a positive number of bytes, got %d", w.MaxBytesPerCaller)
	}
	if w.MaxBytes <= 0 {
		v.Add(c.watchKey("watches.maxBytes"), "must be a positive number of bytes, got %d", w.MaxBytes)
	}
}

// TLSConfig names a PEM certificate (chain) and its key.
type TLSConfig struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// DecisionLogConfig configures the decision log.
type DecisionLogConfig struct {
	// Path is a file to append to, "-" for stderr, "" for no decision log.
	Path string `yaml:"path"`
	// Required answers a decision whose line could not be written with 503
	// DECISION_LOG_UNAVAILABLE instead of the decision.
	Required bool `yaml:"required"`
	// Mask lists JSON pointers into the log line, below /input, whose values are replaced by
	// maskedValue. A segment "*" matches every member of an object or element of an array.
	Mask []string `yaml:"mask"`
	// MaxLineBytes caps one line of the log: a longer line has its input's largest members cut
	// (replaced by a note of their size), members the contract does not define first, so that
	// no request multiplies its body into the log. The lines of an AuthZEN batch share it.
	MaxLineBytes int `yaml:"maxLineBytes"`
}

// HTTPConfig holds the limits that keep a slow or hostile client from holding the server.
type HTTPConfig struct {
	ReadHeaderTimeout time.Duration `yaml:"readHeaderTimeout"`
	ReadTimeout       time.Duration `yaml:"readTimeout"`
	WriteTimeout      time.Duration `yaml:"writeTimeout"`
	IdleTimeout       time.Duration `yaml:"idleTimeout"`
	MaxHeaderBytes    int           `yaml:"maxHeaderBytes"`
}

// DefaultConfig is the server's configuration when the file and the flags leave everything
// out: 127.0.0.1:8181, no TLS, no authentication, no decision log.
func DefaultConfig() Config {
	return Config{
		Addr: defaultAddr,
		DecisionLog: DecisionLogConfig{
			// Sandbox provider configs commonly carry credentials.
			Mask:         []string{"/input/environment/config"},
			MaxLineBytes: defaultMaxLineBytes,
		},
		MaxBodyBytes:    defaultMaxBodyBytes,
		ShutdownTimeout: defaultShutdownTimeout,
		HTTP: HTTPConfig{
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       10 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       30 * time.Second,
			MaxHeaderBytes:    32 << 10,
		},
		Authentication: AuthConfig{Mode: AuthOff},
		Limits: LimitsConfig{
			MaxConnections: defaultMaxConnections,
			FDReserve:      defaultFDReserve,
			MaxReading:     defaultMaxReading,
			MaxDeciding:    defaultMaxDeciding,
			MinBodyRate:    defaultMinBodyRate,
			BodyGrace:      defaultBodyGrace,
			QueueWait:      defaultQueueWait,
		},
		Watch: WatchConfig{PingInterval: watch.DefaultPingInterval, RecheckInterval: watch.DefaultRecheckInterval,
			Max: defaultMaxWatches, MaxBytes: defaultMaxWatchBytes},
	}
}

// Validate checks the configuration. Every problem is reported, one per line, each naming its
// field the way the YAML file spells it (e.g. "tls.key: must be set together with tls.cert").
func (c Config) Validate() error {
	v := &configcheck.Problems{}
	c.validateListener(v)
	c.Authentication.validate(c.TLS.Cert != "" && c.TLS.Key != "", v)
	c.DecisionLog.validate(v)
	c.validateHTTP(v)
	c.validateLimits(v)
	return v.Err()
}

// validateListener checks the address and the TLS pair.
func (c Config) validateListener(v *configcheck.Problems) {
	if _, _, err := parseAddr(c.Addr); err != nil {
		v.Add("addr", "%v", err)
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		if c.TLS.Cert == "" {
			v.Add("tls.cert", "must be set together with tls.key")
		} else {
			v.Add("tls.key", "must be set together with tls.cert")
		}
	}
}

// validate checks the masks and that a required log has a destination.
func (c DecisionLogConfig) validate(v *configcheck.Problems) {
	for i, m := range c.Mask {
		if err := audit.CheckMask(m); err != nil {
			v.Add(fmt.Sprintf("decisionLog.mask[%d]", i), "%v", err)
		}
	}
	if c.Required && c.Path == "" {
		v.Add("decisionLog.required", "needs decisionLog.path (a file, or - for stderr)")
	}
	if c.MaxLineBytes < minLineBytes {
		v.Add("decisionLog.maxLineBytes", "must be at least %d bytes (a decision's line with its facts is about 2 KiB), got %d", minLineBytes, c.MaxLineBytes)
	}
}

// validateHTTP checks the body limit, the time-outs and the header limit.
func (c Config) validateHTTP(v *configcheck.Problems) {
	if c.MaxBodyBytes <= 0 {
		v.Add("maxBodyBytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	for _, p := range []struct {
		field string
		d     time.Duration
	}{
		{"shutdownTimeout", c.ShutdownTimeout},
		{"http.readHeaderTimeout", c.HTTP.ReadHeaderTimeout},
		{"http.readTimeout", c.HTTP.ReadTimeout},
		{"http.writeTimeout", c.HTTP.WriteTimeout},
		{"http.idleTimeout", c.HTTP.IdleTimeout},
		{"watches.pingInterval", c.Watch.PingInterval},
		{"watches.recheckInterval", c.Watch.RecheckInterval},
	} {
		if p.d <= 0 {
			v.Add(p.field, "must be a positive duration such as 5s, got %v", p.d)
		}
	}
	if c.HTTP.MaxHeaderBytes < 1024 {
		v.Add("http.maxHeaderBytes", "must be at least 1024, got %d", c.HTTP.MaxHeaderBytes)
	}
}

// parseAddr splits a listen address into a network ("tcp" or "unix") and an address:
// "host:port" or "unix:///absolute/path".
func parseAddr(addr string) (network, address string, err error) {
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
