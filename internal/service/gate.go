package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/pluginhost"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/tracing"
)

// The live plugin host is the facts of a gate that runs plugins; the policy source is its policy
// status and, when the opa section configures decision_logs, its OPA decision log.
var (
	_ server.FactsSource       = (*pluginhost.Host)(nil)
	_ server.PolicyStatus      = (*policy.Source)(nil)
	_ server.OPADecisionLogger = (*policy.Source)(nil)
)

// DefaultPartTimeout bounds the stop of each part of a gate after its HTTP server (the plugins,
// the decision log, the policy source, the tracing flush): past it Close logs which part did
// not stop and goes on with the next, so that a stuck part never holds up the exit.
const DefaultPartTimeout = 30 * time.Second

// GateOptions are the parts of a gate that are not configuration: what a face brings besides
// its Config.
type GateOptions struct {
	// LogOutput receives the gate's log (NewLogger); os.Stderr when nil.
	LogOutput io.Writer
	// Listener, when not nil, is served instead of listening on Config.Server.Addr. The gate
	// closes it.
	Listener net.Listener
	// Reread, when not nil, reads the configuration again on a reload: its plugins and
	// builtinProviders are applied to the running plugin host.
	Reread func() (Config, error)
	// Decider, when not nil, decides instead of an engine whose policy comes from
	// Config.Policy (the gate inside OPA decides with the policy of OPA's bundles); Policy then
	// reports its policy (GET /v1/status) and OPADecisionLog, when not nil, receives the
	// decisions for OPA's decision-log plugin.
	Decider        server.Decider
	Policy         server.PolicyStatus
	OPADecisionLog server.OPADecisionLogger
	// Tracing, when not nil, traces the decisions with a tracer provider someone else owns and
	// flushes (OPA's); else the gate builds the one of Config.Policy's distributed_tracing.
	Tracing *tracing.Decisions
	// StaticFacts, when not nil, is the facts file of Config.Facts already loaded.
	StaticFacts *server.StaticFacts
}

// Gate is one assembled authorization gate: the facts (the plugin host, or a static facts
// file), the decider (an engine with its policy source, or the face's own), the HTTP server,
// its listener, its log and the parts a reload reloads. `authz serve` (Run) and the gate inside
// OPA (internal/opaplugin) are both built by NewGate. Start starts the plugins, Serve answers
// until Close, and Close stops every part in a fixed order.
type Gate struct {
	cfg    Config
	log    hclog.Logger
	srv    *server.Server
	ln     net.Listener
	addr   net.Addr
	facts  server.FactsSource
	host   *pluginhost.Host // nil with static facts
	policy *policy.Source   // nil when the face brings its decider
	export *tracing.Export  // nil when tracing is off or someone else owns the provider
	reread func() (Config, error)

	// partTimeout bounds the stop of each part after the HTTP server (DefaultPartTimeout).
	partTimeout time.Duration
	// closeHost, closeLog, closePolicy and closeTracing stop those parts (Close).
	closeHost, closeLog, closePolicy, closeTracing func()

	mu        sync.Mutex // guards the fields below
	started   bool
	serving   bool
	cancel    context.CancelFunc // ends Serve
	served    chan struct{}      // closed when Serve returned
	warnTimer *time.Timer        // warnIfNotStarted
	closed    bool
	assembled bool // NewGate returned the gate: Close logs that it stopped
}

// ListenError is a gate that could not listen on its address (Config.Server.Addr).
type ListenError struct{ Err error }

func (e *ListenError) Error() string { return e.Err.Error() }
func (e *ListenError) Unwrap() error { return e.Err }

// NewLogger is the log of a gate: hclog named "authz", at cfg's level and format, written to
// out (os.Stderr when nil).
func NewLogger(cfg LogConfig, out io.Writer) hclog.Logger {
	if out == nil {
		out = os.Stderr
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:       "authz",
		Level:      hclog.LevelFromString(cfg.Level),
		JSONFormat: cfg.JSON,
		Output:     out,
	})
}

// NewGate resolves and validates cfg and assembles its gate: the log, the tracing, the
// decider, the facts (the plugin host is created, not started), the HTTP server and the
// listener. It starts nothing. A configuration that cannot be served is a *ConfigError, an
// address that cannot be listened on a *ListenError; on any error every part made so far is
// closed, opts.Listener included.
func NewGate(ctx context.Context, cfg Config, opts GateOptions) (_ *Gate, err error) {
	g := &Gate{reread: opts.Reread, partTimeout: DefaultPartTimeout, ln: opts.Listener}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	if g.cfg, err = cfg.Resolve(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	cfg = g.cfg
	if err := cfg.Validate(); err != nil {
		return nil, configError("invalid configuration:\n%w", err)
	}
	g.log = NewLogger(cfg.Log, opts.LogOutput)
	warnReadableFile(g.log, cfg.File)

	// The face's tracer provider (OPA's), or the one of cfg's distributed_tracing, which the
	// gate flushes at Close.
	tr := tracing.Decisions{}
	if opts.Tracing != nil {
		tr = *opts.Tracing
	} else {
		if g.export, err = startTracing(ctx, cfg.Policy, g.log); err != nil {
			return nil, err
		}
		if g.export != nil {
			tr = g.export.Decisions()
			g.closeTracing = func() { g.export.Shutdown(ctx) }
		}
	}

	d, status := opts.Decider, opts.Policy
	if d == nil {
		// The policy comes from the source cfg.Policy names: the embedded policy, a bundle file
		// or directory, or remote bundles through OPA's plugin manager.
		engine, src, err := policy.Start(ctx, cfg.Policy, decision.Options{
			EvalTimeout:   cfg.Decision.EvalTimeout,
			MaxConcurrent: runtime.GOMAXPROCS(0),
			Cache:         decision.CacheOptions{Disabled: cfg.Decision.Cache == "off"},
		}, policy.Options{Logger: g.log, TracerProvider: g.tracerProvider()})
		if err != nil {
			return nil, err
		}
		g.policy, d, status = src, engine, src
		g.closePolicy = func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.partTimeout)
			defer cancel()
			src.Close(cctx)
		}
	}

	if err := g.newFacts(opts.StaticFacts); err != nil {
		return nil, err
	}
	g.srv, err = server.New(cfg.Server, d, g.facts, server.Options{Logger: g.log, Policy: status,
		OPADecisionLog: opts.OPADecisionLog, Tracing: tr})
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	g.closeLog = func() { _ = g.srv.Close() }
	if g.ln == nil {
		if g.ln, err = server.Listen(cfg.Server.Addr); err != nil {
			return nil, &ListenError{Err: err}
		}
	}
	g.addr = g.ln.Addr()
	g.assembled = true
	return g, nil
}

// startTracing exports the spans of the opa section's distributed_tracing (tracing.StartExport);
// nil when it is off.
func startTracing(ctx context.Context, cfg policy.Config, logger hclog.Logger) (*tracing.Export, error) {
	tc, err := cfg.Tracing()
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	exp, err := tracing.StartExport(ctx, &tc.Config, logger)
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	return exp, nil
}

// tracerProvider is the provider that also traces OPA's plugins (policy.Options); nil when the
// gate exports no spans of its own.
func (g *Gate) tracerProvider() *sdktrace.TracerProvider {
	if g.export == nil {
		return nil
	}
	return g.export.Provider
}

// newFacts makes the facts of every decision: the static facts file when one is configured,
// else the plugin host (created, not started).
func (g *Gate) newFacts(loaded *server.StaticFacts) error {
	if g.cfg.Facts != "" {
		sf := loaded
		if sf == nil {
			var err error
			if sf, err = server.LoadStaticFacts(g.cfg.Facts); err != nil {
				return configError("facts: %s: %v", g.cfg.Facts, err)
			}
		}
		g.log.Info("using static facts; no plugin is started", "facts", g.cfg.Facts)
		g.facts = sf
		return nil
	}
	hc := g.cfg.Host
	hc.Logger = g.log.Named("plugins")
	host, err := pluginhost.New(hc)
	if err != nil {
		return &ConfigError{Err: err}
	}
	g.host, g.facts = host, host
	g.closeHost = func() { stopPlugins(host, g.log) }
	return nil
}

// Start starts the driver plugins (nothing with static facts). Readiness waits for them; once
// the start time-out has passed, the log names those that have not started.
func (g *Gate) Start(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed || g.started {
		return errors.New("the gate was started or closed already")
	}
	g.started = true
	if g.host == nil {
		return nil
	}
	if err := g.host.Start(ctx); err != nil {
		return fmt.Errorf("start plugins: %w", err)
	}
	g.warnTimer = warnIfNotStarted(ctx, g.host, g.cfg.Host.StartTimeout, g.log)
	return nil
}

// Serve answers on the gate's listener until ctx is done or Close is called, then stops the
// HTTP server: in-flight requests finish, up to shutdownTimeout. It returns nil after such a
// stop. It serves once.
func (g *Gate) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g.mu.Lock()
	if g.closed || g.serving {
		g.mu.Unlock()
		return errors.New("the gate was served or closed already")
	}
	g.serving, g.cancel, g.served = true, cancel, make(chan struct{})
	served := g.served
	g.mu.Unlock()
	defer close(served)
	return g.srv.Serve(ctx, g.ln)
}

// Addr is the address the gate listens on (the port chosen for port 0).
func (g *Gate) Addr() net.Addr { return g.addr }

// Logger is the gate's log.
func (g *Gate) Logger() hclog.Logger { return g.log }

// Facts is where the gate's decisions read the host state: the plugin host or the facts file.
func (g *Gate) Facts() server.FactsSource { return g.facts }

// reloads are what a SIGHUP reloads: the server (decision log, tokens), the policy when the
// gate has its own source, and the plugins when the configuration can be read again.
func (g *Gate) reloads(ctx context.Context) []reload {
	rs := []reload{{"server (decision log, tokens)", func() { _ = g.srv.Reload() }}}
	if g.policy != nil {
		// A bundle that fails is logged and the active policy stays.
		rs = append(rs, reload{"policy", func() { g.reloadPolicy(ctx) }})
	}
	if g.host != nil && g.reread != nil {
		rs = append(rs, reload{"plugins", func() { reconfigurePlugins(ctx, g.host, g.cfg, g.reread, g.log) }})
	}
	return rs
}

// reloadPolicy reloads the policy (policy.Source.Reload: a bundle file is read again, bundles
// with trigger: manual are downloaded; polled bundles keep their polling) and logs the policy's
// part of the reload in one line: the revision before and after, and the failure if any.
func (g *Gate) reloadPolicy(ctx context.Context) {
	before := g.policy.Status().Revision
	err := g.policy.Reload(ctx)
	st := g.policy.Status()
	args := []any{"revision", st.Revision, "previous_revision", before, "changed", st.Revision != before, "origin", st.Origin}
	if st.Origin != "" && strings.HasPrefix(st.Origin, policy.OriginRemote) {
		args = append(args, "note", "bundles with polling are downloaded at their next poll; trigger: manual ones at every reload")
	}
	if err != nil {
		g.log.Warn("reload: policy not reloaded; the active policy stays", append(args, "error", err)...)
		return
	}
	g.log.Info("reload: policy", args...)
}

// Reload reloads, one after the other, what can be reloaded while serving (reloads): each
// part logs what it reloaded and what failed.
func (g *Gate) Reload(ctx context.Context) {
	for _, r := range g.reloads(ctx) {
		r.run()
	}
}

// Close stops the gate, in this order: the HTTP server stops (in-flight requests finish, up
// to shutdownTimeout; a listener never served is closed), then the plugins, then the decision
// log, then the policy source (downloads, OPA's decision-log and status uploads), then the
// tracing flushes its last spans, and the log says "stopped: exiting" (when NewGate had
// returned the gate). Each part after the HTTP server is bounded by the part time-out. Close is
// idempotent.
func (g *Gate) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	cancel, served, serving, timer := g.cancel, g.served, g.serving, g.warnTimer
	g.mu.Unlock()
	if g.log == nil { // the configuration was refused before the gate had a log
		if g.ln != nil {
			g.ln.Close()
		}
		return
	}
	g.stopPart("HTTP server", g.cfg.Server.ShutdownTimeout+g.partTimeout, func() {
		if !serving {
			if g.ln != nil {
				g.ln.Close()
			}
			return
		}
		cancel()
		<-served
	})
	if timer != nil {
		timer.Stop()
	}
	g.stopPart("plugins", g.partTimeout, g.closeHost)
	g.stopPart("decision log", g.partTimeout, g.closeLog)
	g.stopPart("policy", g.partTimeout, g.closePolicy)
	g.stopPart("tracing", g.partTimeout, g.closeTracing)
	if g.assembled {
		g.log.Info("stopped: exiting")
	}
}

// stopPart runs stop (when the gate has the part) and waits for it up to timeout; past that it
// logs that the part did not stop and returns, leaving stop to finish on its own.
func (g *Gate) stopPart(name string, timeout time.Duration, stop func()) {
	if stop == nil {
		return
	}
	g.log.Debug("stopping", "part", name)
	done := make(chan struct{})
	go func() {
		defer close(done)
		stop()
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		g.log.Debug("stopped", "part", name)
	case <-t.C:
		g.log.Error("a part of the gate did not stop in time; stopping the next ones", "part", name, "timeout", timeout)
	}
}
