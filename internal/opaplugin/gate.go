package opaplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/plugins"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	opaserver "github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/policies"
)

// gate is the decider of the gate's server: an engine of its own, with the policy compiled
// from the copies the activator kept of the bundles OPA activated (the embedded policy when
// none is configured), never from OPA's store or compiler, which OPA's APIs write.
type gate struct {
	m        *plugins.Manager
	bundles  *storeBundles
	settings atomic.Pointer[settings]
	active   atomic.Pointer[activePolicy]

	mu        sync.Mutex // guards loaded and remote
	loaded    string     // what the active policy was made of (skip a load that would change nothing)
	remote    map[string]*bundleplugin.Status
	logMu     sync.Mutex
	logMaker  *logMirror // OPA's decision log, fed from the gate's own policy
	logFailed string     // the key of the policy whose decision log could not be set up
}

// settings are what the gate takes from the plugins.authz section.
type settings struct {
	opts         decision.Options
	writeAPI     bool     // OPA's write APIs are open
	allowedHosts []string // extra Host names for OPA's listener, as for the gate's
	anyHost      bool     // allowedHosts has "*": no Host check
}

// activePolicy is one compiled policy and where it came from.
type activePolicy struct {
	engine      *decision.Engine
	bundles     map[string]opaserver.BundleInfo
	origin      string
	activatedAt time.Time
	lastError   string
	// key identifies what the policy was made of; copies are the bundles it was compiled from.
	key    string
	copies map[string]*bundleCopy
}

var (
	_ server.Decider           = (*gate)(nil)
	_ server.OPADecisionLogger = (*gate)(nil)
	_ server.PolicyStatus      = (*gate)(nil)
)

func newGate(m *plugins.Manager) *gate {
	g := &gate{m: m, bundles: bundles.forStore(m.Store), remote: map[string]*bundleplugin.Status{}}
	g.active.Store(&activePolicy{engine: decision.NewEmpty(decision.Options{})})
	return g
}

// configuredBundles are the names of the bundles section of OPA's configuration (the bundles
// OPA downloads), and whether the deprecated bundle section is set.
func configuredBundles(m *plugins.Manager) (names []string, legacy bool, err error) {
	cfg := m.GetConfig()
	if cfg == nil {
		return nil, false, nil
	}
	if len(cfg.Bundles) > 0 {
		var bs map[string]json.RawMessage
		if err := json.Unmarshal(cfg.Bundles, &bs); err != nil {
			return nil, false, fmt.Errorf("read OPA's bundles section: %w", err)
		}
		names = slices.Sorted(maps.Keys(bs))
	}
	legacy = len(cfg.Bundle) > 0 && string(cfg.Bundle) != "null"
	return names, legacy, nil
}

// storeBundleNames are the bundles OPA's store records as active (a deactivated bundle is no
// longer among them).
func storeBundleNames(ctx context.Context, store storage.Store) ([]string, error) {
	txn, err := store.NewTransaction(ctx)
	if err != nil {
		return nil, fmt.Errorf("read OPA's store: %w", err)
	}
	defer store.Abort(ctx, txn)
	names, err := bundle.ReadBundleNamesFromStore(ctx, store, txn)
	if err != nil && !storage.IsNotFound(err) {
		return nil, fmt.Errorf("read the active bundles: %w", err)
	}
	slices.Sort(names)
	return names, nil
}

// load compiles the gate's policy from the copies of the active bundles and makes it the
// gate's. msg says why the gate has no policy ("" when it has one); a compilation that fails
// keeps the policy the gate had.
func (g *gate) load(ctx context.Context) (msg string, err error) {
	st := g.settings.Load()
	active, gen := g.bundles.snapshot()
	remote, legacy, err := configuredBundles(g.m)
	if err != nil {
		return "", err
	}
	inStore, err := storeBundleNames(ctx, g.m.Store)
	if err != nil {
		return "", err
	}
	use := map[string]*bundleCopy{}
	var missing []string
	for _, n := range inStore {
		if c, ok := active[n]; ok {
			use[n] = c
		} else {
			missing = append(missing, n)
		}
	}
	var waiting []string
	for _, n := range remote {
		if _, ok := use[n]; !ok && !slices.Contains(missing, n) {
			waiting = append(waiting, n)
		}
	}
	key := fmt.Sprintf("%d|%v|%v|%v|%p", gen, slices.Sorted(maps.Keys(use)), missing, waiting, st)
	g.mu.Lock()
	same := key == g.loaded
	g.mu.Unlock()
	if same {
		return g.lastMsg(), nil
	}
	noPolicy := func(why string) (string, error) {
		g.active.Store(&activePolicy{engine: decision.NewEmpty(st.opts), lastError: why, key: key})
		g.setLoaded(key)
		return why, nil
	}
	switch {
	case legacy:
		return noPolicy("OPA's deprecated bundle section is set: the gate takes its policy from the bundles section or --bundle; move the bundle there. Every decision denies (" + coded.EvalNoPolicy + ")")
	case len(missing) > 0:
		return noPolicy(fmt.Sprintf("OPA's store records bundle(s) %s, which the gate did not see activated: every decision denies (%s)", strings.Join(missing, ", "), coded.EvalNoPolicy))
	case len(waiting) > 0:
		return noPolicy(fmt.Sprintf("waiting for bundle(s) %s to be downloaded and activated: every decision denies (%s) until then", strings.Join(waiting, ", "), coded.EvalNoPolicy))
	}
	for _, n := range slices.Sorted(maps.Keys(use)) {
		c := use[n]
		switch {
		case c.delta:
			return noPolicy(fmt.Sprintf("bundle %s is a delta bundle: the gate needs snapshot bundles; every decision denies (%s)", n, coded.EvalNoPolicy))
		case c.err != "":
			return noPolicy(fmt.Sprintf("bundle %s: %s; every decision denies (%s)", n, c.err, coded.EvalNoPolicy))
		}
	}
	var pol *activePolicy
	if len(use) == 0 {
		pol, err = embeddedPolicy(ctx, st.opts)
	} else {
		pol, err = bundlePolicy(ctx, st.opts, use, remote)
	}
	if err != nil {
		return "", err
	}
	pol.key, pol.copies = key, use
	g.active.Store(pol)
	g.setLoaded(key)
	g.decisionLog(ctx) // set up off the hot path: the first decision of the policy finds it ready
	return "", nil
}

func (g *gate) setLoaded(key string) {
	g.mu.Lock()
	g.loaded = key
	g.mu.Unlock()
}

func (g *gate) lastMsg() string { return g.active.Load().lastError }

// embeddedPolicy compiles the policy built into the binary, as `authz serve` does without a
// bundle.
func embeddedPolicy(ctx context.Context, opts decision.Options) (*activePolicy, error) {
	mods, err := policies.Modules()
	if err != nil {
		return nil, &coded.Error{Code: coded.PolicyBundleLoad, Err: fmt.Errorf("read the embedded policy: %w", err)}
	}
	parsed := make(map[string]*ast.Module, len(mods))
	for name, src := range mods {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{ProcessAnnotation: true})
		if err != nil {
			return nil, &coded.Error{Code: coded.PolicyBundleCheck, Err: err}
		}
		parsed[name] = m
	}
	p, err := decision.CompileModules(parsed, nil, decision.ModulesRevision(mods))
	if err != nil {
		return nil, err
	}
	eng := decision.NewEmpty(opts)
	if err := eng.Activate(ctx, p); err != nil {
		return nil, err
	}
	return &activePolicy{engine: eng, bundles: map[string]opaserver.BundleInfo{}, origin: policy.OriginEmbedded, activatedAt: time.Now().UTC()}, nil
}

// bundlePolicy compiles the modules and data of the bundles in use into one policy. Its
// revision is the manifest revision of the one bundle (a digest of its modules when it has
// none), or "name=revision" pairs with several.
func bundlePolicy(ctx context.Context, opts decision.Options, use map[string]*bundleCopy, remote []string) (*activePolicy, error) {
	names := slices.Sorted(maps.Keys(use))
	mods := map[string]*ast.Module{}
	data := map[string]any{}
	infos := map[string]opaserver.BundleInfo{}
	var pairs, origins, files, remotes []string
	var single string
	var at time.Time
	for _, n := range names {
		c := use[n]
		for p, m := range c.modules {
			mods[path.Join(n, p)] = m.Copy()
		}
		cp, _ := snapshot.CopyDocument(c.data).(map[string]any)
		if err := mergeAt(data, nil, cp); err != nil {
			return nil, &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("bundle %s: %w", n, err)}
		}
		rev := c.revision
		if rev == "" {
			rev = decision.ModulesRevision(c.sources)
		}
		infos[n] = opaserver.BundleInfo{Revision: c.revision}
		pairs = append(pairs, n+"="+rev)
		single = rev
		if slices.Contains(remote, n) {
			remotes = append(remotes, n)
		} else {
			files = append(files, n)
		}
		if c.activatedAt.After(at) {
			at = c.activatedAt
		}
	}
	revision := single
	if len(names) > 1 {
		revision = strings.Join(pairs, ",")
	}
	for _, f := range files {
		origins = append(origins, policy.OriginFile+":"+f)
	}
	if len(remotes) > 0 {
		origins = append(origins, policy.OriginRemote+":"+strings.Join(remotes, ","))
	}
	p, err := decision.CompileModules(mods, data, revision)
	if err != nil {
		return nil, err
	}
	eng := decision.NewEmpty(opts)
	if err := eng.Activate(ctx, p); err != nil {
		return nil, err
	}
	return &activePolicy{engine: eng, bundles: infos, origin: strings.Join(origins, ","), activatedAt: at}, nil
}

// Revision implements server.Decider: the active policy's revision, "" while none is.
func (g *gate) Revision() string { return g.active.Load().engine.Revision() }

// Decide implements server.Decider with the active policy: a decision that has begun ends
// on the policy it began with.
func (g *gate) Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	return g.active.Load().engine.Decide(ctx, req, facts)
}

// Status implements server.PolicyStatus: the active revision, its origin and activation time,
// and OPA's status of each bundle.
func (g *gate) Status() policy.Status {
	pol := g.active.Load()
	st := policy.Status{Revision: pol.engine.Revision(), Origin: pol.origin, ActivatedAt: pol.activatedAt, LastError: pol.lastError,
		Bundles: map[string]*bundleplugin.Status{}}
	g.mu.Lock()
	for n, s := range g.remote {
		cp := *s
		cp.Metrics = nil
		st.Bundles[n] = &cp
	}
	g.mu.Unlock()
	for n, b := range pol.bundles {
		if _, ok := st.Bundles[n]; !ok {
			st.Bundles[n] = &bundleplugin.Status{Name: n, ActiveRevision: b.Revision, LastSuccessfulActivation: pol.activatedAt}
		}
	}
	return st
}

// bundleStatus records OPA's status of a downloaded bundle (a bundle plugin listener).
func (g *gate) bundleStatus(s bundleplugin.Status) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cp := s
	g.remote[s.Name] = &cp
}

// DecisionLogs implements server.OPADecisionLogger: whether OPA has decision_logs configured.
func (g *gate) DecisionLogs() bool { return logs.Lookup(g.m) != nil }

// LogDecision implements server.OPADecisionLogger: the server hands it every decision it
// answered, masked like its own log, as it does in `authz serve`. The bundles recorded are
// those of the active policy when it is the one that decided.
func (g *gate) LogDecision(ctx context.Context, d policy.Decision) error {
	lp := g.decisionLog(ctx)
	if lp == nil {
		return nil
	}
	if pol := g.active.Load(); pol.engine.Revision() == d.Revision {
		d.Bundles = pol.bundles
	}
	return policy.LogToOPA(ctx, lp, d)
}
