package opaplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/authz-dev/authz/internal/snapshot"
)

// logMirror is OPA's decision-log plugin, with OPA's decision_logs configuration, on a plugin
// manager of the gate's own whose store and compiler hold only the gate's bundles. OPA's plugin
// drops and masks each event with the system.log rules of its manager's compiler; on the
// gate's manager those are the rules of the configured bundles, never what OPA's APIs wrote.
// It prints (console), uploads (the service) and hands events to a logger plugin as OPA's does.
type logMirror struct {
	key string // the policy it holds the bundles of
	m   *plugins.Manager
	lp  *logs.Plugin
}

// stopTimeout bounds the final upload of a decision-log mirror that is replaced or stopped.
const stopTimeout = 5 * time.Second

// decisionLog returns the decision-log plugin for the gate's events: nil when OPA has no
// decision_logs; otherwise the mirror holding the active policy's bundles (made again when
// the policy changed). On a failure to make it, OPA's own plugin logs the event.
func (g *gate) decisionLog(ctx context.Context) *logs.Plugin {
	opaLP := logs.Lookup(g.m)
	if opaLP == nil {
		return nil
	}
	pol := g.active.Load()
	g.logMu.Lock()
	defer g.logMu.Unlock()
	switch {
	case g.logMaker != nil && g.logMaker.key == pol.key:
		return g.logMaker.lp
	case g.logFailed == pol.key:
		return nil // tried for this policy already
	}
	old := g.logMaker
	g.logMaker = nil
	if old != nil {
		old.stop()
	}
	lm, err := newLogMirror(ctx, g.m, opaLP, pol)
	if err != nil {
		g.logFailed = pol.key
		g.m.Logger().Error("authz: the gate's decision log could not be set up: %v; its events are not logged until the next policy", err)
		return nil
	}
	g.logMaker, g.logFailed = lm, ""
	return lm.lp
}

// stopLog stops the mirror, if any.
func (g *gate) stopLog() {
	g.logMu.Lock()
	defer g.logMu.Unlock()
	if g.logMaker != nil {
		g.logMaker.stop()
		g.logMaker = nil
	}
}

func newLogMirror(ctx context.Context, opa *plugins.Manager, opaLP *logs.Plugin, pol *activePolicy) (*logMirror, error) {
	cfg := opa.GetConfig()
	raw := map[string]any{}
	if len(cfg.Services) > 0 {
		raw["services"] = cfg.Services
	}
	if len(cfg.Keys) > 0 {
		raw["keys"] = cfg.Keys
	}
	if len(cfg.Labels) > 0 {
		raw["labels"] = cfg.Labels
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	init := map[string]*bundle.Bundle{}
	for name, c := range pol.copies {
		init[name] = c.asBundle()
	}
	m, err := plugins.New(b, opa.ID, inmem.New(),
		plugins.Info(opa.Info),
		plugins.ConsoleLogger(opa.ConsoleLogger()),
		plugins.Logger(opa.Logger()),
		plugins.InitBundles(init),
	)
	if err != nil {
		return nil, fmt.Errorf("configure: %w", err)
	}
	if err := m.Init(ctx); err != nil {
		m.Stop(ctx)
		bundles.drop(m.Store)
		return nil, fmt.Errorf("load the policy's bundles: %w", err)
	}
	lcfg := opaLP.Config()
	if lcfg.Plugin != nil {
		// OPA's logger plugin, which OPA starts and stops: the mirror only hands it events.
		if l, ok := opa.Plugin(*lcfg.Plugin).(logs.Logger); ok {
			m.Register(*lcfg.Plugin, borrowedLogger{l})
		}
	}
	lp := logs.New(lcfg, m)
	m.Register(logs.Name, lp)
	if err := lp.Start(ctx); err != nil {
		m.Stop(ctx)
		bundles.drop(m.Store)
		return nil, err
	}
	return &logMirror{key: pol.key, m: m, lp: lp}, nil
}

// stop stops the mirror's decision-log plugin (a last upload, bounded by stopTimeout) and its
// manager.
func (lm *logMirror) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	lm.m.Stop(ctx)
	bundles.drop(lm.m.Store)
}

// borrowedLogger is OPA's logger plugin as the mirror holds it: events go to it; starting and
// stopping it are OPA's.
type borrowedLogger struct{ logs.Logger }

func (borrowedLogger) Start(context.Context) error      { return nil }
func (borrowedLogger) Stop(context.Context)             {}
func (borrowedLogger) Reconfigure(context.Context, any) {}

// asBundle is the copy as a bundle, for the mirror's store.
func (c *bundleCopy) asBundle() *bundle.Bundle {
	b := &bundle.Bundle{Manifest: bundle.Manifest{Revision: c.revision}, Data: map[string]any{}}
	if c.roots != nil {
		roots := append([]string(nil), c.roots...)
		b.Manifest.Roots = &roots
	}
	b.Manifest.Init()
	if d, ok := snapshot.CopyDocument(c.data).(map[string]any); ok && d != nil {
		b.Data = d
	}
	for p, m := range c.modules {
		b.Modules = append(b.Modules, bundle.ModuleFile{URL: p, Path: p, Raw: []byte(c.sources[p]), Parsed: m.Copy()})
	}
	return b
}
