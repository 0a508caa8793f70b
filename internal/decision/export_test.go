package decision

import (
	"context"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
)

// LoadModules compiles Rego modules (path → source), prepares the entrypoint and makes it the
// engine's policy, for tests: like Activate of CompileModules, but without its checks (a policy
// without the entrypoint loads). revision "" means ContentRevision of the modules.
func (e *Engine) LoadModules(ctx context.Context, modules map[string]string, revision string) error {
	if revision == "" {
		revision = ContentRevision(modules)
	}
	parsed := make(map[string]*ast.Module, len(modules))
	for name, src := range modules {
		m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{ProcessAnnotation: true})
		if err != nil {
			return &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("parse %s (revision %s): %w", name, revision, err)}
		}
		parsed[name] = m
	}
	c := ast.NewCompiler()
	if c.Compile(parsed); c.Failed() {
		return &coded.Error{Code: coded.PolicyCompile, Err: fmt.Errorf("compile (revision %s): %w", revision, c.Errors)}
	}
	return e.prepare(ctx, revision, analyzeInputReads(c.Modules), findConstants(c), rego.Compiler(c))
}

// Prepare prepares the entrypoint with caller rego options and makes it the engine's policy
// under revision, for tests. Its decisions are never cached: its store may change without a
// new revision.
func (e *Engine) Prepare(ctx context.Context, revision string, opts ...func(*rego.Rego)) error {
	return e.prepare(ctx, revision, inputReads{uncacheable: "the policy was prepared with caller options (its data may change)"}, nil, opts...)
}

// CacheStatus says why decisions of this policy would not be cached; "" when they would.
func (p *Policy) CacheStatus() string { return p.reads.uncacheable }

// embeddedEngine returns New(opts) with EmbeddedPolicy active, for the tests of this package
// (the other packages' tests use decisiontest.EmbeddedEngine).
func embeddedEngine(tb testing.TB, opts Options) *Engine {
	tb.Helper()
	p, err := EmbeddedPolicy()
	require.NoError(tb, err)
	e := New(opts)
	require.NoError(tb, e.Activate(tb.Context(), p))
	return e
}

// WithoutConstants makes the current policy evaluate its literal rules as OPA does, in every
// query, for a test that compares the two.
func (e *Engine) WithoutConstants() {
	p := *e.cur.Load()
	p.consts = nil
	e.cur.Store(&p)
}
