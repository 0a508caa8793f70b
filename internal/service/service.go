// Package service composes authz's HTTP service, `authz serve`: it reads the one configuration
// file (Config), and Run wires it together: the plugin host (or a static facts file), the
// decision engine with its policy (embedded, a bundle, or remote bundles), the HTTP server and its listener, SIGHUP reloads
// and the graceful shutdown. cmd/authz keeps only the flags, the help and the exit codes.
package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"reflect"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/server"
)

// Options are the parts of a run that are not configuration.
type Options struct {
	// LogOutput receives the service log (and, with decisionLog.path "-", nothing else:
	// that goes to the process's stderr). os.Stderr when nil.
	LogOutput io.Writer
	// Reread, when not nil, reads the configuration again (the file and the flags) on SIGHUP;
	// its plugins and builtinProviders are then applied to the running plugin host.
	Reread func() (Config, error)
	// Listener, when not nil, is served instead of listening on the configured address (an
	// inherited socket, or a test's). Run closes it.
	Listener net.Listener
}

// ConfigError is a run that could not start because of its configuration: the file, a flag,
// or a file the configuration names. The command line answers it with exit status 2.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

func configError(format string, args ...any) error {
	return &ConfigError{Err: fmt.Errorf(format, args...)}
}

// Run serves the authorization service of cfg until ctx is done, then shuts down in the order
// of Gate.Close: the HTTP server stops (in-flight requests finish, up to shutdownTimeout), then
// the plugins, then the decision log, the policy source and the tracing, and the log says
// "stopped: exiting". SIGHUP reloads what can be reloaded while serving (server.Server.Reload,
// the policy, and the plugins with opts.Reread). It returns nil after a shutdown asked for by
// ctx, a *ConfigError when cfg cannot be served, and any other error when serving failed.
func Run(ctx context.Context, cfg Config, opts Options) error {
	// Caught from here on, so that a SIGHUP during the start does not end the process; it is
	// acted on once the service serves.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	tuneGC(cfg.Server)
	g, err := NewGate(ctx, cfg, GateOptions{LogOutput: opts.LogOutput, Listener: opts.Listener, Reread: opts.Reread})
	if err != nil {
		return err
	}
	if err := g.Start(ctx); err != nil {
		g.Close()
		return err
	}
	stopReloads := reloadOn(hup, g.Logger(), g.reloads(ctx)...)
	err = g.Serve(ctx)
	stopReloads()
	g.Close()
	return err
}

// DefaultGCPercent is the garbage collector's heap growth target of the service (GOGC), in
// percent of the live heap. A decision allocates about 40 KiB, most of it in policy
// evaluation, and the live heap is small (a few MiB besides the decision cache), so at Go's
// default of 100 the collector runs several times a second at a few thousand decisions a
// second; every cycle stops the world twice and takes a quarter of the CPU while it marks,
// which is where a latency tail comes from on a machine with few cores. 200 halves the cycles
// for a few MiB of heap (docs/service.md, "Limits and memory").
const DefaultGCPercent = 200

// tuneGC sets the garbage collector's target to DefaultGCPercent and a soft memory limit at
// the live memory the limits allow (server.Config.MemoryLimit), below the documented bound, so
// that the collector returns memory before the process grows past the bound. GOGC and
// GOMEMLIMIT, when set, win.
func tuneGC(cfg server.Config) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(DefaultGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(cfg.MemoryLimit())
	}
}

// warnIfNotStarted logs, once the start time-out has passed, which plugins have not been ready
// yet (readiness waits for them), unless every one has.
func warnIfNotStarted(ctx context.Context, host *pluginhost.Host, startTimeout time.Duration, logger hclog.Logger) *time.Timer {
	if startTimeout == 0 {
		startTimeout = pluginhost.DefaultStartTimeout
	}
	return time.AfterFunc(startTimeout, func() {
		if host.Ready() {
			return
		}
		// A context already done: WaitStarted names the plugins still waiting without waiting.
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := host.WaitStarted(done); err != nil && !errors.Is(err, pluginhost.ErrClosed) {
			logger.Warn("plugins have not started yet; GET /health/ready answers 503 until they have", "error", err)
		}
	})
}

// stopPlugins closes the host: every worker is ended and reaped.
func stopPlugins(host *pluginhost.Host, logger hclog.Logger) {
	logger.Info("stopping plugins")
	if err := host.Close(); err != nil && !errors.Is(err, pluginhost.ErrClosed) {
		logger.Warn("stopping plugins", "error", err)
	}
	logger.Info("plugins stopped")
}

// reconfigurePlugins reads the configuration again and applies its plugins and
// builtinProviders to the running host: added, removed and re-pinned plugins take effect, the
// others keep their workers. A configuration that does not validate changes nothing; the log
// says why. The other settings take effect at the next start.
func reconfigurePlugins(ctx context.Context, host *pluginhost.Host, running Config, reread func() (Config, error), logger hclog.Logger) {
	cfg, err := reread()
	if err == nil {
		cfg, err = cfg.Resolve()
	}
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		logger.Error("SIGHUP: the configuration was not applied; the plugins stay as they are", "error", err)
		return
	}
	if later := changedAtRestartOnly(running, cfg); len(later) > 0 {
		logger.Warn("SIGHUP: these settings changed and take effect at the next start only; the plugins are applied now",
			"settings", later)
	}
	if cfg.Facts != "" {
		return // the plugin host stays; a facts file replaces it at the next start
	}
	rctx, cancel := context.WithTimeout(ctx, reconfigureTimeout)
	defer cancel()
	changes, err := host.Reconfigure(rctx, cfg.Host.Plugins)
	if err != nil && !errors.Is(err, pluginhost.ErrStillStopping) {
		logger.Error("SIGHUP: plugins not reconfigured; they stay as they are", "error", err)
		return
	}
	if err != nil {
		logger.Warn("SIGHUP: plugins reconfigured, but replaced workers are still stopping", "error", err)
	}
	logger.Info("SIGHUP: plugins reconfigured", "added", changes.Added, "removed", changes.Removed,
		"changed", changes.Changed, "unchanged", len(changes.Unchanged), "pin_drift", changes.PinDrift)
	if len(changes.PinDrift) > 0 {
		logger.Warn("SIGHUP: these plugins' binaries on disk no longer match their pins; their running workers keep the pinned bytes, "+
			"and their next start fails with PIN_MISMATCH: configure the new sha256 (sha256sum PATH) and send SIGHUP again",
			"pin_drift", changes.PinDrift)
	}
	if err := host.ReplaceBuiltinProviders(cfg.Host.BuiltinProviders); err != nil {
		logger.Error("SIGHUP: builtinProviders not replaced; the previous ones stay", "error", err)
	}
}

// changedAtRestartOnly names the parts of next that differ from running other than what a
// SIGHUP applies (plugins and builtinProviders): they take effect at the next start.
func changedAtRestartOnly(running, next Config) []string {
	next.Host.Plugins, next.Host.BuiltinProviders = running.Host.Plugins, running.Host.BuiltinProviders
	var changed []string
	for _, part := range []struct {
		name string
		same bool
	}{
		{"server (addr, tls, authentication, limits, decisionLog, http, ...)", reflect.DeepEqual(running.Server, next.Server)},
		{"plugin host (timeouts, health, readiness)", reflect.DeepEqual(running.Host, next.Host)},
		{"policy (bundle, opa, ...)", reflect.DeepEqual(running.Policy, next.Policy)},
		{"decision (evalTimeout, decisionCache)", running.Decision == next.Decision},
		{"facts", running.Facts == next.Facts},
		{"log", running.Log == next.Log},
	} {
		if !part.same {
			changed = append(changed, part.name)
		}
	}
	return changed
}

// reconfigureTimeout bounds the plugin part of one SIGHUP: the replaced workers are killed
// well within it (the host never waits on a driver's cooperation); past it the new
// configuration is in effect and the log says which workers are still stopping.
const reconfigureTimeout = 30 * time.Second

// reload is one thing a SIGHUP reloads.
type reload struct {
	name string
	run  func()
}

// reloadOn runs every reload on every signal from hup until the returned stop is called. Each
// reload runs on its own goroutine, so that a slow one (plugins whose workers are stopping, a
// remote bundle) never holds up another: a SIGHUP that arrives while a reload still runs is
// handed to it once it is done, coalesced with any other such SIGHUP, and the other reloads act
// on it at once. stop waits for the reloads that are running.
func reloadOn(hup <-chan os.Signal, logger hclog.Logger, reloads ...reload) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	pending := make([]chan struct{}, len(reloads))
	for i, r := range reloads {
		pending[i] = make(chan struct{}, 1)
		wg.Add(1)
		go func(r reload, pending <-chan struct{}) {
			defer wg.Done()
			for {
				select {
				case <-pending:
					r.run()
				case <-done:
					return
				}
			}
		}(r, pending[i])
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-hup:
				logger.Info("SIGHUP: reloading")
				for i, r := range reloads {
					select {
					case pending[i] <- struct{}{}:
					default:
						logger.Warn("SIGHUP: a reload of this part is already waiting for the one still running; it covers this signal too",
							"part", r.name)
					}
				}
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
