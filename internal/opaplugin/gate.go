package opaplugin

import (
	"cmp"
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

	"github.com/hashicorp/go-hclog"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/plugins"
	bundleplugin "github.com/open-policy-agent/opa/v1/plugins/bundle"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	opaserver "github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/changes"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
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

	orderMu sync.Mutex          // guards order and refused
	order   *policy.BundleOrder // issue times of the signed bundles adopted
	persist bool                // order is the one kept in OPA's persistence directory (loadOrder)
	refused map[string]string   // per bundle: why its last activation was refused as a rollback
	roots   map[string]string   // per bundle: why its last activation was refused for its roots
	logger  func() hclog.Logger

	activated changes.Listeners[string] // told the revision of every policy made the gate's
}

// settings are what the gate takes from the plugins.authz section.
type settings struct {
	opts         decision.Options
	gateBundle   string   // the one bundle the gate compiles and waits for; "" for all it sees
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
	g := &gate{m: m, bundles: bundles.forStore(m.Store), remote: map[string]*bundleplugin.Status{}, refused: map[string]string{},
		roots:  map[string]string{},
		logger: func() hclog.Logger { return hclog.NewNullLogger() }}
	// Stored before any listener is added: there is nobody to tell.
	g.active.Store(&activePolicy{engine: decision.New(decision.Options{})})
	g.order, _ = policy.LoadBundleOrder("") // kept in the process until loadOrder; it cannot fail
	return g
}

// configuredBundles are the names of the bundles section of OPA's configuration (the bundles
// OPA downloads), and whether the deprecated bundle section is set.
func configuredBundles(m *plugins.Manager) (names []string, legacy bool, err error) {
	if m == nil {
		return nil, false, nil
	}
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

// checkSigning holds OPA's keys and bundles sections to the rule of authz serve
// (policy.CheckBundleSigning): with keys configured, every bundle has a signing block that binds
// it to one key. keyed reports whether keys are configured: a bundle of the bundles section
// then counts only with a signature OPA verified.
func checkSigning(m *plugins.Manager) (keyed bool, err error) {
	if m == nil {
		return false, nil
	}
	cfg := m.GetConfig()
	if cfg == nil {
		return false, nil
	}
	if err := policy.CheckBundleSigning(cfg); err != nil {
		return false, fmt.Errorf("OPA's configuration: %w", err)
	}
	if len(cfg.Keys) > 0 && string(cfg.Keys) != "null" {
		var ks map[string]json.RawMessage
		if err := json.Unmarshal(cfg.Keys, &ks); err != nil {
			return false, fmt.Errorf("OPA's configuration: keys: %w", err)
		}
		keyed = len(ks) > 0
	}
	return keyed, nil
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
	if gb := st.gateBundle; gb != "" {
		// The gate compiles its bundle only and waits for it only: the other bundles, whatever
		// OPA does with them, neither change nor block its policy.
		inStore = slices.DeleteFunc(inStore, func(n string) bool { return n != gb })
		remote = []string{gb}
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
		g.setActive(&activePolicy{engine: decision.New(st.opts), lastError: why, key: key})
		g.setLoaded(key)
		return why, nil
	}
	switch {
	case legacy:
		return noPolicy("OPA's deprecated bundle section is set: the gate takes its policy from the bundles section or --bundle; move the bundle there. Every decision denies (" + string(coded.EvalNoPolicy) + ")")
	case len(missing) > 0:
		return noPolicy(fmt.Sprintf("OPA's store records bundle(s) %s, which the gate did not see activated: every decision denies (%s)", strings.Join(missing, ", "), coded.EvalNoPolicy))
	case len(waiting) > 0:
		return noPolicy(fmt.Sprintf("waiting for bundle(s) %s to be downloaded and activated: every decision denies (%s) until then", strings.Join(waiting, ", "), coded.EvalNoPolicy))
	}
	keyed, err := checkSigning(g.m)
	if err != nil {
		return noPolicy(fmt.Sprintf("%v; every decision denies (%s)", err, coded.EvalNoPolicy))
	}
	for _, n := range slices.Sorted(maps.Keys(use)) {
		c := use[n]
		switch {
		case keyed && !c.signed && slices.Contains(remote, n):
			return noPolicy(fmt.Sprintf("bundle %s has no verified signature, and OPA's configuration has keys for it: the gate adopts it only signed; every decision denies (%s)", n, coded.EvalNoPolicy))
		case c.delta:
			return noPolicy(fmt.Sprintf("bundle %s is a delta bundle: the gate needs snapshot bundles; every decision denies (%s)", n, coded.EvalNoPolicy))
		case c.err != "":
			return noPolicy(fmt.Sprintf("bundle %s: %s; every decision denies (%s)", n, c.err, coded.EvalNoPolicy))
		}
	}
	use, iats, why := g.ordered(use)
	if why != "" {
		return noPolicy(why)
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
	g.setActive(pol)
	g.setLoaded(key)
	g.orderMu.Lock()
	for n := range iats {
		delete(g.refused, n)
	}
	if err := g.order.Commit(iats); err != nil {
		g.logger().Error("the order of signed bundles could not be saved; after a restart an older bundle could be adopted", "error", err)
	}
	g.orderMu.Unlock()
	g.decisionLog(ctx) // set up off the hot path: the first decision of the policy finds it ready
	return "", nil
}

// loadOrder reads the order of signed bundles the gate adopted, kept in OPA's
// persistence_directory when one is set (else in the process only). It is read once.
func (g *gate) loadOrder() error {
	g.orderMu.Lock()
	defer g.orderMu.Unlock()
	if g.persist {
		return nil
	}
	cfg := g.m.GetConfig()
	if cfg == nil || cfg.PersistenceDirectory == nil || *cfg.PersistenceDirectory == "" {
		return nil
	}
	o, err := policy.LoadBundleOrder(*cfg.PersistenceDirectory)
	if err != nil {
		return &coded.Error{Code: coded.PolicyBundleLoad, Err: err}
	}
	g.order, g.persist = o, true
	return nil
}

// ordered checks the order of the signed bundles in use (those OPA verified) by their
// signature's issue time, as authz serve does: a bundle issued before the one the gate adopted,
// or without an iat after one with it, is refused (POLICY_BUNDLE_ROLLBACK) and the gate keeps
// the copy it decides with. It returns the copies to compile and the issue times to record
// once they are active; why is set when a refused bundle leaves the gate without a copy.
func (g *gate) ordered(use map[string]*bundleCopy) (out map[string]*bundleCopy, iats map[string]int64, why string) {
	prev := g.active.Load().copies
	out, iats = maps.Clone(use), map[string]int64{}
	g.orderMu.Lock()
	defer g.orderMu.Unlock()
	for n := range g.refused {
		if _, ok := use[n]; !ok {
			delete(g.refused, n) // no longer active
		}
	}
	for _, n := range slices.Sorted(maps.Keys(use)) {
		c := use[n]
		if !c.signed {
			delete(g.refused, n) // not ordered
			continue
		}
		err := g.order.Check(n, c.iat)
		if err == nil {
			iats[n] = c.iat
			continue
		}
		msg := err.Error()
		if g.refused[n] != msg {
			g.logger().Warn("bundle refused as a rollback; the gate keeps deciding with its policy", "code", coded.PolicyBundleRollback,
				"bundle", n, "revision", c.revision, "error", msg)
		}
		g.refused[n] = msg
		kept, ok := prev[n]
		if !ok {
			return nil, nil, fmt.Sprintf("%s: %s; the gate has no earlier copy of bundle %s: every decision denies (%s) until a bundle issued later is activated",
				coded.PolicyBundleRollback, msg, n, coded.EvalNoPolicy)
		}
		out[n] = kept
	}
	return out, iats, ""
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
	p, err := policy.EmbeddedGate()
	if err != nil {
		return nil, err
	}
	eng := decision.New(opts)
	a, err := p.ActivateOn(ctx, eng)
	if err != nil {
		return nil, err
	}
	return &activePolicy{engine: eng, bundles: map[string]opaserver.BundleInfo{}, origin: a.Origin, activatedAt: a.At}, nil
}

// bundlePolicy compiles the modules and data of the bundles in use into one policy. Its
// revision is the manifest revision of the one bundle (a digest of its modules when it has
// none), or "name=revision" pairs with several.
func bundlePolicy(ctx context.Context, opts decision.Options, use map[string]*bundleCopy, remote []string) (*activePolicy, error) {
	names := slices.Sorted(maps.Keys(use))
	mods := map[string]*ast.Module{}
	data := map[string]any{}
	infos := map[string]opaserver.BundleInfo{}
	var origins, files, remotes []string
	revs := map[string]string{}
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
			rev = decision.ContentRevision(c.sources)
		}
		infos[n] = opaserver.BundleInfo{Revision: c.revision}
		revs[n] = rev
		if slices.Contains(remote, n) {
			remotes = append(remotes, n)
		} else {
			files = append(files, n)
		}
		if c.activatedAt.After(at) {
			at = c.activatedAt
		}
	}
	revision := decision.JoinRevisions(revs)
	for _, f := range files {
		origins = append(origins, policy.OriginFile+":"+f)
	}
	if len(remotes) > 0 {
		origins = append(origins, policy.OriginRemote+":"+strings.Join(remotes, ","))
	}
	p, err := policy.CompileGate(policy.GateContent{Modules: mods, Data: data, Revision: revision, Origin: strings.Join(origins, ",")})
	if err != nil {
		return nil, err
	}
	eng := decision.New(opts)
	a, err := p.ActivateOn(ctx, eng)
	if err != nil {
		return nil, err
	}
	// Activated when OPA committed the newest of its bundles, not now: the gate follows OPA's
	// activations.
	return &activePolicy{engine: eng, bundles: infos, origin: a.Origin, activatedAt: at}, nil
}

// setActive makes pol the gate's policy and tells the listeners.
func (g *gate) setActive(pol *activePolicy) {
	g.active.Store(pol)
	g.activated.Notify(pol.engine.Revision())
}

// OnPolicyChange calls fn with the revision of every policy made the gate's (the empty policy
// of a gate that has none, too), after it is: a decision made after fn was called decides on it.
// fn must return quickly and must not block or call cancel.
func (g *gate) OnPolicyChange(fn func(revision string)) (cancel func()) { return g.activated.Add(fn) }

// Revision implements server.Decider: the active policy's revision, "" while none is.
func (g *gate) Revision() string { return g.active.Load().engine.Revision() }

// Decide implements server.Decider with the active policy: a decision that has begun ends
// on the policy it began with.
func (g *gate) Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	return g.active.Load().engine.Decide(ctx, req, facts)
}

// Status implements server.PolicyStatus: the active revision, its origin and activation time,
// and OPA's status of each bundle.
func (g *gate) Status() api.Status {
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
	// A bundle refused as a rollback is active in OPA's store, not in the gate.
	g.orderMu.Lock()
	for _, n := range slices.Sorted(maps.Keys(g.refused)) {
		b, ok := st.Bundles[n]
		if !ok {
			b = &bundleplugin.Status{Name: n}
			st.Bundles[n] = b
		}
		b.Code, b.Message, b.Errors = string(coded.PolicyBundleRollback), g.refused[n], nil
		b.ActiveRevision = pol.bundles[n].Revision
		if st.LastError == "" {
			st.LastError = string(coded.PolicyBundleRollback) + ": " + g.refused[n]
		}
	}
	// A bundle refused for its roots or its size was never activated.
	for _, n := range slices.Sorted(maps.Keys(g.roots)) {
		b, ok := st.Bundles[n]
		if !ok {
			b = &bundleplugin.Status{Name: n}
			st.Bundles[n] = b
		}
		code := coded.PolicyBundleRoots
		if policy.IsTooLarge(g.roots[n]) {
			code = coded.PolicyBundleTooLarge
		}
		b.Code, b.Message, b.Errors = string(code), g.roots[n], nil
		if st.LastError == "" {
			st.LastError = string(code) + ": " + g.roots[n]
		}
	}
	g.orderMu.Unlock()
	return policy.APIStatus(st)
}

// applyRule makes every bundle activation into OPA's store pass rule
// (policy.AdmitActivation, in the activator): a bundle other than the gate's whose roots reach
// authz or system is never activated. The refusals are shown in the gate's status.
func (g *gate) applyRule(rule policy.BundleRule) {
	if g.m == nil {
		return
	}
	if rule.Gate == "" {
		policy.ClearStoreRule(g.m.Store)
		return
	}
	policy.SetStoreRule(g.m.Store, rule, func(name string, err error) {
		g.orderMu.Lock()
		defer g.orderMu.Unlock()
		if err == nil {
			delete(g.roots, name)
			return
		}
		msg := err.Error()
		if g.roots[name] != msg {
			what := "its roots reach what only the gate's bundle may provide"
			code := coded.CodeOf(err)
			if code == coded.PolicyBundleTooLarge {
				what = "it carries more than a bundle other than the gate's may"
			}
			g.logger().Warn("bundle refused: "+what+"; the gate keeps deciding with its bundle",
				"code", cmp.Or(code, coded.PolicyBundleRoots), "bundle", name, "error", msg)
		}
		g.roots[name] = msg
	})
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
func (g *gate) LogDecision(ctx context.Context, rec api.Decision) error {
	lp := g.decisionLog(ctx)
	if lp == nil {
		return nil
	}
	d := policy.DecisionOf(rec)
	if pol := g.active.Load(); pol.engine.Revision() == d.Revision {
		d.Bundles = pol.bundles
	}
	return policy.LogToOPA(ctx, lp, d)
}
