package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/server"
)

func init() { extraCommands["serve"] = runServe }

const serveUsage = `Usage: authz serve [--config FILE] [flags]

Runs the HTTP authorization service (docs/service.md): POST /v1/authorize,
POST /v1/capabilities, POST /v1/data/authz/decision[/path] and POST / (OPA Data API),
GET /v1/plugins, GET /v1/facts, GET /v1/status, GET /health, GET /health/ready, GET /metrics.

With no flags it listens on 127.0.0.1:8181 with the embedded policy and starts the built-in
example driver as plugin example.sandbox. --bundle PATH serves a policy bundle instead (as
opa run --bundle); an opa: section in the configuration file downloads bundles with OPA's
plugin manager. The configuration file (YAML, examples/config.yaml)
is optional; flags override it. An invalid configuration exits with status 2 and names the
field. SIGINT/SIGTERM shut down gracefully: in-flight requests finish, then plugins stop.
SIGHUP reopens the decision log file (log rotation) and reloads the policy bundle.

Flags:
`

// serveFlags are the flags of `authz serve`; each overrides its configuration field when given.
type serveFlags struct {
	config              string
	addr                string
	tlsCert, tlsKey     string
	facts               string
	decisionLog         string
	decisionLogRequired bool
	decisionLogMask     maskFlag
	maxBodyBytes        int64
	evalTimeout         time.Duration
	decisionCache       string
	logLevel            string
	logJSON             bool

	// Access control (the authentication block of the configuration).
	authentication string
	tokensFile     string
	clientCAFile   string
	allowedHosts   maskFlag
}

func runServe(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f serveFlags
	def := server.DefaultConfig()
	fs.StringVar(&f.config, "config", "", "YAML configuration file (optional; examples/config.yaml documents every field)")
	fs.StringVar(&f.addr, "addr", def.Addr, "listen address: host:port, or unix:///absolute/path")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM certificate (chain) for HTTPS; needs --tls-key")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM private key for HTTPS; needs --tls-cert")
	fs.StringVar(&f.facts, "facts", "", "static facts file (docs/contract.md section 4) instead of live plugins")
	fs.StringVar(&f.decisionLog, "decision-log", "", `decision log: a file to append to, "-" for stderr, "" for none`)
	fs.BoolVar(&f.decisionLogRequired, "decision-log-required", false, "answer 503 DECISION_LOG_UNAVAILABLE when a decision's log line cannot be written")
	fs.Var(&f.decisionLogMask, "decision-log-mask", "JSON pointers below /input masked in the decision log, comma-separated or repeated;\nreplaces the configured list (default /input/environment/config; \"\" for none)")
	fs.Int64Var(&f.maxBodyBytes, "max-body-bytes", def.MaxBodyBytes, "largest request body; larger is 413")
	fs.DurationVar(&f.evalTimeout, "eval-timeout", def.EvalTimeout, "bound on one decision: input assembly and evaluation")
	fs.StringVar(&f.decisionCache, "decision-cache", def.DecisionCache, "answer repeated decisions from the decision cache: on or off")
	fs.StringVar(&f.logLevel, "log-level", def.Log.Level, "service log level: trace, debug, info, warn, error, off")
	fs.BoolVar(&f.logJSON, "log-json", false, "write the service log as JSON lines")
	fs.StringVar(&f.authentication, "authentication", "off", "who may use the API: off, token (bearer tokens from --authentication-tokens-file)\nor tls (client certificates signed by --tls-ca-cert-file; needs --tls-cert)")
	fs.StringVar(&f.tokensFile, "authentication-tokens-file", "", "bearer tokens, one per line with its scopes: TOKEN decide|inspect|decide,inspect")
	fs.StringVar(&f.clientCAFile, "tls-ca-cert-file", "", "PEM CA certificate(s) that sign client certificates (--authentication tls)")
	fs.Var(&f.allowedHosts, "allowed-host", "host name accepted in the Host header on loopback, besides localhost, 127.0.0.1, [::1];\ncomma-separated or repeated; replaces the configured list; * accepts any")
	pf := registerPolicyFlags(fs, true) // policy source flags: policyflags.go
	fs.Usage = func() { fmt.Fprint(stderr, serveUsage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return &exitError{code: 2}
	}
	if fs.NArg() > 0 {
		return usageError("serve: unexpected argument %q (see authz serve -h)", fs.Arg(0))
	}

	cfg, err := loadServeConfig(fs, &f)
	if err != nil {
		return usageError("serve: %v", err)
	}
	pf.apply(fs, &cfg.Policy) // the policy flags override the policy keys of the file
	if err := cfg.Validate(); err != nil {
		return usageError("serve: invalid configuration:\n%v", err)
	}

	logger := hclog.New(&hclog.LoggerOptions{
		Name:       "authz",
		Level:      hclog.LevelFromString(cfg.Log.Level),
		JSONFormat: cfg.Log.JSON,
		Output:     stderr,
	})
	// SIGHUP reloads what can be reloaded while serving: the decision log file is reopened
	// (log rotation). Everything else needs a restart. Caught from here on, so that a SIGHUP
	// during the start does not end the process; it is acted on once the service serves.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// The admission limits bound the live memory; a soft limit at the documented bound
	// makes the garbage collector return memory before the heap doubles past it. GOMEMLIMIT,
	// when set, wins.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(cfg.MemoryBound())
	}

	// The policy comes from the source cfg.Policy names (policyflags.go): embedded, a bundle
	// file or directory, or remote bundles through OPA's plugin manager.
	engine, policySrc, err := startPolicy(ctx, cfg.Policy, decision.Options{EvalTimeout: cfg.EvalTimeout, ConfigCheckTimeout: cfg.ConfigCheckTimeout,
		MaxConcurrent: runtime.GOMAXPROCS(0), Cache: decision.CacheOptions{Disabled: cfg.DecisionCache == "off"}}, logger)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer policySrc.Close(context.WithoutCancel(ctx)) // runs after Serve returned

	var facts server.FactsSource
	var startPlugins func() (stop func(), err error)
	if cfg.Facts != "" {
		sf, err := server.LoadStaticFacts(cfg.Facts)
		if err != nil {
			return usageError("serve: facts: %s: %v", cfg.Facts, err)
		}
		facts = sf
		logger.Info("using static facts; no plugin is started", "facts", cfg.Facts)
	} else {
		hf, err := newHostFacts(cfg, logger)
		if err != nil {
			return usageError("serve: %v", err)
		}
		facts = hf
		startPlugins = func() (func(), error) { return hf.start(ctx, cfg) }
	}

	srv, err := server.New(cfg, engine, facts, server.Options{Logger: logger, Policy: policySrc})
	if err != nil {
		return usageError("serve: %v", err)
	}
	// Deferred calls run last first: the HTTP server stops (Serve returns), then the plugins,
	// then the decision log closes, and only then does the log say the service has stopped.
	defer logger.Info("stopped: exiting")
	defer srv.Close()

	ln, err := server.Listen(cfg.Addr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if startPlugins != nil {
		stop, err := startPlugins()
		if err != nil {
			ln.Close()
			return fmt.Errorf("serve: start plugins: %w", err)
		}
		// Runs after Serve returned: in-flight requests have finished by then.
		defer stop()
	}
	reloadDone := make(chan struct{})
	serveDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		for {
			select {
			case <-hup:
				logger.Info("SIGHUP: reloading")
				_ = srv.Reload()
				_ = policySrc.Reload(ctx) // a bundle that fails is logged and the active policy stays
			case <-serveDone:
				return
			}
		}
	}()
	defer func() { close(serveDone); <-reloadDone }()
	return srv.Serve(ctx, ln)
}

// loadServeConfig reads the configuration file (if any) over the defaults and applies the
// flags that were given.
func loadServeConfig(fs *flag.FlagSet, f *serveFlags) (server.Config, error) {
	cfg := server.DefaultConfig()
	if f.config != "" {
		file, err := os.Open(f.config)
		if err != nil {
			return cfg, err
		}
		cfg, err = server.ParseConfig(file)
		file.Close()
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", f.config, err)
		}
	}
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "addr":
			cfg.Addr = f.addr
		case "tls-cert":
			cfg.TLS.Cert = f.tlsCert
		case "tls-key":
			cfg.TLS.Key = f.tlsKey
		case "facts":
			cfg.Facts = f.facts
		case "decision-log":
			cfg.DecisionLog.Path = f.decisionLog
		case "decision-log-required":
			cfg.DecisionLog.Required = f.decisionLogRequired
		case "decision-log-mask":
			cfg.DecisionLog.Mask = f.decisionLogMask.list
		case "max-body-bytes":
			cfg.MaxBodyBytes = f.maxBodyBytes
		case "eval-timeout":
			cfg.EvalTimeout = f.evalTimeout
		case "decision-cache":
			cfg.DecisionCache = f.decisionCache
		case "log-level":
			cfg.Log.Level = f.logLevel
		case "log-json":
			cfg.Log.JSON = f.logJSON
		case "authentication":
			cfg.Authentication.Mode = f.authentication
		case "authentication-tokens-file":
			cfg.Authentication.TokensFile = f.tokensFile
		case "tls-ca-cert-file":
			cfg.Authentication.ClientCAFile = f.clientCAFile
		case "allowed-host":
			cfg.Authentication.AllowedHosts = f.allowedHosts.list
		}
	})
	return cfg, nil
}

// hostFacts adapts the live plugin host to server.FactsSource. It is the only place that knows
// both packages.
type hostFacts struct {
	*pluginhost.Host
	log     hclog.Logger
	started atomic.Bool
}

var _ server.FactsSource = (*hostFacts)(nil)

// newHostFacts resolves the plugin paths and pins of cfg and creates (does not start) the host.
func newHostFacts(cfg server.Config, logger hclog.Logger) (*hostFacts, error) {
	plugins, err := resolvePlugins(cfg.Plugins)
	if err != nil {
		return nil, err
	}
	host, err := pluginhost.New(pluginhost.Config{
		Plugins:            plugins,
		BuiltinProviders:   cfg.BuiltinProviders,
		StartTimeout:       cfg.PluginStartTimeout,
		ConfigCheckTimeout: cfg.ConfigCheckTimeout,
		Logger:             logger.Named("plugins"),
	})
	if err != nil {
		return nil, err
	}
	return &hostFacts{Host: host, log: logger}, nil
}

// start starts the plugins and watches for the first start of each; stop closes the host and
// waits for the watcher.
func (h *hostFacts) start(ctx context.Context, cfg server.Config) (stop func(), err error) {
	if err := h.Host.Start(ctx); err != nil {
		_ = h.Host.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		wctx, cancel := context.WithTimeout(ctx, cfg.PluginStartTimeout)
		err := h.WaitStarted(wctx)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, pluginhost.ErrClosed) {
			h.log.Warn("plugins have not started yet; GET /health/ready answers 503 until they have", "error", err)
			err = h.WaitStarted(ctx)
		}
		if err == nil {
			h.started.Store(true)
			h.log.Info("all enabled plugins started; ready")
		}
	})
	return func() {
		h.log.Info("stopping plugins")
		_ = h.Host.Close()
		wg.Wait()
		h.log.Info("plugins stopped")
	}, nil
}

// Ready implements server.FactsSource: every enabled plugin has been ready at least once.
func (h *hostFacts) Ready() bool { return h.started.Load() }

// Plugins implements server.FactsSource.
func (h *hostFacts) Plugins() []server.PluginInfo {
	states := h.Host.Plugins()
	out := make([]server.PluginInfo, len(states))
	for i, s := range states {
		// The API shows the reason code only: the last error itself names paths and digests,
		// and is in the service log.
		out[i] = server.PluginInfo{ID: s.ID, Key: s.Key, Status: s.Status, LastError: pluginhost.LastErrorReason(s.LastError), Restarts: s.Restarts}
		if w := s.Worker; w != nil {
			out[i].Worker = &server.WorkerInfo{PID: w.PID, Generation: w.Generation, StartedAt: w.StartedAt, SupportedMethods: w.SupportedMethods}
		}
	}
	return out
}

// resolvePlugins turns the configured plugins into the host's: "@self" becomes this executable,
// pinned by its own digest unless a pin is configured; relative paths become absolute (from
// the working directory).
func resolvePlugins(in []server.PluginConfig) ([]pluginhost.PluginConfig, error) {
	out := make([]pluginhost.PluginConfig, 0, len(in))
	var self, selfSum string
	for i, p := range in {
		path, sum := p.Path, p.SHA256
		if path == server.SelfExecutable {
			if self == "" {
				exe, err := os.Executable()
				if err != nil {
					return nil, fmt.Errorf("plugins[%d].path: find the authz executable: %w", i, err)
				}
				if exe, err = filepath.EvalSymlinks(exe); err != nil {
					return nil, fmt.Errorf("plugins[%d].path: %w", i, err)
				}
				if selfSum, err = pluginhost.FileSHA256(exe); err != nil {
					return nil, fmt.Errorf("plugins[%d].path: pin the authz executable: %w", i, err)
				}
				self = exe
			}
			path = self
			if sum == "" {
				sum = selfSum
			}
		} else if !filepath.IsAbs(path) {
			abs, err := filepath.Abs(path)
			if err != nil {
				return nil, fmt.Errorf("plugins[%d].path: %w", i, err)
			}
			path = abs
		}
		out = append(out, pluginhost.PluginConfig{
			ID: p.ID, Key: p.Key, Path: path, SHA256: strings.ToLower(sum), Args: p.Args, Enabled: p.Enabled,
			AllowWritableBinary: p.AllowWritableBinary,
			User:                p.User, Group: p.Group, NoNewPrivileges: p.NoNewPrivileges,
			ResourceLimits: pluginhost.ResourceLimits{
				AddressSpaceBytes: p.Limits.AddressSpaceBytes, Processes: p.Limits.Processes,
				OpenFiles: p.Limits.OpenFiles, CPUSeconds: p.Limits.CPUSeconds,
			},
		})
	}
	return out, nil
}

// maskFlag collects a list flag (--decision-log-mask, --allowed-host): comma-separated,
// repeatable; "" means none.
type maskFlag struct{ list []string }

func (m *maskFlag) String() string { return strings.Join(m.list, ",") }

func (m *maskFlag) Set(s string) error {
	if m.list == nil {
		m.list = []string{}
	}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			m.list = append(m.list, p)
		}
	}
	return nil
}
