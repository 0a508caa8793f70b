package opaplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/rego"
	opaserver "github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/policy"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
)

var entrypoint = ast.MustParseRef(decision.Query)

// gate is the decider of the gate's server: the engine prepared from OPA's active policy, and
// OPA's decision log.
type gate struct {
	m        *plugins.Manager
	settings atomic.Pointer[settings]
	active   atomic.Pointer[activePolicy]
}

// settings are what the gate takes from the plugins.authz section.
type settings struct {
	opts decision.Options
}

// activePolicy is one prepared policy and the bundles it came from.
type activePolicy struct {
	engine  *decision.Engine
	bundles map[string]opaserver.BundleInfo
}

var (
	_ server.Decider           = (*gate)(nil)
	_ server.OPADecisionLogger = (*gate)(nil)
)

func newGate(m *plugins.Manager) *gate {
	g := &gate{m: m}
	g.active.Store(&activePolicy{engine: decision.NewEmpty(decision.Options{})})
	return g
}

// load prepares OPA's active policy, with the engine options of the current configuration,
// and makes it the gate's. msg says why the gate has no policy ("" when it has one); a
// preparation that fails keeps the policy the gate had.
func (g *gate) load(ctx context.Context, m *plugins.Manager) (msg string, err error) {
	txn, err := m.Store.NewTransaction(ctx)
	if err != nil {
		return "", fmt.Errorf("read OPA's store: %w", err)
	}
	defer m.Store.Abort(ctx, txn)
	// The compiler is read with the transaction open: no commit (and so no other compiler)
	// can come between them.
	compiler := m.GetCompiler()
	opts := g.settings.Load().opts
	if compiler == nil || len(compiler.GetRulesExact(entrypoint)) == 0 {
		g.active.Store(&activePolicy{engine: decision.NewEmpty(opts)})
		return errNoEntrypoint.Error(), nil
	}
	revision, bundles, err := activeRevision(ctx, m.Store, txn)
	if err != nil {
		return "", err
	}
	eng := decision.NewEmpty(opts)
	if err := eng.Prepare(ctx, revision, rego.Compiler(compiler), rego.Store(m.Store), rego.Transaction(txn), rego.Runtime(m.Info)); err != nil {
		return "", err
	}
	g.active.Store(&activePolicy{engine: eng, bundles: bundles})
	return "", nil
}

// activeRevision is the revision decisions carry: the manifest revision of the one bundle
// OPA has activated, "name=revision" pairs when there are several; when no bundle has a
// revision (policy files, a bundle without one), a digest of the policy modules.
func activeRevision(ctx context.Context, store storage.Store, txn storage.Transaction) (string, map[string]opaserver.BundleInfo, error) {
	bundles := map[string]opaserver.BundleInfo{}
	names, err := bundle.ReadBundleNamesFromStore(ctx, store, txn)
	if err != nil && !storage.IsNotFound(err) {
		return "", nil, fmt.Errorf("read the active bundles: %w", err)
	}
	slices.Sort(names)
	var pairs []string
	var single string
	for _, name := range names {
		rev, err := bundle.ReadBundleRevisionFromStore(ctx, store, txn, name)
		if err != nil && !storage.IsNotFound(err) {
			return "", nil, fmt.Errorf("read the revision of bundle %q: %w", name, err)
		}
		bundles[name] = opaserver.BundleInfo{Revision: rev}
		if rev != "" {
			pairs = append(pairs, name+"="+rev)
			single = rev
		}
	}
	switch {
	case len(pairs) == 1:
		return single, bundles, nil
	case len(pairs) > 1:
		return strings.Join(pairs, ","), bundles, nil
	}
	ids, err := store.ListPolicies(ctx, txn)
	if err != nil {
		return "", nil, fmt.Errorf("list the active policies: %w", err)
	}
	modules := make(map[string]string, len(ids))
	for _, id := range ids {
		src, err := store.GetPolicy(ctx, txn, id)
		if err != nil {
			return "", nil, fmt.Errorf("read policy %s: %w", id, err)
		}
		modules[id] = string(src)
	}
	return decision.ModulesRevision(modules), bundles, nil
}

// Revision implements server.Decider: the prepared policy's revision, "" while none is.
func (g *gate) Revision() string { return g.active.Load().engine.Revision() }

// Decide implements server.Decider with the prepared policy: a decision that has begun ends
// on the policy it began with.
func (g *gate) Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	return g.active.Load().engine.Decide(ctx, req, facts)
}

// DecisionLogs implements server.OPADecisionLogger: whether OPA has decision_logs configured.
func (g *gate) DecisionLogs() bool { return logs.Lookup(g.m) != nil }

// LogDecision implements server.OPADecisionLogger: the server hands it every decision it
// answered, masked like its own log, as it does in `authz serve`. The bundles recorded are
// those of the active policy when it is the one that decided.
func (g *gate) LogDecision(ctx context.Context, d policy.Decision) error {
	lp := logs.Lookup(g.m)
	if lp == nil {
		return nil
	}
	if pol := g.active.Load(); pol.engine.Revision() == d.Revision {
		d.Bundles = pol.bundles
	}
	return policy.LogToOPA(ctx, lp, d)
}
