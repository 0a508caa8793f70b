package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

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
	"github.com/authz-dev/authz/internal/snapshot"
)

// remote runs OPA's plugin manager over the opa section: the bundle plugin downloads (ETag
// polling, long polling when the server offers it), verifies, persists and activates bundles in
// the manager's store; the decision-log and status plugins run when configured. After every
// activation the manager's compiler trigger hands the new compiler and a copy of the store's
// data to the engine: the engine never reads the manager's store, so a store change takes
// effect only through a new activation (and a new cache generation).
//
// Signed bundles are also ordered (order.go). OPA does not hand the compiler trigger the bundle,
// so authz reads the activated bundle's signature back from where OPA persists it: every signed
// bundle is persisted (in OPA's persistence_directory, or in a private directory removed at stop
// when none is configured), and its policy is activated in the engine only after OPA reports
// the download done (onStatus), when the persisted copy is the bundle just activated.
type remote struct {
	s    *Source
	mgr  *plugins.Manager
	bp   *bundleplugin.Plugin // nil when the policy comes from elsewhere
	logs *logs.Plugin         // nil without decision_logs
	ctx  context.Context      // of activations

	signed     map[string]bool      // bundles with a signing block: ordered
	persistDir string               // OPA's persistence directory, when signed bundles exist
	tmpDir     string               // a private persistence directory to remove at stop, or ""
	pending    *pendingPolicy       // compiled and checked, waiting for its order check; s.mu
	rule       BundleRule           // which bundles may activate, and the gate's (gatebundle.go)
	store      storage.Store        // the manager's store, whose activations rule governs
	quiet      *opaQuiet            // what the log keeps quiet (remotelog.go)
	lastRev    map[string]string    // per bundle: its manifest revision at its last activation; s.mu
	changedAt  map[string]time.Time // per bundle: when an activation last brought something new; s.mu
	lastErrOf  string               // the bundle s.status.LastError is about, "" for none; s.mu
}

// remoteProvider is the bundles of the opa section, downloaded and activated by OPA's plugin
// manager (remote).
type remoteProvider struct{ s *Source }

func newRemoteProvider(s *Source) provider { return remoteProvider{s: s} }

func (p remoteProvider) start(ctx context.Context) error { return p.s.startOPA(ctx, true) }

func (p remoteProvider) reload(ctx context.Context) error {
	p.s.mu.Lock()
	r := p.s.remote
	p.s.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.trigger(ctx)
}

// status shows authz's own refusal of a bundle OPA activated, and the revision the engine
// serves: OPA's active revision is the one in its store, where a bundle that failed authz's
// check is too.
func (p remoteProvider) status(st *Status) {
	for n := range p.s.checks {
		if st.Bundles[n] == nil { // refused at start, before OPA reported on it
			st.Bundles[n] = &bundleplugin.Status{Name: n}
		}
	}
	for n, b := range st.Bundles {
		if c := p.s.checks[n]; c.code != "" {
			b.Code, b.Message, b.Errors = c.code, c.msg, nil
		}
		if rev, ok := p.s.served[n]; ok {
			b.ActiveRevision = rev
		}
		// OPA's time is that of its last activation in its store, the same bundle again at
		// every download from a server without ETag: shown is when something new was.
		if r := p.s.remote; r != nil {
			if at, ok := r.changedAt[n]; ok {
				b.LastSuccessfulActivation = at
			}
		}
	}
}

func (p remoteProvider) close(ctx context.Context) { p.s.stopOPA(ctx) }

// pendingPolicy is a policy OPA activated in its store that waits for the order check of its
// signed bundles.
type pendingPolicy struct {
	p                  *GatePolicy // nil when its content is the active policy's
	digest             string
	names              []string
	revs, manifestRevs map[string]string // revisions as shown; manifest revisions as written
}

// orderedDocument is the opa section as OPA's plugin manager reads it: with bundles, every
// signed bundle is persisted, and without a persistence_directory a private one is made.
func (r *remote) orderedDocument(raw []byte) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	bundles, _ := doc["bundles"].(map[string]any)
	for n, v := range bundles {
		if b, ok := v.(map[string]any); ok && b["signing"] != nil {
			r.signed[n] = true
			b["persist"] = true
		}
	}
	if len(r.signed) == 0 {
		return raw, nil
	}
	state := ""
	if dir, ok := doc["persistence_directory"].(string); ok && dir != "" {
		r.persistDir, state = dir, filepath.Join(dir, orderStateName)
	} else {
		tmp, err := os.MkdirTemp("", "authz-opa-")
		if err != nil {
			return nil, err
		}
		r.persistDir, r.tmpDir = tmp, tmp
		doc["persistence_directory"] = tmp
	}
	order, err := loadOrder(state)
	if err != nil {
		return nil, err
	}
	r.s.mu.Lock()
	r.s.order = order
	r.s.mu.Unlock()
	return json.Marshal(doc)
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
	r := &remote{s: s, ctx: context.WithoutCancel(ctx), signed: map[string]bool{}, quiet: newOPAQuiet(),
		lastRev: map[string]string{}, changedAt: map[string]time.Time{}}
	if bundles {
		if raw, err = r.orderedDocument(raw); err != nil {
			r.removeTmp()
			return nil, err
		}
	}
	lg := &opaLogger{l: s.log.Named("opa"), quiet: r.quiet}
	store := inmem.New()
	if bundles {
		if r.rule, err = s.cfg.bundleRule(); err != nil {
			r.removeTmp()
			return nil, err
		}
		// Every activation into the store passes the rule first, a persisted bundle loaded
		// inside Start included: a refused bundle is never activated, nor persisted.
		ensureAdmitting()
		r.store = store
		SetStoreRule(store, r.rule, r.onAdmit)
		// A bundle other than the gate's served again unchanged is not compiled again
		// (bundlecost.go): OPA's compile of it would hold up the gate's bundle at every poll.
		SkipUnchanged(store)
	}
	mgr, err := plugins.New(raw, id, store, append(managerTracing(s.opts.TracerProvider, bundleBoundOption{lim: lim, times: s.opts.downloadTimes, rego: r.regoBound(raw)}), // tracing.go, remotebound.go
		plugins.Logger(lg), plugins.ConsoleLogger(lg), plugins.WithEnableVersionCheck(false))...)
	if err != nil {
		r.abandon()
		return nil, fmt.Errorf("opa: %w", err)
	}
	if err := mgr.Init(ctx); err != nil {
		r.abandon()
		return nil, fmt.Errorf("opa: %w", err)
	}
	// Discovery without a discovery block is how `opa run` creates the bundle, decision-log
	// and status plugins of the configuration.
	disco, err := discovery.New(mgr)
	if err != nil {
		r.abandon()
		return nil, fmt.Errorf("opa: %w", err)
	}
	mgr.Register(discovery.Name, disco)
	r.mgr, r.logs = mgr, logs.Lookup(mgr)
	if bundles {
		if r.bp = bundleplugin.Lookup(mgr); r.bp == nil {
			r.abandon()
			return nil, errors.New("opa: no bundles configured")
		}
		// Both are registered before Start: a persisted bundle is activated inside Start.
		mgr.RegisterCompilerTrigger(func(txn storage.Transaction) { r.onActivate(r.ctx, txn) })
		r.bp.RegisterBulkListener("authz", r.onStatus)
	}
	if err := mgr.Start(ctx); err != nil {
		r.stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("opa: %w", err)
	}
	// Bundles OPA loaded from its persistence directory were activated inside Start.
	s.mu.Lock()
	r.settleLocked(false)
	s.mu.Unlock()
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
	var mods map[string]*ast.Module // with other bundles: the gate's bundle's modules only
	if r.rule.Multi {
		// The other bundles are OPA's: one is new when its manifest revision changed.
		for _, n := range names {
			if n == r.rule.Gate {
				continue
			}
			rev, _ := bundle.ReadBundleRevisionFromStore(ctx, store, txn, n)
			s.mu.Lock()
			fresh := rev == "" || rev != r.lastRev[n]
			if fresh {
				r.lastRev[n], r.changedAt[n] = rev, time.Now().UTC()
			}
			s.mu.Unlock()
			r.quiet.setFresh(n, fresh)
		}
		// The gate decides on its bundle only: the other bundles' modules and data are OPA's
		// (its decision-log rules aside, which only the gate's bundle may provide).
		if !slices.Contains(names, r.rule.Gate) {
			return // not activated yet: nothing of the gate's has changed
		}
		names = []string{r.rule.Gate}
	}
	revs, manifestRevs := map[string]string{}, map[string]string{}
	for _, n := range names {
		rev, rerr := bundle.ReadBundleRevisionFromStore(ctx, store, txn, n)
		if rerr != nil {
			err = errors.Join(err, rerr)
		}
		revs[n], manifestRevs[n] = logtext.Clean(rev), rev
	}
	var data map[string]any
	switch {
	case err == nil && r.rule.Multi:
		mods, data, err = gateContent(ctx, store, txn, c, r.rule.Gate)
	case err == nil:
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
	// A policy still pending is settled before this newer one takes its place: it may be a
	// bundle loaded from the persistence directory, whose persisted copy is still in place.
	r.settleLocked(false)
	sources := moduleSources(c)
	if mods != nil {
		sources = moduleSourcesOf(mods)
	}
	for _, n := range names {
		if revs[n] == "" {
			revs[n] = decision.ContentRevision(sources, nil)
		}
	}
	origin, rev := OriginRemote+":"+strings.Join(sortedNames(revs), ","), decision.JoinRevisions(revs)
	var digest string
	if err == nil {
		digest = contentDigest(origin, rev, sources, withoutBundleState(data))
	}
	// The same content again (a server without ETag, a new ETag for the same bundle) is not
	// compiled nor activated again: the active policy and its decision cache stay. Its
	// signature is still ordered: it is what OPA persisted.
	var p *GatePolicy
	if err == nil && !s.unchangedLocked(digest) {
		// mods nil: the gate's bundle is the only one, and OPA's compiler compiled it.
		p, err = CompileGate(GateContent{Modules: mods, Compiled: c, Data: data, Revision: rev, Origin: origin})
	}
	if err != nil {
		r.pending = nil
		r.refuseLocked(names, coded.PolicyBundleCheck, err)
		return
	}
	for _, n := range names {
		r.quiet.setFresh(n, p != nil) // nil: the same content again
	}
	r.pending = &pendingPolicy{p: p, digest: digest, names: names, revs: revs, manifestRevs: manifestRevs}
	if len(r.signed) == 0 {
		r.settleLocked(true) // nothing to order: activate now
	}
}

// settleLocked checks the order of the pending policy's signed bundles against the signatures
// OPA persisted, and activates it or refuses it; s.mu is held. OPA persists a downloaded bundle
// after activating it, so until it reports the download (final) a persisted copy of another
// revision means "not yet": the policy stays pending. A bundle loaded from the persistence
// directory at start is its persisted copy.
func (r *remote) settleLocked(final bool) {
	s, pend := r.s, r.pending
	if pend == nil {
		return
	}
	type readBack struct {
		sc  bundle.SignaturesConfig
		err error
	}
	got := map[string]readBack{}
	for _, n := range pend.names {
		if !r.signed[n] {
			continue
		}
		sc, rev, err := persistedSignature(r.persistDir, n)
		if err == nil && rev != pend.manifestRevs[n] {
			err = fmt.Errorf("the persisted bundle has revision %q, not the activated %q", rev, pend.manifestRevs[n])
			if !final {
				return
			}
		}
		if err != nil && !final && errors.Is(err, fs.ErrNotExist) {
			return
		}
		got[n] = readBack{sc, err}
	}
	r.pending = nil
	iats := map[string]int64{}
	for _, n := range sortedNames(got) {
		iat, err := int64(0), got[n].err
		if err == nil {
			iat, err = signatureIAT(got[n].sc)
		}
		if err != nil {
			r.refuseLocked([]string{n}, coded.PolicyBundleLoad, fmt.Errorf("bundle %s: read back its signature to order it: %w", n, err))
			r.restoreLocked(n)
			return
		}
		if err := s.order.check(n, iat); err != nil {
			r.refuseLocked([]string{n}, coded.PolicyBundleRollback, err)
			r.restoreLocked(n)
			return
		}
		iats[n] = iat
	}
	switch {
	case pend.p == nil || s.unchangedLocked(pend.digest):
		s.log.Debug("bundle unchanged; not activated again", "revision", decision.JoinRevisions(pend.revs))
	default:
		if err := s.activateGateLocked(r.ctx, pend.p, pend.digest); err != nil {
			r.refuseLocked(pend.names, coded.PolicyBundleCheck, err)
			return
		}
		for _, n := range pend.names {
			r.changedAt[n] = s.status.ActivatedAt
		}
	}
	r.servedLocked(pend.names, pend.revs)
	for n := range iats {
		// Kept, so that a refused bundle OPA persisted over it can be put back.
		if err := copyFile(r.persisted(n), r.accepted(n)); err != nil {
			s.log.Warn("the accepted bundle could not be kept; a restart may start without a policy", "bundle", n, "error", logtext.Clean(err.Error()))
		}
	}
	if err := s.order.commit(iats); err != nil {
		s.log.Error("the order of signed bundles could not be saved; after a restart an older bundle could be accepted", "file", s.order.state, "error", logtext.Clean(err.Error()))
	}
}

// persisted is where OPA persists bundle n; accepted is where authz keeps the last one the
// engine served.
func (r *remote) persisted(n string) string {
	return filepath.Join(r.persistDir, "bundles", n, "bundle.tar.gz")
}

func (r *remote) accepted(n string) string {
	return filepath.Join(r.persistDir, "authz-accepted", n, "bundle.tar.gz")
}

// restoreLocked puts the last accepted bundle n back where OPA persisted the refused one, so
// that a restart loads the bundle the engine serves, not the refused one; s.mu is held.
func (r *remote) restoreLocked(n string) {
	if _, err := os.Stat(r.accepted(n)); err != nil {
		return // none accepted yet: the refused bundle stays refused at the next start too
	}
	if err := copyFile(r.accepted(n), r.persisted(n)); err != nil {
		r.s.log.Error("the refused bundle is still persisted; a restart will refuse it again and start without this bundle's policy", "bundle", n, "error", logtext.Clean(err.Error()))
	}
}

// copyFile copies src to dst through a temporary file and a rename.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// servedLocked records that the engine serves names at revs; s.mu is held.
func (r *remote) servedLocked(names []string, revs map[string]string) {
	for _, n := range names {
		delete(r.s.checks, n)
		r.s.served[n] = revs[n]
	}
}

// refuseLocked records authz's refusal of names (OPA activated them in its store, the engine
// keeps its policy); s.mu is held.
func (r *remote) refuseLocked(names []string, code coded.Code, err error) {
	s := r.s
	msg := logtext.Clean(err.Error())
	for _, n := range names {
		s.checks[n] = refusal{code: string(code), msg: msg}
	}
	s.status.LastError = string(code) + ": " + msg
	r.lastErrOf = ""
	if len(names) == 1 {
		r.lastErrOf = names[0]
	}
	s.log.Error("bundle refused; the active policy stays", "bundles", names, "active_revision", s.eng.Revision(), "code", string(code), "error", msg)
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

// gateContent is the content of the gate's bundle in the store: the compiled modules whose
// package lies within its roots, and the data at its roots (the roots of the bundles in the
// store are disjoint, and a bundle's modules lie within its roots).
func gateContent(ctx context.Context, store storage.Store, txn storage.Transaction, c *ast.Compiler, gate string) (map[string]*ast.Module, map[string]any, error) {
	roots, err := bundle.ReadBundleRootsFromStore(ctx, store, txn, gate)
	if err != nil {
		return nil, nil, fmt.Errorf("bundle %s: read its roots: %w", gate, err)
	}
	mods := map[string]*ast.Module{}
	if c != nil {
		for id, m := range c.Modules {
			if bundle.RootPathsContain(roots, packagePath(m)) {
				mods[id] = m.Copy()
			}
		}
	}
	data := map[string]any{}
	for _, root := range roots {
		segs := strings.Split(strings.Trim(root, "/"), "/")
		v, err := store.Read(ctx, txn, storage.Path(segs))
		switch {
		case storage.IsNotFound(err):
			continue
		case err != nil:
			return nil, nil, fmt.Errorf("bundle %s: read its data at %s: %w", gate, root, err)
		}
		if err := setAt(data, segs, snapshot.CopyDocument(v)); err != nil {
			return nil, nil, fmt.Errorf("bundle %s: data at %s: %w", gate, root, err)
		}
	}
	return mods, data, nil
}

// packagePath is the package of m as a root path (authz/decision for package authz.decision).
func packagePath(m *ast.Module) string {
	if m.Package == nil {
		return ""
	}
	var segs []string
	for _, t := range m.Package.Path[1:] { // after data
		s, ok := t.Value.(ast.String)
		if !ok {
			return ""
		}
		segs = append(segs, string(s))
	}
	return strings.Join(segs, "/")
}

// setAt sets doc at segs to v, making the objects on the way.
func setAt(doc map[string]any, segs []string, v any) error {
	for _, k := range segs[:len(segs)-1] {
		next, ok := doc[k].(map[string]any)
		if !ok {
			if _, set := doc[k]; set {
				return fmt.Errorf("%s is not an object", k)
			}
			next = map[string]any{}
			doc[k] = next
		}
		doc = next
	}
	doc[segs[len(segs)-1]] = v
	return nil
}

// moduleSourcesOf are the sources of mods (for a content revision).
func moduleSourcesOf(mods map[string]*ast.Module) map[string]string {
	out := make(map[string]string, len(mods))
	for id, m := range mods {
		out[id] = m.String()
	}
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
	seen := map[string]time.Time{}
	for n, b := range st {
		cp := cleanStatus(b)
		regoBoundStatus(cp)      // a download cut for its Rego (bundlecost.go)
		if unchangedStatus(cp) { // the same content again, not activated again (bundlecost.go)
			r.quiet.setFresh(n, false)
		}
		prev := s.status.Bundles[n]
		if prev != nil {
			seen[n] = prev.LastRequest
		}
		if cp.Code == "" {
			r.quiet.recovered(n)
		}
		if changed := prev == nil || prev.Message != cp.Message; cp.Code != "" && (changed || transient(cp.Message)) {
			code := cp.Code
			if c := s.checks[n]; c.code != "" {
				code = c.code
			}
			if changed {
				s.status.LastError, r.lastErrOf = code+": "+cp.Message, n
			}
			r.logFailureLocked(n, code, cp.Message) // a transient failure again: rate-limited
		}
		s.status.Bundles[n] = cp
		r.clearLastErrorLocked(n, cp) // bundlecost.go
	}
	// OPA reports a download once it has activated and persisted the bundle.
	r.settleLocked(true)
	for _, n := range sortedNames(st) {
		s.countLocked(n, s.status.Bundles[n], seen[n], r.quiet.isFresh(n))
	}
}

// logFailureLocked logs the failure of bundle n OPA reported: nothing for a download the stop
// cancelled, a WARN at most once a minute per bundle for a transient download failure (OPA
// retries it), an ERROR for anything else (a bundle refused); s.mu is held.
func (r *remote) logFailureLocked(n, code, msg string) {
	s := r.s
	revKey := "active_revision"
	if r.rule.Multi && n != r.rule.Gate {
		revKey = "gate_revision" // the revision the gate decides with, not this bundle's
	}
	args := []any{"bundle", n, revKey, s.eng.Revision(), "code", code, "error", msg}
	switch {
	case r.quiet.canceled(msg):
		s.log.Debug("bundle download cancelled by the stop", args...)
	case transient(msg) && s.checks[n].code == "":
		if r.quiet.warnNow(n) {
			s.log.Warn("bundle download failed; the active policy stays and OPA retries with back-off (logged at most once a minute per bundle)", args...)
		} else {
			s.log.Debug("bundle download failed; the active policy stays and OPA retries with back-off", args...)
		}
	default:
		s.log.Error("bundle refused; the active policy stays", args...)
	}
}

// trigger downloads now (SIGHUP) every bundle whose download is triggered by hand. A polled
// bundle is left to its polling: OPA's downloader must not run a second download of it beside
// the polling one (they share its state unguarded).
func (r *remote) trigger(ctx context.Context) error {
	if r.bp == nil {
		return nil
	}
	bundles := r.bp.Config().Bundles
	var errs []error
	for name, loader := range r.bp.Loaders() {
		if src := bundles[name]; src == nil || src.Trigger == nil || *src.Trigger != plugins.TriggerManual {
			continue
		}
		if err := loader.Trigger(ctx); err != nil {
			errs = append(errs, fmt.Errorf("bundle %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func (r *remote) stop(ctx context.Context) {
	r.quiet.stopping.Store(true) // the downloads the stop cancels are not failures
	if r.mgr != nil {
		r.mgr.Stop(ctx)
	}
	if r.store != nil {
		ClearStoreRule(r.store)
	}
	r.removeTmp()
}

// abandon undoes what a start that failed before the manager started set up.
func (r *remote) abandon() {
	if r.store != nil {
		ClearStoreRule(r.store)
	}
	r.removeTmp()
}

// onAdmit hears the rule's verdict on a bundle about to be activated: a refusal is recorded
// as the bundle's code (POLICY_BUNDLE_ROOTS) in the status, an admission clears one.
func (r *remote) onAdmit(name string, err error) {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		if c := s.checks[name].code; c == string(coded.PolicyBundleRoots) || c == string(coded.PolicyBundleTooLarge) {
			delete(s.checks, name)
		}
		return
	}
	code := coded.CodeOf(err)
	if code == "" {
		code = coded.PolicyBundleRoots
	}
	msg := logtext.Clean(err.Error())
	s.checks[name] = refusal{code: string(code), msg: msg}
	s.status.LastError, r.lastErrOf = string(code)+": "+msg, name
}

// removeTmp removes the private persistence directory, if one was made.
func (r *remote) removeTmp() {
	if r.tmpDir != "" {
		_ = os.RemoveAll(r.tmpDir)
		r.tmpDir = ""
	}
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
	name   string    // the bundle the lines are of (OPA's field name), "" for none
	quiet  *opaQuiet // what to keep quiet; nil: nothing
}

func (o *opaLogger) args() []any { return o.fields }

func (o *opaLogger) Debug(f string, a ...any) {
	o.l.Debug(logtext.Clean(fmt.Sprintf(f, a...)), o.args()...)
}
func (o *opaLogger) Info(f string, a ...any) {
	msg := fmt.Sprintf(f, a...)
	// From a server without ETag, every poll downloads and activates the bundle again.
	if o.quiet != nil && msg == "Bundle loaded and activated successfully." && !o.quiet.isFresh(o.name) {
		o.l.Debug(logtext.Clean(msg+" Nothing new."), o.args()...)
		return
	}
	o.l.Info(logtext.Clean(msg), o.args()...)
}
func (o *opaLogger) Warn(f string, a ...any) {
	o.l.Warn(logtext.Clean(fmt.Sprintf(f, a...)), o.args()...)
}
func (o *opaLogger) Error(f string, a ...any) {
	msg := fmt.Sprintf(f, a...)
	// A download's failure is logged once by the source (logFailureLocked), at its level.
	if o.quiet != nil && (strings.HasPrefix(msg, "Bundle load failed: ") && (o.quiet.canceled(msg) || transient(msg)) ||
		strings.HasPrefix(msg, "Bundle activation failed: ") && strings.Contains(msg, ErrBundleUnchanged.Error())) {
		o.l.Debug(logtext.Clean(msg), o.args()...)
		return
	}
	o.l.Error(logtext.Clean(msg), o.args()...)
}

func (o *opaLogger) WithFields(m map[string]any) logging.Logger {
	f := append([]any(nil), o.fields...)
	for _, k := range sortedNames(m) {
		f = append(f, logtext.Clean(k), cleanField(m[k]))
	}
	name := o.name
	if n, ok := m["name"].(string); ok {
		name = n
	}
	return &opaLogger{l: o.l, fields: f, name: name, quiet: o.quiet}
}

// cleanField is a field of OPA's log as logged: numbers and booleans as they are, strings
// cleaned, JSON-shaped objects and arrays (OPA's console decision log) with every key and
// string cleaned, anything else as its cleaned text.
func cleanField(v any) any {
	switch x := v.(type) {
	case nil, bool, int, int32, int64, uint, uint32, uint64, float32, float64, json.Number:
		return v
	case string:
		return logtext.Clean(x)
	case error:
		return logtext.Clean(x.Error())
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[logtext.Clean(k)] = cleanField(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = cleanField(e)
		}
		return out
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
