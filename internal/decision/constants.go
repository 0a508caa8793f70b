package decision

import (
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// constants are the rules of a policy whose value is a literal: the one definition of its
// document, with no arguments, no else, no condition, and a value with no reference, call,
// variable or comprehension in it (the policy's tables, data.authz.tables). OPA evaluates such a
// rule again in every query (it builds the literal, 200 allocations for the capability table);
// the engine hands OPA its value instead, made once per activation. The value is the rule's own
// literal, so a decision cannot differ.
type constants struct {
	refs  []ast.Ref
	terms []*ast.Term
}

// findConstants returns the literal rules of the compiled policy; nil when there are none.
func findConstants(c *ast.Compiler) *constants {
	var k constants
	for _, m := range c.Modules {
		for _, r := range m.Rules {
			ref := r.Ref()
			if !literalRule(r) || !ref.IsGround() || len(c.GetRulesExact(ref)) != 1 || k.get(ref) != nil {
				continue
			}
			k.refs = append(k.refs, ref)
			k.terms = append(k.terms, r.Head.Value)
		}
	}
	if len(k.refs) == 0 {
		return nil
	}
	return &k
}

// literalRule reports whether r is `name := literal` (or `name = literal`): a single-value rule
// that is not a default, without arguments, else or condition, whose value is ground and holds
// no reference, call or comprehension.
func literalRule(r *ast.Rule) bool {
	if r.Default || r.Else != nil || len(r.Head.Args) != 0 || r.Head.Key != nil || r.Head.Value == nil ||
		r.Head.RuleKind() != ast.SingleValue || len(r.Body) != 1 || !r.Body[0].Equal(ast.NewExpr(ast.BooleanTerm(true))) {
		return false
	}
	literal := r.Head.Value.IsGround()
	ast.WalkTerms(r.Head.Value, func(t *ast.Term) bool {
		switch t.Value.(type) {
		case ast.Ref, ast.Call, ast.Var, *ast.ArrayComprehension, *ast.SetComprehension, *ast.ObjectComprehension, *ast.TemplateString:
			literal = false
		}
		return !literal
	})
	return literal
}

// get is the value of the literal rule at ref; nil when ref is not one.
func (k *constants) get(ref ast.Ref) *ast.Term {
	for i, r := range k.refs {
		if len(r) == len(ref) && r.Equal(ref) {
			return k.terms[i]
		}
	}
	return nil
}

// constantsCache is the virtual-document cache of one evaluation (OPA's own) that answers the
// literal rules from constants outside any `with` (a `with` may replace a rule or the data it
// reads, so inside one OPA evaluates as it would).
type constantsCache struct {
	topdown.VirtualCache
	k     *constants
	withs int // `with` frames open
}

func newConstantsCache(k *constants) *constantsCache {
	return &constantsCache{VirtualCache: topdown.NewVirtualCache(), k: k}
}

// Push implements topdown.VirtualCache: a `with` begins.
func (c *constantsCache) Push() {
	c.withs++
	c.VirtualCache.Push()
}

// Pop implements topdown.VirtualCache: a `with` ends.
func (c *constantsCache) Pop() {
	c.withs--
	c.VirtualCache.Pop()
}

// Get implements topdown.VirtualCache.
func (c *constantsCache) Get(ref ast.Ref) (*ast.Term, bool) {
	if c.withs == 0 {
		if t := c.k.get(ref); t != nil {
			return t, false
		}
	}
	return c.VirtualCache.Get(ref)
}
