package policy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/plugins"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/open-policy-agent/opa/v1/plugins/discovery"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
)

// remote runs OPA's plugin manager over the opa section: the bundle plugin downloads (ETag
// polling, long polling when the server offers it), verifies, persists and activates bundles in
// the manager's store; the decision-log and status plugins run when configured. After every
// activation the manager's compiler trigger hands the new compiler and a copy of the store's
// data to the engine: the engine never reads the manager's store, so a store change takes
// effect only through a new activation (and a new cache generation).
type remote struct {
	s    *Source
	mgr  *plugins.Manager
	bp   *bundleplugin.Plugin // nil when the policy comes from elsewhere
	logs *logs.Plugin         // nil without decision_logs
}

// startRemote starts OPA's plugin manager; bundles says whether the policy comes from its
// bundle plugin (else it runs for decision logs and status only).
func startRemote(ctx context.Context, s *Source, bundles bool) (*remote, error) {
	raw, err := s.cfg.opaRaw()
	if err != nil {
		return nil, err
	}
	raw, lim, err := boundOPA(raw) // opabounds.go
	if err != nil {
		return nil, err
	}
	id := s.opts.ID
	if id == "" {
		id = uuid.NewString()
	}
	lg := &opaLogger{l: s.log.Named("opa")}
	store := inmem.New()
	mgr, err := plugins.New(raw, id, store, append(managerTracing(s.opts.TracerProvider, bundleBoundOption{lim}), // tracing.go, remotebound.go
		plugins.Logger(lg), plugins.ConsoleLogger(lg), plugins.WithEnableVersionCheck(false))...)
	if err != nil {
		return nil, fmt.Errorf("opa: %w", err)
	}
	if err := mgr.Init(ctx); err != nil {
		return nil, fmt.Errorf("opa: %w", err)
	}
	// Discovery without a discovery block is how `opa run` creates the bundle, decision-log
	// and status plugins of the configuration.
	disco, err := discovery.New(mgr)
	if err != nil {
		return nil, fmt.Errorf("opa: %w", err)
	}
	mgr.Register(discovery.Name, disco)
	r := &remote{s: s, mgr: mgr, logs: logs.Lookup(mgr)}
	if bundles {
		if r.bp = bundleplugin.Lookup(mgr); r.bp == nil {
			return nil, errors.New("opa: no bundles configured")
		}
		// Both are registered before Start: a persisted bundle is activated inside Start.
		actx := context.WithoutCancel(ctx)
		mgr.RegisterCompilerTrigger(func(txn storage.Transaction) { r.onActivate(actx, txn) })
		r.bp.RegisterBulkListener("authz", r.onStatus)
	}
	if err := mgr.Start(ctx); err != nil {
		mgr.Stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("opa: %w", err)
	}
	mgr.ServerInitialized()
	return r, nil
}

// onActivate runs inside the commit of a bundle activation: it reads the new compiler and the
// data the commit wrote, checks the entrypoint and activates the policy. A policy that fails
// the check is not activated; the active one stays.
func (r *remote) onActivate(ctx context.Context, txn storage.Transaction) {
	s := r.s
	store := r.mgr.Store
	c := r.mgr.GetCompiler()
	names, err := bundle.ReadBundleNamesFromStore(ctx, store, txn)
	revs := map[string]string{}
	for _, n := range names {
		rev, rerr := bundle.ReadBundleRevisionFromStore(ctx, store, txn, n)
		if rerr != nil {
			err = errors.Join(err, rerr)
		}
		revs[n] = rev
	}
	var data map[string]any
	if err == nil {
		var v any
		if v, err = store.Read(ctx, txn, storage.RootPath); err == nil {
			var ok bool
			if data, ok = v.(map[string]any); !ok {
				err = fmt.Errorf("the store's data is %T, want an object", v)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		if revs[n] == "" {
			revs[n] = contentRevision(moduleSources(c), nil)
		}
	}
	var p *decision.Policy
	if err == nil {
		p, err = decision.CompiledPolicy(c, data, joinRevisions(revs))
	}
	if err == nil {
		err = s.activateLocked(ctx, p, OriginRemote+":"+strings.Join(sortedNames(revs), ","))
	}
	for _, n := range names {
		s.checks[n] = ""
		if err != nil {
			s.checks[n] = err.Error()
		} else {
			s.served[n] = revs[n]
		}
	}
	if err != nil {
		e := &coded.Error{Code: coded.PolicyBundleCheck, Err: err}
		s.status.LastError = e.Error()
		s.log.Error("bundle refused; the active policy stays", "bundles", names, "active_revision", s.eng.Revision(), "error", e)
	}
}

// moduleSources are the sources of the compiled modules (for a content revision).
func moduleSources(c *ast.Compiler) map[string]string {
	out := map[string]string{}
	if c == nil {
		return out
	}
	for id, m := range c.Modules {
		out[id] = m.String()
	}
	return out
}

// onStatus records OPA's status of every bundle, and logs each new failure.
func (r *remote) onStatus(st map[string]*bundleplugin.Status) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, b := range st {
		cp := *b
		prev := s.status.Bundles[n]
		if cp.Code != "" && (prev == nil || prev.Message != cp.Message) {
			s.status.LastError = cp.Code + ": " + cp.Message
			s.log.Error("bundle refused; the active policy stays", "bundle", n, "active_revision", s.eng.Revision(), "code", cp.Code, "error", cp.Message)
		}
		s.status.Bundles[n] = &cp
	}
}

// trigger downloads every bundle now (SIGHUP).
func (r *remote) trigger(ctx context.Context) error {
	if r.bp == nil {
		return nil
	}
	return r.bp.Trigger(ctx)
}

func (r *remote) stop(ctx context.Context) {
	r.mgr.Stop(ctx)
}

// opaLogger writes OPA's log into the service log.
type opaLogger struct {
	l      hclog.Logger
	fields []any
}

func (o *opaLogger) args() []any { return o.fields }

func (o *opaLogger) Debug(f string, a ...any) { o.l.Debug(fmt.Sprintf(f, a...), o.args()...) }
func (o *opaLogger) Info(f string, a ...any)  { o.l.Info(fmt.Sprintf(f, a...), o.args()...) }
func (o *opaLogger) Warn(f string, a ...any)  { o.l.Warn(fmt.Sprintf(f, a...), o.args()...) }
func (o *opaLogger) Error(f string, a ...any) { o.l.Error(fmt.Sprintf(f, a...), o.args()...) }

func (o *opaLogger) WithFields(m map[string]any) logging.Logger {
	f := append([]any(nil), o.fields...)
	for _, k := range sortedNames(m) {
		f = append(f, k, m[k])
	}
	return &opaLogger{l: o.l, fields: f}
}

func (o *opaLogger) GetLevel() logging.Level {
	switch {
	case o.l.IsDebug() || o.l.IsTrace():
		return logging.Debug
	case o.l.IsInfo():
		return logging.Info
	case o.l.IsWarn():
		return logging.Warn
	}
	return logging.Error
}

func (o *opaLogger) SetLevel(logging.Level) {}
