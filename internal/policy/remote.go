package policy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/google/uuid"
	"github.com/hashicorp/go-hclog"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/logging"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/plugins"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/open-policy-agent/opa/v1/plugins/discovery"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/logtext"
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
	id := s.opts.ID
	if id == "" {
		id = uuid.NewString()
	}
	lg := &opaLogger{l: s.log.Named("opa")}
	store := inmem.New()
	mgr, err := plugins.New(raw, id, store, append(managerTracing(s.opts.TracerProvider), // tracing.go
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

// install puts a bundle file's policy and data into the plugin manager's store and compiler, as
// OPA's bundle plugin does with a downloaded bundle, so that OPA's decision-log plugin applies
// the bundle's system.log.mask and system.log.drop rules. The engine does not read the manager:
// its policy is activated separately.
func (r *remote) install(ctx context.Context, name string, b *bundle.Bundle) error {
	params := storage.WriteParams
	params.Context = storage.NewContext()
	return storage.Txn(ctx, r.mgr.Store, params, func(txn storage.Transaction) error {
		c := ast.NewCompiler().WithPathConflictsCheck(storage.NonEmpty(ctx, r.mgr.Store, txn))
		if b.Manifest.Roots != nil {
			c = c.WithPathConflictsCheckRoots(*b.Manifest.Roots)
		}
		err := bundle.Activate(&bundle.ActivateOpts{
			Ctx: ctx, Store: r.mgr.Store, Txn: txn, TxnCtx: params.Context, Compiler: c,
			Metrics: metrics.New(), Bundles: map[string]*bundle.Bundle{name: b}, ParserOptions: r.mgr.ParserOptions(),
		})
		if err != nil {
			return err
		}
		plugins.SetCompilerOnContext(params.Context, c)
		return nil
	})
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
		revs[n] = logtext.Clean(rev)
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
	origin, rev := OriginRemote+":"+strings.Join(sortedNames(revs), ","), joinRevisions(revs)
	var digest string
	if err == nil {
		digest = contentDigest(origin, rev, moduleSources(c), withoutBundleState(data))
	}
	var p *decision.Policy
	switch {
	case err != nil:
	case s.unchangedLocked(digest):
		// The same content again (a server without ETag): the active policy and its
		// decision cache stay.
		s.log.Debug("bundle unchanged; not activated again", "revision", rev)
	default:
		if p, err = decision.CompiledPolicy(c, data, rev); err == nil {
			err = s.activateLocked(ctx, p, origin, digest)
		}
	}
	for _, n := range names {
		s.checks[n] = ""
		if err != nil {
			s.checks[n] = logtext.Clean(err.Error())
		} else {
			s.served[n] = revs[n]
		}
	}
	if err != nil {
		e := &coded.Error{Code: coded.PolicyBundleCheck, Err: err}
		s.status.LastError = logtext.Clean(e.Error())
		s.log.Error("bundle refused; the active policy stays", "bundles", names, "active_revision", s.eng.Revision(), "error", s.status.LastError)
	}
}

// withoutBundleState is data without the ETags of OPA's record of the bundles
// (data.system.bundles.NAME.etag), which change with a download even when the content does not.
func withoutBundleState(data map[string]any) map[string]any {
	sys, _ := data["system"].(map[string]any)
	bundles, _ := sys["bundles"].(map[string]any)
	if len(bundles) == 0 {
		return data
	}
	bOut := make(map[string]any, len(bundles))
	for n, v := range bundles {
		if m, ok := v.(map[string]any); ok {
			if _, has := m["etag"]; has {
				m = maps.Clone(m)
				delete(m, "etag")
			}
			v = m
		}
		bOut[n] = v
	}
	out, sysOut := maps.Clone(data), maps.Clone(sys)
	sysOut["bundles"] = bOut
	out["system"] = sysOut
	return out
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

// onStatus records OPA's status of every bundle (its texts cleaned: cleanStatus), and logs each
// new failure.
func (r *remote) onStatus(st map[string]*bundleplugin.Status) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, b := range st {
		cp := cleanStatus(b)
		prev := s.status.Bundles[n]
		if cp.Code != "" && (prev == nil || prev.Message != cp.Message) {
			s.status.LastError = cp.Code + ": " + cp.Message
			s.log.Error("bundle refused; the active policy stays", "bundle", n, "active_revision", s.eng.Revision(), "code", cp.Code, "error", cp.Message)
		}
		s.status.Bundles[n] = cp
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

// cleanStatus is a copy of OPA's status of a bundle whose texts are safe to show and log: OPA's
// messages quote bundle entry names, URLs and server answers, so each is escaped and its URLs'
// credentials redacted (logtext.Clean).
func cleanStatus(b *bundleplugin.Status) *bundleplugin.Status {
	cp := *b
	cp.Name = logtext.Clean(cp.Name)
	cp.ActiveRevision = logtext.Clean(cp.ActiveRevision)
	cp.Message = logtext.Clean(cp.Message)
	cp.Errors = nil
	for _, err := range b.Errors {
		cp.Errors = append(cp.Errors, cleanError(err))
	}
	return &cp
}

// cleanError is err with its texts cleaned, keeping the shape of OPA's compile errors.
func cleanError(err error) error {
	var ae *ast.Error
	if !errors.As(err, &ae) {
		return errors.New(logtext.Clean(err.Error()))
	}
	out := &ast.Error{Code: logtext.Clean(ae.Code), Message: logtext.Clean(ae.Message)}
	if ae.Location != nil {
		out.Location = &ast.Location{File: logtext.Clean(ae.Location.File), Row: ae.Location.Row, Col: ae.Location.Col}
	}
	if d, ok := ae.Details.(*ast.ParserErrorDetail); ok && d != nil {
		out.Details = &ast.ParserErrorDetail{Line: logtext.Clean(d.Line), Idx: d.Idx}
	}
	return out
}

// opaLogger writes OPA's log into the service log. OPA's messages and fields quote what bundle,
// decision-log and status servers sent (entry names, error bodies) and the URLs of requests, so
// every text is cleaned (logtext.Clean): escaped, and without URL credentials.
type opaLogger struct {
	l      hclog.Logger
	fields []any
}

func (o *opaLogger) args() []any { return o.fields }

func (o *opaLogger) Debug(f string, a ...any) {
	o.l.Debug(logtext.Clean(fmt.Sprintf(f, a...)), o.args()...)
}
func (o *opaLogger) Info(f string, a ...any) {
	o.l.Info(logtext.Clean(fmt.Sprintf(f, a...)), o.args()...)
}
func (o *opaLogger) Warn(f string, a ...any) {
	o.l.Warn(logtext.Clean(fmt.Sprintf(f, a...)), o.args()...)
}
func (o *opaLogger) Error(f string, a ...any) {
	o.l.Error(logtext.Clean(fmt.Sprintf(f, a...)), o.args()...)
}

func (o *opaLogger) WithFields(m map[string]any) logging.Logger {
	f := append([]any(nil), o.fields...)
	for _, k := range sortedNames(m) {
		f = append(f, logtext.Clean(k), cleanField(m[k]))
	}
	return &opaLogger{l: o.l, fields: f}
}

// cleanField is a field of OPA's log as logged: numbers and booleans as they are, anything else
// as its cleaned text.
func cleanField(v any) any {
	switch x := v.(type) {
	case nil, bool, int, int32, int64, uint, uint32, uint64, float32, float64:
		return v
	case string:
		return logtext.Clean(x)
	case error:
		return logtext.Clean(x.Error())
	}
	return logtext.Clean(fmt.Sprintf("%v", v))
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
