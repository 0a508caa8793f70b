// Package decision evaluates the input document of internal/snapshot with the Rego policy and
// turns the result into a decision document, failing closed on every path that is not exactly one
// well-formed result.
package decision

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/changes"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/tracing"
	"github.com/authz-dev/authz/policies"
)

// policiesModules returns the embedded policy.
var policiesModules = policies.Modules

// Query is the entrypoint every policy must define.
const Query = "data.authz.decision"

// Options tune an Engine. The zero value is usable.
type Options struct {
	// EvalTimeout bounds one evaluation (input assembly included); none when zero.
	EvalTimeout time.Duration
	// ConfigCheckTimeout bounds the driver's config check inside the input assembly.
	ConfigCheckTimeout time.Duration
	// Now is the clock handed to the policy; time.Now when nil.
	Now func() time.Time
	// MaxConcurrent bounds the decisions evaluated at once; the others wait their turn in
	// arrival order (bounded by EvalTimeout and their context). Evaluation is CPU-bound, so more
	// decisions in flight than cores only add latency; no bound when zero.
	MaxConcurrent int
	// Cache bounds the decision cache, which is on unless Cache.Disabled. A decision is taken
	// from the cache only when its policy (Activate) calls no non-deterministic or impure builtin, and reads input only at constant paths; the key is
	// the input projected onto those paths, so any change the policy could see is a new key.
	Cache CacheOptions
}

// Engine evaluates decisions. It is safe for concurrent use; the prepared query is replaced
// atomically when a new policy revision is loaded, and in-flight decisions finish on the old one.
type Engine struct {
	opts  Options
	cur   atomic.Pointer[prepared]
	slots chan struct{}  // nil: no bound on concurrent decisions
	cache *decisionCache // nil: off by option
	gens  atomic.Uint64  // counts prepared policies; each keys its own cache entries

	activated changes.Listeners[string] // told the revision of every policy made current
}

type prepared struct {
	query    rego.PreparedEvalQuery
	revision string
	gen      uint64
	// reads is what the policy can read of input; uncacheable says when its decisions are not
	// cached (and the input is then handed to OPA whole).
	reads inputReads
	// consts are the policy's literal rules, handed to OPA with their values (nil: none, or
	// a policy prepared with caller options, whose rules are not known here).
	consts *constants
}

// New returns an engine with no policy: every decision denies with coded.EvalNoPolicy until
// Activate makes a Policy current (EmbeddedPolicy, CompileModules or CompiledPolicy).
func New(opts Options) *Engine {
	e := &Engine{opts: opts}
	if opts.MaxConcurrent > 0 {
		e.slots = make(chan struct{}, opts.MaxConcurrent)
	}
	if !opts.Cache.Disabled {
		e.cache = newDecisionCache(opts.Cache)
	}
	return e
}

func (e *Engine) prepare(ctx context.Context, revision string, reads inputReads, consts *constants, opts ...func(*rego.Rego)) error {
	opts = append(slices.Clip(opts), rego.Query(Query))
	pq, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("prepare %s (revision %s): %w", Query, revision, err)}
	}
	e.cur.Store(&prepared{query: pq, revision: revision, gen: e.gens.Add(1), reads: reads, consts: consts})
	if e.cache != nil {
		e.cache.purge()
	}
	e.activated.Notify(revision)
	return nil
}

// CacheStatus says why decisions of the current policy are not cached; "" when they are.
func (e *Engine) CacheStatus() string {
	p := e.cur.Load()
	switch {
	case e.cache == nil:
		return "the decision cache is turned off"
	case p == nil:
		return "no policy is loaded"
	}
	return p.reads.uncacheable
}

// CacheStats returns the decision cache's counters (all zero when it is off).
func (e *Engine) CacheStats() CacheStats {
	if e.cache == nil {
		return CacheStats{}
	}
	return e.cache.stats()
}

// Revision returns the revision of the current policy ("" when none is loaded).
func (e *Engine) Revision() string {
	if p := e.cur.Load(); p != nil {
		return p.revision
	}
	return ""
}

// Decide assembles the input of one decision and evaluates it. It always returns a decision
// document; a non-nil error (an *Error) means the decision could not be evaluated and the
// document is the fail-closed deny of FailedDocument.
func (e *Engine) Decide(ctx context.Context, req *snapshot.Request, facts snapshot.Facts) (Document, snapshot.Input, error) {
	if e.opts.EvalTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.opts.EvalTimeout)
		defer cancel()
	}
	in, parsed := snapshot.BuildParsed(ctx, req, facts, snapshot.Options{Now: e.opts.Now, ConfigTimeout: e.opts.ConfigCheckTimeout})
	ectx, span := tracing.Start(ctx, tracing.SpanEvaluate)
	doc, err := e.decideInput(ectx, in, parsed, true)
	tracing.End(span, err)
	return doc, in, err
}

// Evaluate evaluates an assembled input document. Like Decide, it always returns a document.
func (e *Engine) Evaluate(ctx context.Context, in snapshot.Input) (Document, error) {
	return e.decideInput(ctx, in, snapshot.ParsedFacts{}, false)
}

// decideInput answers from the cache when it holds the decision, else evaluates (waiting for a
// slot when slot is set) and caches a well-formed result. Every answer gets a fresh decision id.
// parsed makes in["facts"] as OPA reads it when in comes from snapshot.BuildParsed (the zero
// value otherwise); it is used only when the decision is evaluated.
func (e *Engine) decideInput(ctx context.Context, in snapshot.Input, parsed snapshot.ParsedFacts, slot bool) (Document, error) {
	op, _ := in["operation"].(string)
	p := e.cur.Load()
	var key [32]byte
	cacheable := false
	if e.cache != nil && p != nil && p.reads.uncacheable == "" {
		key, cacheable = p.reads.key(p.gen, in)
	}
	doc, err, hit := Document{}, error(nil), false
	if cacheable {
		if err = ctxErr(ctx); err == nil {
			doc, hit = e.cache.get(key)
		}
	}
	if !hit && err == nil {
		// Only the evaluation takes a slot: the input assembly may wait on a driver's config
		// check, which must not hold up decisions on other drivers.
		if slot && e.slots != nil {
			select {
			case e.slots <- struct{}{}:
				defer func() { <-e.slots }()
			case <-ctx.Done():
			}
		}
		doc, err = e.evaluate(ctx, p, in, parsed, op)
		if err == nil && cacheable {
			e.cache.put(key, doc)
		}
	}
	if err != nil {
		doc = FailedDocument(op)
	}
	doc.DecisionID = NewDecisionID()
	if p != nil {
		doc.Revision = p.revision
	}
	return doc, err
}

// NewDecisionID returns a fresh decision id: a random (version 4) UUID in its string form, as
// uuid.NewString does, with one allocation (the string) instead of two. Every decision id of
// the service is made here.
func NewDecisionID() string {
	var u uuid.UUID
	_, _ = rand.Read(u[:])      // crypto/rand.Read never fails: the program crashes instead
	u[6] = (u[6] & 0x0f) | 0x40 // version 4
	u[8] = (u[8] & 0x3f) | 0x80 // variant RFC 9562
	return u.String()
}

func (e *Engine) evaluate(ctx context.Context, p *prepared, in snapshot.Input, parsed snapshot.ParsedFacts, op string) (Document, error) {
	if p == nil {
		return Document{}, coded.Errorf(coded.EvalNoPolicy, "no policy is loaded: start with the embedded policy or a bundle")
	}
	if err := ctxErr(ctx); err != nil {
		return Document{}, err
	}
	val, err := ast.InterfaceToValue(p.reads.prune(in, parsed.Value()))
	if err != nil {
		return Document{}, &coded.Error{Code: coded.EvalBadInput, Err: err}
	}
	var rs rego.ResultSet
	if p.consts != nil {
		rs, err = p.query.Eval(ctx, rego.EvalParsedInput(val), noMetrics, rego.EvalVirtualCache(newConstantsCache(p.consts)))
	} else {
		rs, err = p.query.Eval(ctx, rego.EvalParsedInput(val), noMetrics)
	}
	if err != nil {
		if cerr := ctxErr(ctx); cerr != nil {
			return Document{}, cerr
		}
		return Document{}, &coded.Error{Code: coded.EvalError, Err: err}
	}
	if err := ctxErr(ctx); err != nil {
		return Document{}, err
	}
	return readResultSet(rs)
}

// noMetrics has an evaluation keep no metrics: nothing reads them, and rego would make a fresh
// set of them for every evaluation (BenchmarkDecide: 6 allocations and 0.5 KiB fewer without).
var noMetrics = rego.EvalMetrics(metrics.NoOp())

// readResultSet accepts exactly one result with one expression whose value is a decision.
func readResultSet(rs rego.ResultSet) (Document, error) {
	switch {
	case len(rs) == 0:
		return Document{}, coded.Errorf(coded.EvalUndefined, "%s is undefined for this input", Query)
	case len(rs) > 1:
		return Document{}, coded.Errorf(coded.EvalMultipleResults, "%s produced %d results, want 1", Query, len(rs))
	case len(rs[0].Expressions) != 1:
		return Document{}, coded.Errorf(coded.EvalBadResult, "%s produced %d expressions, want 1", Query, len(rs[0].Expressions))
	}
	return parseResult(rs[0].Expressions[0].Value)
}

// ctxErr maps a done context to its code: a deadline is a time-out, anything else a cancel.
func ctxErr(ctx context.Context) error {
	switch err := ctx.Err(); {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return &coded.Error{Code: coded.EvalTimeout, Err: err}
	default:
		return &coded.Error{Code: coded.EvalCanceled, Err: err}
	}
}

// parseResult reads the policy's result strictly: an object with a boolean allow, string code
// and message, an array of string reasons, and exactly the capabilities of api.CapabilityKeys as
// booleans (a capability this release does not know is a bad result, never dropped). Anything else
// is a bad result, and a bad result never grants.
func parseResult(v any) (Document, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result is %T, want an object", v)
	}
	var d Document
	if d.Allow, ok = obj["allow"].(bool); !ok {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result.allow is %T, want a boolean", obj["allow"])
	}
	if d.Code, ok = obj["code"].(string); !ok {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result.code is %T, want a string", obj["code"])
	}
	if d.Message, ok = obj["message"].(string); !ok {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result.message is %T, want a string", obj["message"])
	}
	reasons, ok := obj["reasons"].([]any)
	if !ok {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result.reasons is %T, want an array", obj["reasons"])
	}
	d.Reasons = make([]string, len(reasons))
	for i, r := range reasons {
		if d.Reasons[i], ok = r.(string); !ok {
			return Document{}, coded.Errorf(coded.EvalBadResult, "result.reasons[%d] is %T, want a string", i, r)
		}
	}
	caps, ok := obj["capabilities"].(map[string]any)
	if !ok {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result.capabilities is %T, want an object", obj["capabilities"])
	}
	if len(caps) != len(api.CapabilityKeys) {
		for k := range caps {
			if !api.IsCapability(k) {
				return Document{}, coded.Errorf(coded.EvalBadResult, "result.capabilities.%s is not a capability of this release (%v): adding a capability needs a release of authz", k, api.CapabilityKeys)
			}
		}
	}
	for _, k := range api.CapabilityKeys {
		b, ok := caps[k].(bool)
		if !ok {
			return Document{}, coded.Errorf(coded.EvalBadResult, "result.capabilities.%s is %T, want a boolean", k, caps[k])
		}
		d.Capabilities.Set(k, b)
	}
	if d.Allow && (d.Code != "" || d.Message != "" || len(d.Reasons) != 0) {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result grants but carries a deny code, message or reasons")
	}
	if !d.Allow && d.Code == "" {
		return Document{}, coded.Errorf(coded.EvalBadResult, "result denies without a code")
	}
	return d, nil
}
