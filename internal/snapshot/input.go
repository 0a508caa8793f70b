package snapshot

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/authz-dev/authz/internal/tracing"
)

// Input is the document the policy decides on; docs/input-document.md describes every field.
type Input map[string]any

// Options tune Build. The zero value is usable.
type Options struct {
	// Now is the clock passed to the policy as now_ns; time.Now when nil.
	Now func() time.Time
	// ConfigTimeout bounds the driver's config check; no extra bound when zero (ctx still applies).
	ConfigTimeout time.Duration
}

// Build assembles the input document of one decision from a checked request and the facts as they
// are now. It never fails: what cannot be looked up is left out, and the policy denies on it.
func Build(ctx context.Context, req *Request, facts Facts, opts Options) Input {
	in, _ := BuildParsed(ctx, req, facts, opts)
	return in
}

// BuildParsed is Build, and also returns what makes input.facts as OPA reads it (Facts.Value),
// for an evaluator that hands OPA a parsed input: the plugin record and the worker are
// converted once per facts generation (PluginIndex, NewWorker) rather than once per decision.
// Nothing is converted until Value is called.
func BuildParsed(ctx context.Context, req *Request, facts Facts, opts Options) (Input, ParsedFacts) {
	ctx, span := tracing.Start(ctx, tracing.SpanInput)
	defer span.End()
	r := resolve(req)
	factsDoc, plugin, worker, rec := lookUpFacts(facts, r)
	configFailed := checkConfig(ctx, req, facts, r, plugin, worker, opts.ConfigTimeout)
	// Last, after its methods were read and its config checked: is the worker still running?
	// A decision on a generation that has ended carries no worker, so the policy denies
	// (worker_not_running) however recently the process died.
	if worker != nil && !worker.Alive() {
		delete(factsDoc, "worker")
		configFailed = false
	}
	return assemble(req, r, factsDoc, configFailed, opts.Now), ParsedFacts{doc: factsDoc, worker: worker, rec: rec}
}

// ParsedFacts makes the input's facts as OPA reads them; the zero value makes nothing.
type ParsedFacts struct {
	doc    map[string]any
	worker *Worker
	rec    *rendered
}

// Value is input.facts as OPA reads it, equal to ast.InterfaceToValue(in["facts"]) of the input
// BuildParsed returned with it; nil for the zero ParsedFacts or when a part cannot be converted
// (the caller then converts in["facts"] itself, and fails as it would have). It is shared: do
// not modify it.
func (p ParsedFacts) Value() ast.Value {
	if p.doc == nil {
		return nil
	}
	return parsedFacts(p.doc, p.worker, p.rec)
}

// parsedFacts is factsDoc as OPA reads it, taking the parsed forms of the plugin record (rec,
// when factsDoc carries its document) and of the worker from where they were converted once;
// nil when a part cannot be converted.
func parsedFacts(factsDoc map[string]any, worker *Worker, rec *rendered) ast.Value {
	var room [3][2]*ast.Term
	items := room[:0]
	for k, doc := range factsDoc {
		var v ast.Value
		switch {
		case k == "plugin" && rec != nil:
			v = rec.parsed()
		case k == "worker" && worker != nil && worker.value != nil:
			v = worker.value
		default:
			v, _ = ast.InterfaceToValue(doc)
		}
		if v == nil {
			return nil
		}
		items = append(items, [2]*ast.Term{ast.InternedTerm(k), ast.NewTerm(v)})
	}
	return ast.NewObject(items...)
}

// resolved is what a request names: the driver, the provider key and the plugin to consult.
// Each name is a non-empty string or "", held as an any as the request holds it, so that the
// input document carries it without boxing it again; text reads it as a string.
type resolved struct {
	driver, providerKey, pluginID, driverKey any
	pluginBacked                             bool
}

// resolve reads the driver, provider key, plugin and driver key from the lease metadata, falling
// back on the environment: the driver defaults to "sandbox", and the provider key of a sandbox
// environment is its config's provider.
func resolve(req *Request) resolved {
	md := req.Metadata
	r := resolved{
		driver:       nonEmpty(md["driver"]),
		providerKey:  nonEmpty(md["provider"]),
		pluginBacked: md["sandboxProviderPlugin"] == true,
		pluginID:     nonEmpty(md["pluginId"]),
		driverKey:    nonEmpty(md["driverKey"]),
	}
	if r.driver == "" {
		r.driver = nonEmpty(req.Environment["driver"])
	}
	if r.driver == "" {
		r.driver = "sandbox"
	}
	if r.providerKey == "" && req.Environment["driver"] == "sandbox" {
		if cfg, ok := req.Environment["config"].(map[string]any); ok {
			r.providerKey = nonEmpty(cfg["provider"])
		}
	}
	return r
}

// lookUpFacts reads the facts the request names: the plugin record and its worker (from one
// snapshot of one generation) and the built-in provider.
func lookUpFacts(facts Facts, r resolved) (factsDoc, plugin map[string]any, worker *Worker, rec *rendered) {
	factsDoc = map[string]any{}
	if r.pluginID != "" {
		if p, ok := facts.Plugin(text(r.pluginID)); ok && p.Record != nil {
			plugin = p.Record
			// The policy reads only the manifest entries whose driverKey is the key it looks
			// up (the provider key, or the lease's driverKey on the plugin driver): the input
			// carries those, all of them and in manifest order, and none of the others.
			idx := p.Index
			if idx == nil {
				idx = NewPluginIndex(p.Record)
			}
			factsDoc["plugin"], rec = idx.forRendered(text(r.providerKey), text(r.driverKey))
			if p.Worker != nil {
				worker = p.Worker
				factsDoc["worker"] = worker.Document()
			}
		}
	}
	if r.providerKey != "" {
		if b, ok := facts.BuiltinProvider(text(r.providerKey)); ok {
			factsDoc["builtinProvider"] = b
		}
	}
	return factsDoc, plugin, worker, rec
}

// consultsConfigCheck reports whether the decision consults the driver's config check: on the
// plugin-backed sandbox path with a ready plugin and a worker.
func consultsConfigCheck(r resolved, plugin map[string]any, worker *Worker) bool {
	return r.driver == "sandbox" && r.pluginBacked && r.providerKey != "" && worker != nil && plugin["status"] == "ready"
}

// ConfigCheckPreparer is implemented by facts whose config check may wait on a driver (the plugin
// host), so that a caller can wait for the check before it assembles the input, holding neither
// the request nor anything that grows with it.
type ConfigCheckPreparer interface {
	// PrepareConfigCheck returns the wait for the check ConfigValid would make with these
	// arguments (it makes the check, or joins the same check in progress) and its answer, or
	// nil when ConfigValid would answer at once.
	PrepareConfigCheck(pluginID string, w *Worker, driverKey string, config any) func(ctx context.Context) (bool, error)
}

// ConfigCheckAnswerer is implemented by facts that can say, in one call, either the answer of
// the config check ConfigValid would make (when it is at hand: kept, or needing no driver) or the
// wait for it, so that a decision asks its check once.
type ConfigCheckAnswerer interface {
	// AnswerConfigCheck returns the wait PrepareConfigCheck would return with these arguments;
	// when that is nil, valid and err are the answer ConfigValid would give now.
	AnswerConfigCheck(pluginID string, w *Worker, driverKey string, config any) (wait func(ctx context.Context) (bool, error), valid bool, err error)
}

// ConfigCheckAhead is PendingConfigCheck that also carries an answer at hand: when facts answer
// the check at once (ConfigCheckAnswerer), it returns no wait and facts that hold that answer,
// so that Build does not ask for it again; otherwise the wait PendingConfigCheck returns (nil
// when there is none) and facts unchanged. A decision asks its config check once either way.
func ConfigCheckAhead(req *Request, facts Facts) (wait func(ctx context.Context) Facts, at Facts) {
	a, ok := facts.(ConfigCheckAnswerer)
	if !ok {
		return PendingConfigCheck(req, facts), facts
	}
	r := resolve(req)
	if r.pluginID == "" {
		return nil, facts
	}
	pluginID, driverKey := text(r.pluginID), text(r.providerKey)
	pf, ok := facts.Plugin(pluginID)
	if !ok || !consultsConfigCheck(r, pf.Record, pf.Worker) {
		return nil, facts
	}
	generation := pf.Worker.Generation
	w, valid, err := a.AnswerConfigCheck(pluginID, pf.Worker, driverKey, req.Environment["config"])
	if w == nil {
		return nil, &checkedFacts{Facts: facts, pluginID: pluginID, generation: generation, driverKey: driverKey, valid: valid, err: err}
	}
	return func(ctx context.Context) Facts {
		valid, err := w(ctx)
		return &checkedFacts{Facts: facts, pluginID: pluginID, generation: generation, driverKey: driverKey, valid: valid, err: err}
	}, facts
}

// PendingConfigCheck returns the wait for the config check Build would make for req when facts
// would have to ask a driver for it (see ConfigCheckPreparer), or nil when Build consults no
// config check or its answer is at hand. The wait holds nothing of req. It returns facts that
// answer that check as the wait found it, for a Build of the same request (decoded again from
// the same body): its config is the one checked, so the check is not made twice.
func PendingConfigCheck(req *Request, facts Facts) func(ctx context.Context) Facts {
	p, ok := facts.(ConfigCheckPreparer)
	if !ok {
		return nil
	}
	r := resolve(req)
	if r.pluginID == "" {
		return nil
	}
	pluginID, driverKey := text(r.pluginID), text(r.providerKey)
	pf, ok := facts.Plugin(pluginID)
	if !ok || !consultsConfigCheck(r, pf.Record, pf.Worker) {
		return nil
	}
	wait := p.PrepareConfigCheck(pluginID, pf.Worker, driverKey, req.Environment["config"])
	if wait == nil {
		return nil
	}
	generation := pf.Worker.Generation
	return func(ctx context.Context) Facts {
		valid, err := wait(ctx)
		return &checkedFacts{Facts: facts, pluginID: pluginID, generation: generation, driverKey: driverKey, valid: valid, err: err}
	}
}

// checkedFacts are facts with the answer of one config check at hand: the check of one
// request, asked of the same plugin, worker generation and driver key.
type checkedFacts struct {
	Facts
	pluginID   string
	generation uint64
	driverKey  string
	valid      bool
	err        error
}

// ConfigValid implements Facts: the answer at hand for the check it holds; any other check
// (another worker generation, say) is asked of the facts.
func (f *checkedFacts) ConfigValid(ctx context.Context, pluginID string, w *Worker, driverKey string, config any) (bool, error) {
	if pluginID == f.pluginID && w != nil && w.Generation == f.generation && driverKey == f.driverKey {
		return f.valid, f.err
	}
	return f.Facts.ConfigValid(ctx, pluginID, w, driverKey, config)
}

// checkConfig reports whether the driver's config check failed (an error or "not valid"). The
// config check is the one fact that may cost a call into a driver: it is asked only where the
// decision consults it (consultsConfigCheck).
func checkConfig(ctx context.Context, req *Request, facts Facts, r resolved, plugin map[string]any, worker *Worker, timeout time.Duration) bool {
	if !consultsConfigCheck(r, plugin, worker) {
		return false
	}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	cctx, span := tracing.Start(cctx, tracing.SpanConfigCheck)
	ok, err := facts.ConfigValid(cctx, text(r.pluginID), worker, text(r.providerKey), req.Environment["config"])
	tracing.EndConfigCheck(span, text(r.pluginID), text(r.providerKey), ok, err)
	return err != nil || !ok
}

// assemble writes the input document.
func assemble(req *Request, r resolved, factsDoc map[string]any, configFailed bool, now func() time.Time) Input {
	if now == nil {
		now = time.Now
	}
	md := req.Metadata
	lease := req.Lease
	if _, ok := lease["metadata"]; !ok {
		lease = shallowWith(lease, "metadata", md)
	}
	in := Input{
		"operation":   operationValue(req.Operation),
		"environment": req.Environment,
		"lease":       lease,
		"now_ns":      now().UnixNano(),
		"resolved": map[string]any{
			"driver":       r.driver,
			"providerKey":  r.providerKey,
			"pluginBacked": r.pluginBacked,
			"pluginId":     r.pluginID,
			"driverKey":    r.driverKey,
		},
		"facts":     factsDoc,
		"narrowing": narrowing(req, configFailed),
	}
	if req.HasCommand {
		in["command"] = req.Command
	}
	return in
}

// narrowing computes input.narrowing (docs/input-document.md): the one Go list of the narrowing
// flags, each from the request or the config check. NarrowingFlags derive from its keys, and a
// test fails when they and the policy's narrowing_flags (policies/authz/tables) disagree. Adding a
// flag needs a release: a line here, the flag in narrowing_flags, and in the narrowedBy of the
// capabilities it removes.
func narrowing(req *Request, configFailed bool) map[string]any {
	md := req.Metadata
	return map[string]any{
		"leasePolicyNotReusable": req.Lease["leasePolicy"] != "reuse_by_environment",
		"nativeSyncUnavailable":  md["backend"] == "job" || md["nativeFileSyncUnsupported"] == true,
		"configResolutionFailed": configFailed,
	}
}

// NarrowingFlags are the names of the flags of input.narrowing, sorted. Read it; never change it.
var NarrowingFlags = slices.Sorted(maps.Keys(narrowing(&Request{}, false)))

// nonEmpty returns v when it is a string of length at least one, else "".
func nonEmpty(v any) any {
	if s, _ := v.(string); s != "" {
		return v
	}
	return ""
}

// text is a name of resolved as a string ("" when absent).
func text(v any) string {
	s, _ := v.(string)
	return s
}

// operationValue is op as an any; the two operations need no allocation.
func operationValue(op string) any {
	switch op {
	case OpOpenDuplexChannel:
		return OpOpenDuplexChannel
	case OpGetRunnerIngressEndpoint:
		return OpGetRunnerIngressEndpoint
	}
	return op
}

func shallowWith(m map[string]any, k string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for mk, mv := range m {
		out[mk] = mv
	}
	out[k] = v
	return out
}
