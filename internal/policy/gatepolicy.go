package policy

import (
	"context"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
)

// GateContent is the content of the gate's bundle only (the other bundles are OPA's): what
// `authz serve`'s sources and `authz run`'s gate compile into the gate's policy.
type GateContent struct {
	// Modules are the gate bundle's modules by path, compiled by CompileGate. Nil (not empty):
	// Compiled has compiled them already.
	Modules map[string]*ast.Module
	// Compiled is the compiler that compiled the gate bundle's modules when Modules is nil
	// (OPA's, when the gate's bundle is the only one in OPA's store); it must not be changed
	// afterwards. Nil too: there is no compiled policy (coded.PolicyCompile).
	Compiled *ast.Compiler
	// Data are the base documents of the gate's bundle (nil: none); they are copied.
	Data map[string]any
	// Revision is what the policy is activated under; Origin is where it comes from
	// (Status.Origin).
	Revision, Origin string
}

// GatePolicy is the gate's policy compiled and checked, with its origin: the one thing either
// face activates on a decision.Engine (ActivateOn). When each face activates stays its own:
// `authz serve`'s remote source orders signed revisions first (remote.go), `authz run`'s gate
// follows OPA's activations (internal/opaplugin).
type GatePolicy struct {
	p      *decision.Policy
	origin string
}

// CompileGate compiles content into the gate's policy. It fails (coded.PolicyCompile) as
// decision.CompileModules does: the modules do not compile, a rule and the data claim the same
// path, or the entrypoint is missing.
func CompileGate(content GateContent) (*GatePolicy, error) {
	var (
		p   *decision.Policy
		err error
	)
	if content.Modules == nil {
		p, err = decision.CompiledPolicy(content.Compiled, content.Data, content.Revision)
	} else {
		p, err = decision.CompileModules(content.Modules, content.Data, content.Revision)
	}
	if err != nil {
		return nil, err
	}
	return &GatePolicy{p: p, origin: content.Origin}, nil
}

// Revision is the revision the policy is activated under.
func (g *GatePolicy) Revision() string { return g.p.Revision() }

// Activation is what ActivateOn made active: the policy's revision, its origin, and when.
type Activation struct {
	Revision, Origin string
	At               time.Time
}

// ActivateOn makes g the policy of eng (decision.Engine.Activate: decisions in flight finish on
// the policy they began with; a failed prepare keeps eng's policy) and says what became active.
func (g *GatePolicy) ActivateOn(ctx context.Context, eng *decision.Engine) (Activation, error) {
	if g == nil {
		return Activation{}, coded.Errorf(coded.PolicyCompile, "no policy to activate")
	}
	if err := eng.Activate(ctx, g.p); err != nil {
		return Activation{}, err
	}
	return Activation{Revision: g.p.Revision(), Origin: g.origin, At: time.Now().UTC()}, nil
}
