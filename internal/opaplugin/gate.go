package opaplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
	"github.com/open-policy-agent/opa/v1/plugins"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/open-policy-agent/opa/v1/rego"
	opaserver "github.com/open-policy-agent/opa/v1/server"
	"github.com/open-policy-agent/opa/v1/storage"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/snapshot"
)

// decisionLogPath is the path of the gate's decisions in OPA's decision log.
const decisionLogPath = "authz/decision"

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
	// mask masks what OPA's decision log records as decisionLog.mask masks the gate's own.
	mask server.Masker
}

// activePolicy is one prepared policy and the bundles it came from.
type activePolicy struct {
	engine  *decision.Engine
	bundles map[string]opaserver.BundleInfo
}

var _ server.Decider = (*gate)(nil)

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

// Decide implements server.Decider with the prepared policy (a decision that has begun ends
// on the policy it began with), and records the decision in OPA's decision log when OPA has
// one configured (decision_logs).
func (g *gate) Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (decision.Document, snapshot.Input, error) {
	start := time.Now()
	pol := g.active.Load()
	doc, in, err := pol.engine.Decide(ctx, req, facts)
	if lp := logs.Lookup(g.m); lp != nil {
		g.logDecision(context.WithoutCancel(ctx), lp, pol, start, req, doc, in, err)
	}
	return doc, in, err
}

// logDecision hands one decision to OPA's decision log: the document the gate answers (the
// fail-closed deny when the decision could not be evaluated), its input, revision and bundles.
// OPA's log is best effort (it buffers, uploads in batches and may drop); the decision stands
// whatever it does. The gate's own decisionLog, when required, is the one that holds answers
// back.
func (g *gate) logDecision(ctx context.Context, lp *logs.Plugin, pol *activePolicy, start time.Time, req *snapshot.Request, doc decision.Document, in snapshot.Input, evalErr error) {
	if evalErr != nil {
		failed := decision.FailedDocument(req.Operation)
		failed.DecisionID, failed.Revision = doc.DecisionID, doc.Revision
		doc = failed
	}
	if doc.Reasons == nil {
		doc.Reasons = []string{}
	}
	input, err := asJSONValue(in)
	var result any
	if err == nil {
		var masked any
		masked, doc = g.settings.Load().mask(input, doc)
		input = masked
		result, err = asJSONValue(doc)
	}
	if err != nil {
		g.m.Logger().WithFields(map[string]any{"decision_id": doc.DecisionID, "err": err}).Error("The gate's decision could not be written to the decision log.")
		return
	}
	info := &opaserver.Info{
		DecisionID: doc.DecisionID,
		Revision:   doc.Revision,
		Bundles:    pol.bundles,
		Path:       decisionLogPath,
		Timestamp:  start.UTC(),
		Input:      &input,
		Results:    &result,
		Error:      evalErr,
	}
	withTrace(ctx, info)
	if err := lp.Log(ctx, info); err != nil {
		g.m.Logger().WithFields(map[string]any{"decision_id": doc.DecisionID, "err": err}).Error("The gate's decision could not be written to the decision log.")
	}
}

// asJSONValue turns v into the plain JSON values OPA's decision log reads.
func asJSONValue(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	if err := dec.Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}
