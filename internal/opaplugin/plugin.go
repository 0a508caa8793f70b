// Package opaplugin runs the authz gate inside OPA: an OPA runtime plugin, configured by the
// plugins.authz section of an OPA configuration, that serves the gate's HTTP endpoints
// (internal/server) beside OPA's own. It decides with a policy it compiles itself from copies of
// the bundles OPA activates (downloads, signatures and bundle status are OPA's), never from OPA's
// store, which OPA's API writes; it guards OPA's own listener (Host check, write APIs off unless
// opaWriteAPI). `authz run` is OPA's run command with this plugin built in (docs/service.md,
// "Running inside OPA").
package opaplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/plugins"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/service"
)

// Name is the plugin's name in OPA's configuration (plugins.authz) and status.
const Name = "authz"

// section is the configuration section, as errors name it.
const section = "plugins." + Name

// readyPoll is how often the plugin looks whether the driver plugins have started, until they have.
const readyPoll = 100 * time.Millisecond

// Factory makes the plugin for OPA's plugin manager: register it with
// runtime.RegisterPlugin(opaplugin.Name, opaplugin.Factory{...}).
type Factory struct {
	// Plugins lets the gate run driver plugins: its service.Gate then creates, starts and stops
	// the plugin host as `authz serve` does. Without it the gate needs a static facts file.
	Plugins bool
	// LogOutput receives the gate's own log (hclog, as `authz serve` writes it); os.Stderr when nil.
	LogOutput io.Writer
}

var _ plugins.Factory = Factory{}

// Validate parses and checks the plugins.authz section. The gate's bundle activator must be
// registered (RegisterActivator): without it the gate would not see OPA's bundles.
func (f Factory) Validate(m *plugins.Manager, config []byte) (any, error) {
	if !bundle.HasExtension() || !activatorRegistered() {
		return nil, fmt.Errorf("%s: the gate's bundle activator is not registered: call opaplugin.RegisterActivator before OPA's runtime starts", section)
	}
	// OPA's keys and bundles sections are held to the rule of authz serve: a bundle that any
	// configured key, or no key, could stand behind would replace the gate's policy.
	if _, err := checkSigning(m); err != nil {
		return nil, fmt.Errorf("%s: %w", section, err)
	}
	cfg, err := parseConfig(config, f.Plugins)
	if err != nil {
		return nil, err
	}
	// The gate decides with one bundle: named when OPA's bundles section has several.
	names, _, err := configuredBundles(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", section, err)
	}
	gate, err := policy.GateBundle(names, cfg.GateBundle, section+"."+gateBundleField)
	if err != nil {
		return nil, err
	}
	cfg.rule = policy.BundleRule{Gate: gate, Multi: len(names) > 1,
		OtherRegoBytes: cfg.OtherBundleRegoBytes, RegoBytesKey: section + "." + regoBytesField,
		OtherDataBytes: cmp.Or(cfg.OtherBundleDataBytes, policy.DefaultOtherBundleDataBytes), DataBytesKey: section + "." + dataBytesField}
	return cfg, nil
}

// New returns the plugin for a configuration that Validate returned. It starts nothing.
func (f Factory) New(m *plugins.Manager, config any) plugins.Plugin {
	out := f.LogOutput
	if out == nil {
		out = os.Stderr
	}
	p := &Plugin{m: m, logOut: out, cfg: config.(*Config), reload: make(chan struct{}, 1),
		policyMsg: "the active policy has not been prepared yet"}
	p.gate = newGate(m)
	p.gate.logger = p.logger
	p.gate.settings.Store(gateSettings(p.cfg))
	p.gate.applyRule(p.cfg.rule)
	// OPA's own server: the Host check, and its write APIs off unless opaWriteAPI. OPA's server
	// takes the middleware when it starts: a plugin made after that (from a discovered
	// configuration) cannot guard it, and says so at Start.
	m.ExtraMiddleware(p.gate.guardOPA)
	select {
	case <-m.ServerInitializedChannel():
		p.unguarded = true
	default:
	}
	m.UpdatePluginStatus(Name, &plugins.Status{State: plugins.StateNotReady, Message: "not started"})
	return p
}

// Plugin is the gate running inside OPA. OPA's plugin manager starts, reconfigures and stops it.
type Plugin struct {
	m      *plugins.Manager
	logOut io.Writer
	gate   *gate
	reload chan struct{} // a policy (or the engine options) changed: prepare again

	mu   sync.Mutex // serializes Start, Stop and Reconfigure; guards cfg and run
	cfg  *Config
	run  *serving
	loop *policyLoader

	unguarded    bool                         // OPA's server started before the plugin: its API is not guarded
	log          atomic.Pointer[hclog.Logger] // the gate's log, for the loader
	warnedUnused atomic.Bool                  // warnUnusedPolicy has warned

	stMu       sync.Mutex // guards the state reported to OPA
	facts      server.FactsSource
	stopped    bool
	failure    string // why the gate does not serve; "" when it does
	policyMsg  string // why no policy decides; "" when one with the entrypoint is prepared
	lastStatus plugins.Status
}

// serving is one run of the gate.
type serving struct {
	cancel context.CancelFunc // ends Serve
	served chan struct{}      // closed when Serve returned
	gate   *service.Gate
}

// policyLoader prepares the active policy whenever it changes, one preparation at a time.
type policyLoader struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Start loads the facts (or starts the driver plugins), prepares the active policy and listens
// on addr. An address that cannot be listened on, or plugins that cannot be started, fail the
// start (and OPA with it).
func (p *Plugin) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unguarded {
		p.logger().Error("OPA's server was already running when plugins.authz was configured: its write APIs are open and its Host check is off; configure plugins.authz in OPA's boot configuration (--config-file), not through discovery")
	}
	// The order of signed bundles is read before the first bundle is adopted.
	if err := p.gate.loadOrder(); err != nil {
		p.setFailure(err.Error())
		return fmt.Errorf("%s: %w", section, err)
	}
	// Every bundle OPA activates (a download, --bundle under --watch) commits; the gate then
	// compiles its copies of the bundles, off the commit and off the hot path.
	p.gate.bundles.listen(p, p.requestReload)
	if bp := bundleplugin.Lookup(p.m); bp != nil {
		bp.Register(p, func(st bundleplugin.Status) {
			p.gate.bundleStatus(st)
			p.requestReload()
		})
	}
	// The bundles OPA has already activated are compiled before the first request; later
	// activations are the loader's.
	p.applyLoad(p.gate.load(ctx))
	if err := p.startServing(p.cfg); err != nil {
		p.setFailure(err.Error())
		return err
	}
	lctx, cancel := context.WithCancel(context.Background())
	p.loop = &policyLoader{cancel: cancel, done: make(chan struct{})}
	go p.runLoader(lctx, p.loop.done)
	p.requestReload()
	return nil
}

// Stop ends the HTTP server (in-flight requests finish, up to shutdownTimeout), then the
// driver plugins.
func (p *Plugin) Stop(_ context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate.bundles.unlisten(p)
	if bp := bundleplugin.Lookup(p.m); bp != nil {
		bp.Unregister(p)
	}
	if p.loop != nil {
		p.loop.cancel()
		<-p.loop.done
		p.loop = nil
	}
	p.stopServing()
	p.gate.stopLog()
	p.stMu.Lock()
	p.stopped, p.facts = true, nil
	p.stMu.Unlock()
	p.report()
}

// Reconfigure applies a new plugins.authz section: when it differs, the gate's server and its
// plugins are stopped and started again with it; the policy stays OPA's.
func (p *Plugin) Reconfigure(_ context.Context, config any) {
	cfg, ok := config.(*Config)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cfg.equal(p.cfg) {
		return
	}
	p.cfg = cfg
	p.gate.settings.Store(gateSettings(cfg))
	p.gate.applyRule(cfg.rule)
	if p.run == nil && p.loop == nil { // not started: Start will use it
		return
	}
	p.stopServing()
	if err := p.startServing(cfg); err != nil {
		p.setFailure(err.Error())
		return
	}
	p.requestReload()
}

// reloadable are the plugins whose gate serves in this process, for Reload.
var reloadable sync.Map // *Plugin -> struct{}

// Reload reloads what every gate serving in this process can reload without a restart, as
// `authz serve` does on SIGHUP (server.Server.Reload): its tokens file and its decision log
// file. Each gate logs what it reloaded. It returns how many gates were reloaded.
func Reload() int {
	n := 0
	reloadable.Range(func(k, _ any) bool {
		if k.(*Plugin).reloadServer() {
			n++
		}
		return true
	})
	return n
}

// reloadServer reloads the gate's HTTP server; false when it does not serve.
func (p *Plugin) reloadServer() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.run == nil {
		return false
	}
	p.run.gate.Logger().Info("reload: SIGHUP received; re-reading the tokens file and reopening the decision log")
	p.run.gate.Reload(context.Background()) // it logs each failure, and what it reloaded
	return true
}

// Addr is the address the gate listens on (the port chosen for addr port 0), nil when not serving.
func (p *Plugin) Addr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.run == nil {
		return nil
	}
	return p.run.gate.Addr()
}

// startServing assembles the gate of cfg (service.NewGate) with the gate's own decider, whose
// policy comes from OPA's bundles, starts its driver plugins and serves it on cfg.Addr. Called
// with p.mu held.
func (p *Plugin) startServing(cfg *Config) error {
	tr := gateTracing(p.m)
	g, err := service.NewGate(context.Background(), cfg.Config, service.GateOptions{
		LogOutput: p.logOut, StaticFacts: cfg.staticFacts, Tracing: &tr,
		Decider: p.gate, Policy: p.gate, OPADecisionLog: p.gate,
	})
	var le *service.ListenError
	switch {
	case errors.As(err, &le):
		return fmt.Errorf("%s.addr: %s", section, strings.TrimPrefix(le.Error(), "addr: "))
	case err != nil:
		return fmt.Errorf("%s: %w", section, err)
	}
	if err := g.Start(context.Background()); err != nil {
		g.Close()
		return fmt.Errorf("%s: start the driver plugins: %w", section, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &serving{cancel: cancel, served: make(chan struct{}), gate: g}
	log := g.Logger()
	go func() {
		defer close(run.served)
		if err := g.Serve(ctx); err != nil && ctx.Err() == nil {
			log.Error("the gate's HTTP server failed", "error", err)
			p.setFailure("the gate's HTTP server failed: " + err.Error())
		}
	}()
	p.run = run
	reloadable.Store(p, struct{}{})
	p.log.Store(&log)
	p.stMu.Lock()
	p.facts, p.failure, p.stopped = g.Facts(), "", false
	p.stMu.Unlock()
	p.report()
	return nil
}

// stopServing closes the gate (service.Gate.Close): its HTTP server, then its driver plugins,
// then its decision log file. Called with p.mu held.
func (p *Plugin) stopServing() {
	run := p.run
	if run == nil {
		return
	}
	p.run = nil
	reloadable.Delete(p)
	run.cancel()
	run.gate.Close()
	<-run.served
}

func (p *Plugin) requestReload() {
	select {
	case p.reload <- struct{}{}:
	default: // one is pending already; it will see this change too
	}
}

// runLoader prepares the policy on every change, and reports the driver plugins' readiness
// until they have all started.
func (p *Plugin) runLoader(ctx context.Context, done chan struct{}) {
	defer close(done)
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.reload:
			p.applyLoad(p.gate.load(ctx))
		case <-tick.C:
			p.report()
		}
	}
}

// applyLoad records the outcome of a policy preparation in the state reported to OPA.
func (p *Plugin) applyLoad(msg string, err error) {
	if err != nil {
		p.logger().Error("the bundles' policy could not be compiled; the gate keeps deciding with the one it had", "error", err)
		msg = err.Error()
	}
	p.warnUnusedPolicy()
	p.stMu.Lock()
	p.policyMsg = msg
	p.stMu.Unlock()
	p.report()
}

// warnUnusedPolicy warns, once, when the gate decides with the embedded policy while OPA's
// compiler defines the entrypoint from something else (policy files on the command line, or
// OPA's Policy API): the gate does not decide with those.
func (p *Plugin) warnUnusedPolicy() {
	pol := p.gate.active.Load()
	if pol.origin != policy.OriginEmbedded || p.warnedUnused.Load() {
		return
	}
	if c := p.m.GetCompiler(); c != nil && len(c.GetRulesExact(entrypoint)) > 0 && p.warnedUnused.CompareAndSwap(false, true) {
		p.logger().Warn("OPA defines " + decision.Query + " outside a bundle (policy files or its Policy API); the gate decides with the embedded policy: pass the policy as a bundle (--bundle DIR or FILE.tar.gz, or OPA's bundles section)")
	}
}

var entrypoint = ast.MustParseRef(decision.Query)

func (p *Plugin) logger() hclog.Logger {
	if l := p.log.Load(); l != nil {
		return *l
	}
	return service.NewLogger(service.LogConfig{}, p.logOut)
}

func (p *Plugin) setFailure(msg string) {
	p.stMu.Lock()
	p.failure = msg
	p.stMu.Unlock()
	p.report()
}

// report tells OPA the plugin's state when it changed: OK only while the gate serves, a
// policy with data.authz.decision is prepared, and every driver plugin has started once.
func (p *Plugin) report() {
	p.stMu.Lock()
	defer p.stMu.Unlock()
	st := plugins.Status{State: plugins.StateOK}
	switch {
	case p.stopped:
		st = plugins.Status{State: plugins.StateNotReady, Message: "stopped"}
	case p.failure != "":
		st = plugins.Status{State: plugins.StateErr, Message: p.failure}
	case p.policyMsg != "":
		st = plugins.Status{State: plugins.StateNotReady, Message: p.policyMsg}
	case p.facts == nil || !p.facts.Ready():
		st = plugins.Status{State: plugins.StateNotReady, Message: "waiting for the driver plugins to start (GET /v1/plugins on the gate shows them)"}
	}
	if st == p.lastStatus {
		return
	}
	p.lastStatus = st
	p.m.UpdatePluginStatus(Name, &st)
}

// gateSettings are the gate's settings for cfg (whose masks Validate has checked).
func gateSettings(cfg *Config) *settings {
	var hosts []string
	anyHost := false
	for _, h := range cfg.Server.Authentication.AllowedHosts {
		if h == "*" {
			anyHost = true
		}
		hosts = append(hosts, strings.ToLower(h))
	}
	return &settings{
		gateBundle:   cfg.rule.Gate,
		writeAPI:     cfg.OPAWriteAPI,
		allowedHosts: hosts,
		anyHost:      anyHost,
		opts: decision.Options{
			EvalTimeout:   cfg.Decision.EvalTimeout,
			MaxConcurrent: runtime.GOMAXPROCS(0),
			Cache:         decision.CacheOptions{Disabled: cfg.Decision.Cache == "off"},
		},
	}
}
