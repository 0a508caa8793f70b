package decision

import (
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/require"
)

// TestConstantsAnswerOnlyLiteralRules: only a rule that is the one literal definition of its
// document is taken as a constant, and a query answered with the constants gives what OPA gives
// without them, a `with` that replaces a constant or the data it sits beside included.
func TestConstantsAnswerOnlyLiteralRules(t *testing.T) {
	const src = `package p

table := {"a": {"x", "y"}, "b": [1, {"c": true}]}

computed := {"a": count(table.a)}

conditional := {"a": 1} if input.on

default defaulted := {"a": 1}

defaulted := {"a": 2} if input.on

two contains "a"

two contains "b"

fn(x) := {"a": x}

via_ref := table

replaced := x if {
	x := table with data.p.table as {"z": 1}
}

replaced_beside := x if {
	x := computed with data.p.table as {"a": {"only"}}
}

after_with := table if replaced

out := {
	"table": table,
	"computed": computed,
	"conditional": [x | x := conditional],
	"defaulted": defaulted,
	"two": two,
	"fn": fn(1),
	"via_ref": via_ref,
	"replaced": replaced,
	"replaced_beside": replaced_beside,
	"after_with": after_with,
}
`
	mod, err := ast.ParseModule("p.rego", src)
	require.NoError(t, err)
	c := ast.NewCompiler()
	c.Compile(map[string]*ast.Module{"p.rego": mod})
	require.False(t, c.Failed(), c.Errors)
	k := findConstants(c)
	require.NotNil(t, k)
	var refs []string
	for _, r := range k.refs {
		refs = append(refs, r.String())
	}
	require.ElementsMatch(t, []string{"data.p.table"}, refs)

	pq, err := rego.New(rego.Compiler(c), rego.Query("data.p.out")).PrepareForEval(t.Context())
	require.NoError(t, err)
	for _, in := range []ast.Value{ast.NewObject(), ast.MustParseTerm(`{"on": true}`).Value} {
		want, err := pq.Eval(t.Context(), rego.EvalParsedInput(in))
		require.NoError(t, err)
		got, err := pq.Eval(t.Context(), rego.EvalParsedInput(in), rego.EvalVirtualCache(newConstantsCache(k)))
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.Len(t, got, 1)
		out := got[0].Expressions[0].Value.(map[string]any)
		require.Equal(t, map[string]any{"z": 1}, jsonNumbers(out["replaced"]))
		require.Equal(t, map[string]any{"a": 1}, jsonNumbers(out["replaced_beside"]))
	}
}

// jsonNumbers turns the json.Number values OPA returns into ints, for comparison.
func jsonNumbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range t {
			out[k] = jsonNumbers(e)
		}
		return out
	case interface{ Int64() (int64, error) }:
		n, _ := t.Int64()
		return int(n)
	}
	return v
}
