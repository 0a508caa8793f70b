package policy

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"

	regoast "github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
)

// TestGatePolicyIsTheOneWayToActivate reads the shipped code of `authz serve`'s sources
// (internal/policy) and of `authz run`'s gate (internal/opaplugin): only CompileGate and
// EmbeddedGate may compile a policy (decision.CompileModules, CompiledPolicy, EmbeddedPolicy)
// and only GatePolicy.ActivateOn activate one on an engine (Engine.Activate, the only Activate
// with two arguments there), so both faces compile and activate the one way.
func TestGatePolicyIsTheOneWayToActivate(t *testing.T) {
	t.Parallel()
	compiles := map[string]bool{"CompileModules": true, "CompiledPolicy": true, "EmbeddedPolicy": true}
	gateFuncs := map[string]bool{"CompileGate": true, "EmbeddedGate": true, "ActivateOn": true}
	var found []string
	for _, dir := range []string{".", filepath.Join("..", "opaplugin")} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, dir)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fset := token.NewFileSet()
			file, err := parser.ParseFile(fset, f, nil, 0)
			require.NoError(t, err)
			ast.Inspect(file, func(n ast.Node) bool {
				if fd, ok := n.(*ast.FuncDecl); ok && dir == "." && gateFuncs[fd.Name.Name] {
					return false // the one way itself
				}
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				pkg, _ := sel.X.(*ast.Ident)
				if (pkg != nil && pkg.Name == "decision" && compiles[sel.Sel.Name]) || (sel.Sel.Name == "Activate" && len(call.Args) == 2) {
					found = append(found, fset.Position(call.Pos()).String()+": "+sel.Sel.Name)
				}
				return true
			})
		}
	}
	assert.Empty(t, found, "compile and activate the gate's policy through CompileGate (or EmbeddedGate) and GatePolicy.ActivateOn (gatepolicy.go)")
}

func TestCompileGateActivatesWithItsRevisionAndOrigin(t *testing.T) {
	t.Parallel()
	mod := regoast.MustParseModuleWithOpts("package authz\ndecision := {\"allow\": data.authz.open}\n", regoast.ParserOptions{})
	g, err := CompileGate(GateContent{Modules: map[string]*regoast.Module{"authz.rego": mod}, Data: map[string]any{"authz": map[string]any{"open": false}},
		Revision: "r1", Origin: OriginRemote + ":gate"})
	require.NoError(t, err)
	assert.Equal(t, "r1", g.Revision())
	eng := decision.New(decision.Options{})
	before := time.Now().UTC()
	a, err := g.ActivateOn(context.Background(), eng)
	require.NoError(t, err)
	assert.Equal(t, Activation{Revision: "r1", Origin: OriginRemote + ":gate", At: a.At}, a)
	assert.False(t, a.At.Before(before))
	assert.Equal(t, "r1", eng.Revision())

	// Neither modules nor a compiler: no policy, and the engine keeps its own.
	_, err = CompileGate(GateContent{Revision: "r2", Origin: OriginRemote + ":gate"})
	assert.Equal(t, coded.PolicyCompile, coded.CodeOf(err))
	var none *GatePolicy
	_, err = none.ActivateOn(context.Background(), eng)
	assert.Equal(t, coded.PolicyCompile, coded.CodeOf(err))
	assert.Equal(t, "r1", eng.Revision())
}
