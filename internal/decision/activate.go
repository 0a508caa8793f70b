package decision

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"

	"github.com/authz-dev/authz/internal/coded"
)

// entrypointRef is Query as a reference, for the check that a policy defines it.
var entrypointRef = ast.MustParseRef(Query)

// Policy is a compiled and checked policy (modules and data) that an Engine can activate. It is
// immutable: its data lives in a store of its own that nothing writes after Compile, so the
// decisions of one activation never see the data of another, and a cached decision of one
// activation never answers for another.
type Policy struct {
	revision string
	compiler *ast.Compiler
	store    storage.Store
	reads    inputReads
	consts   *constants // its literal rules, handed to OPA evaluated (nil: none)
}

// Revision is the revision the policy is activated under.
func (p *Policy) Revision() string { return p.revision }

// CompileModules compiles parsed modules with data (the base documents below data; nil for
// none) into a Policy under revision, which must not be empty. It fails (coded.PolicyCompile) when the
// modules do not compile, when a rule and the data claim the same path, or when the policy does
// not define the entrypoint Query. Call it off the hot path: decisions go on meanwhile.
func CompileModules(modules map[string]*ast.Module, data map[string]any, revision string) (*Policy, error) {
	if revision == "" {
		return nil, coded.Errorf(coded.PolicyCompile, "a policy needs a revision")
	}
	store, err := snapshotStore(data)
	if err != nil {
		return nil, &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("data of revision %s: %w", revision, err)}
	}
	c := ast.NewCompiler().WithPathConflictsCheck(dataPathExists(data))
	if c.Compile(modules); c.Failed() {
		return nil, &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("compile (revision %s): %w", revision, c.Errors)}
	}
	return checkedPolicy(c, store, revision)
}

// EmbeddedPolicy compiles the policy built into the binary (policies/) under its
// ContentRevision, the revision `authz version` prints.
func EmbeddedPolicy() (*Policy, error) {
	mods, err := policiesModules()
	if err != nil {
		return nil, &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("read the embedded policy: %w", err)}
	}
	revision := ContentRevision(mods)
	parsed := make(map[string]*ast.Module, len(mods))
	for name, src := range mods {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{ProcessAnnotation: true})
		if err != nil {
			return nil, &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("parse %s (revision %s): %w", name, revision, err)}
		}
		parsed[name] = m
	}
	return CompileModules(parsed, nil, revision)
}

// CompiledPolicy makes a Policy from a compiler that has already compiled its modules (the
// plugin manager's, after it activated a bundle) and a copy of the data the bundle brought. The
// compiler must not be changed afterwards (the plugin manager makes a new one per activation).
func CompiledPolicy(c *ast.Compiler, data map[string]any, revision string) (*Policy, error) {
	if revision == "" {
		return nil, coded.Errorf(coded.PolicyCompile, "a policy needs a revision")
	}
	if c == nil || c.Failed() {
		return nil, coded.Errorf(coded.PolicyCompile, "revision %s has no compiled policy", revision)
	}
	store, err := snapshotStore(data)
	if err != nil {
		return nil, &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("data of revision %s: %w", revision, err)}
	}
	return checkedPolicy(c, store, revision)
}

func checkedPolicy(c *ast.Compiler, store storage.Store, revision string) (*Policy, error) {
	if len(c.GetRulesExact(entrypointRef)) == 0 {
		return nil, coded.Errorf(coded.PolicyCompile, "revision %s does not define %s: a policy for authz must define the rule decision in package authz", revision, Query)
	}
	return &Policy{revision: revision, compiler: c, store: store, reads: analyzeInputReads(c.Modules), consts: findConstants(c)}, nil
}

// Activate prepares the entrypoint of p and makes p the current policy. Decisions in flight
// finish on the policy they started with; later ones use p. A failed prepare keeps the current
// policy. Decisions of p are cached when its modules allow it (see Options.Cache): its data
// cannot change, and each activation keys its own cache entries.
func (e *Engine) Activate(ctx context.Context, p *Policy) error {
	if p == nil {
		return coded.Errorf(coded.PolicyCompile, "no policy to activate")
	}
	return e.prepare(ctx, p.revision, p.reads, p.consts, rego.Compiler(p.compiler), rego.Store(p.store))
}

// snapshotStore copies data (a JSON-shaped document) into a store of its own. The store holds
// it as AST values, converted once here rather than on every read by every decision.
func snapshotStore(data map[string]any) (storage.Store, error) {
	if data == nil {
		return inmem.NewWithOpts(inmem.OptReturnASTValuesOnRead(true)), nil
	}
	b, err := json.Marshal(data)
	if err != nil {
		return nil, err
	}
	var cp map[string]any
	if err := util.UnmarshalJSON(b, &cp); err != nil {
		return nil, err
	}
	return inmem.NewFromObjectWithOpts(cp, inmem.OptReturnASTValuesOnRead(true)), nil
}

// dataPathExists reports whether data holds a value at path (for the compiler's check that a
// rule and the data do not claim the same document).
func dataPathExists(data map[string]any) func([]string) (bool, error) {
	return func(path []string) (bool, error) {
		var cur any = data
		for _, k := range path {
			m, ok := cur.(map[string]any)
			if !ok {
				return false, nil
			}
			if cur, ok = m[k]; !ok {
				return false, nil
			}
		}
		return true, nil
	}
}
