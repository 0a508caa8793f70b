package decision

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
)

// impureBuiltins are builtins whose answer may depend on more than their arguments or that act
// on the world, beyond those OPA marks Nondeterministic: a cached decision would skip the
// side effect or reuse an answer that may have changed.
var impureBuiltins = map[string]bool{
	"print":          true,
	"internal.print": true,
	"trace":          true,
	"opa.runtime":    true,
	"time.now_ns":    true,
	"http.send":      true,
	"crypto.x509.parse_and_verify_certificates":              true,
	"crypto.x509.parse_and_verify_certificates_with_options": true,
	"providers.aws.sign_req":                                 true,
	"net.lookup_ip_addr":                                     true,
	"rand.intn":                                              true,
	"uuid.rfc4122":                                           true,
	"io.jwt.decode_verify":                                   true, // checks exp and nbf against the clock
}

// inputReads is what a compiled policy can read of its input: every reference rooted at input,
// cut at its first term that is not a constant. A decision depends on the input only through
// the values at these paths (absent ones included), so two inputs that agree on them get the
// same decision from a policy that calls no impure builtin.
type inputReads struct {
	// paths are the read paths, sorted, none a prefix of another. An element is a string
	// (object key) or an int (array index).
	paths [][]any
	// tops are the top-level input keys the paths start with.
	tops []string
	// uncacheable says why decisions of this policy must not be cached; "" when they may be.
	uncacheable string
}

// analyzeInputReads walks the compiled modules: every rule, function and import, whether or not
// the entrypoint reaches it (over-approximating what is read is safe). A policy is cacheable
// only when no term anywhere in it names a non-deterministic or impure builtin, whatever the
// term's place: the operator of a call, the value of a `with` (which makes the replaced
// function that builtin), its target, or an argument. Rules and functions reached through data
// references, imports or `with` values are modules of the policy and walked like the others.
func analyzeInputReads(modules map[string]*ast.Module) inputReads {
	var r inputReads
	var paths [][]any
	names := make([]string, 0, len(modules))
	for n := range modules {
		names = append(names, n)
	}
	sort.Strings(names)
	var visit func(x any) bool
	visit = func(x any) bool {
		if r.uncacheable != "" {
			return true
		}
		switch v := x.(type) {
		case ast.Ref:
			if len(v) > 0 && v[0].Value.Compare(ast.InputRootDocument.Value) == 0 {
				p, why := readPath(v)
				if why != "" {
					r.uncacheable = why
					return true
				}
				paths = append(paths, p)
				for _, t := range v[1:] {
					ast.NewGenericVisitor(visit).Walk(t)
				}
				return true
			}
			if why := impureName(v.String()); why != "" {
				r.uncacheable = why
				return true
			}
		case ast.Var:
			if v.Equal(ast.InputRootDocument.Value) {
				r.uncacheable = "the policy reads input as a whole"
				return true
			}
			if why := impureName(string(v)); why != "" {
				r.uncacheable = why
				return true
			}
		case *ast.Expr:
			if v.IsCall() {
				if why := impureCall(v.Operator()); why != "" {
					r.uncacheable = why
					return true
				}
			}
		case ast.Call:
			if len(v) > 0 {
				if op, ok := v[0].Value.(ast.Ref); ok {
					if why := impureCall(op); why != "" {
						r.uncacheable = why
						return true
					}
				}
			}
		}
		return false
	}
	for _, n := range names {
		ast.NewGenericVisitor(visit).Walk(modules[n])
		if r.uncacheable != "" {
			return inputReads{uncacheable: r.uncacheable}
		}
	}
	r.paths = minimalPaths(paths)
	for _, p := range r.paths {
		if top := p[0].(string); !slices.Contains(r.tops, top) {
			r.tops = append(r.tops, top)
		}
	}
	return r
}

// readPath is the constant prefix of a reference rooted at input: the terms after input up to
// the first that is not a string or a non-negative integer. A prefix of input alone cannot be
// bounded.
func readPath(ref ast.Ref) ([]any, string) {
	var p []any
	for _, t := range ref[1:] {
		switch v := t.Value.(type) {
		case ast.String:
			p = append(p, string(v))
			continue
		case ast.Number:
			if i, ok := v.Int(); ok && i >= 0 && len(p) > 0 {
				p = append(p, i)
				continue
			}
		}
		break
	}
	if len(ref) == 1 {
		return nil, "the policy reads input as a whole"
	}
	if len(p) == 0 {
		return nil, fmt.Sprintf("the policy reads input without a constant key (%v)", ref)
	}
	return p, ""
}

// impureCall says why a call to op makes decisions uncacheable ("" when it does not): a builtin
// OPA marks non-deterministic, one of impureBuiltins, or an operator that is neither a known
// builtin nor a function of the policy.
func impureCall(op ast.Ref) string {
	if len(op) > 0 && op[0].Value.Compare(ast.DefaultRootDocument.Value) == 0 {
		return "" // a function of the policy: its body is analysed where it is defined
	}
	name := op.String()
	b, ok := ast.BuiltinMap[name]
	switch {
	case !ok:
		return fmt.Sprintf("the policy calls %s, which is not a builtin of OPA", name)
	case b.Nondeterministic || impureBuiltins[name]:
		return fmt.Sprintf("the policy calls the non-deterministic or impure builtin %s", name)
	}
	return ""
}

// impureName says why a term naming the builtin name makes decisions uncacheable ("" when it
// does not: name is not a builtin, or a deterministic one).
func impureName(name string) string {
	b, ok := ast.BuiltinMap[name]
	if ok && (b.Nondeterministic || impureBuiltins[name]) {
		return fmt.Sprintf("the policy names the non-deterministic or impure builtin %s", name)
	}
	return ""
}

// minimalPaths sorts and deduplicates paths and drops every path that extends another.
func minimalPaths(paths [][]any) [][]any {
	key := func(p []any) string {
		var b strings.Builder
		for _, e := range p {
			switch v := e.(type) {
			case string:
				fmt.Fprintf(&b, "s%d:%s", len(v), v)
			case int:
				fmt.Fprintf(&b, "i%d;", v)
			}
		}
		return b.String()
	}
	slices.SortFunc(paths, func(a, b []any) int { return strings.Compare(key(a), key(b)) })
	var out [][]any
	for _, p := range paths {
		if len(out) > 0 && hasPrefix(p, out[len(out)-1]) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func hasPrefix(p, prefix []any) bool {
	if len(prefix) > len(p) {
		return false
	}
	for i := range prefix {
		if p[i] != prefix[i] {
			return false
		}
	}
	return true
}

// key is the digest of the input projected onto the read paths, under policy generation gen.
// ok is false when a value cannot be encoded (the decision is then not cached).
func (r *inputReads) key(gen uint64, in map[string]any) (k [sha256.Size]byte, ok bool) {
	buf := make([]byte, 0, 512)
	buf = binary.AppendUvarint(buf, gen)
	for _, p := range r.paths {
		var cur any = in
		present := true
		for _, e := range p {
			next, found, descended := step(cur, e)
			if !descended {
				break // cur is a value the walk cannot enter: encode all of it
			}
			if !found {
				present = false
				break
			}
			cur = next
		}
		if !present {
			buf = append(buf, 'U')
			continue
		}
		buf = append(buf, 'P')
		if buf, ok = encode(buf, cur); !ok {
			return k, false
		}
	}
	return sha256.Sum256(buf), true
}

// step looks up one path element in v. descended is false when v is of a type the walk does not
// enter (it is then encoded whole, which covers every path below it); otherwise found says
// whether the element exists, as OPA would find it.
func step(v any, e any) (next any, found, descended bool) {
	switch c := v.(type) {
	case map[string]any:
		s, isKey := e.(string)
		if !isKey {
			return nil, false, true
		}
		next, found = c[s]
		return next, found, true
	case []any:
		i, isIndex := e.(int)
		if !isIndex || i >= len(c) {
			return nil, false, true
		}
		return c[i], true, true
	case string, bool, nil, json.Number, float64, int, int64, uint64:
		return nil, false, true // a scalar has no members
	}
	return nil, false, false
}

// encode appends an injective encoding of a JSON-like value: two values with the same encoding
// are the same value to OPA. Types it does not know are encoded as their JSON, which is what
// OPA converts them through.
func encode(buf []byte, v any) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return append(buf, 'n'), true
	case bool:
		if x {
			return append(buf, 't'), true
		}
		return append(buf, 'f'), true
	case string:
		return appendString(append(buf, 's'), x), true
	case json.Number:
		return appendString(append(buf, 'N'), string(x)), true
	case float64:
		return appendString(append(buf, 'F'), strconv.FormatFloat(x, 'g', -1, 64)), true
	case int:
		return appendString(append(buf, 'I'), strconv.FormatInt(int64(x), 10)), true
	case int64:
		return appendString(append(buf, 'I'), strconv.FormatInt(x, 10)), true
	case uint64:
		return appendString(append(buf, 'I'), strconv.FormatUint(x, 10)), true
	case []any:
		buf = binary.AppendUvarint(append(buf, 'a'), uint64(len(x)))
		for _, e := range x {
			var ok bool
			if buf, ok = encode(buf, e); !ok {
				return buf, false
			}
		}
		return buf, true
	case []string:
		buf = binary.AppendUvarint(append(buf, 'a'), uint64(len(x)))
		for _, e := range x {
			buf = appendString(append(buf, 's'), e)
		}
		return buf, true
	case map[string]any:
		var room [16]string // the keys of an object of the input, sorted without allocating
		keys := room[:0]
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		buf = binary.AppendUvarint(append(buf, 'o'), uint64(len(x)))
		for _, k := range keys {
			buf = appendString(buf, k)
			var ok bool
			if buf, ok = encode(buf, x[k]); !ok {
				return buf, false
			}
		}
		return buf, true
	}
	js, err := json.Marshal(v)
	if err != nil {
		return buf, false
	}
	return appendString(append(buf, 'J'), string(js)), true
}

func appendString(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

// prune returns the part of in that the policy can read: only the top-level members its read
// paths start with (all of in when the reads are not bounded), so that converting it for OPA
// skips what no rule looks at. factsValue, when not nil, stands for in["facts"] (already in the
// form OPA reads, which ast.InterfaceToValue keeps as it is); in itself is never modified.
func (r *inputReads) prune(in map[string]any, factsValue ast.Value) map[string]any {
	if r.uncacheable != "" || r.tops == nil {
		if _, ok := in["facts"]; !ok || factsValue == nil {
			return in
		}
		out := maps.Clone(in)
		out["facts"] = factsValue
		return out
	}
	out := make(map[string]any, len(r.tops))
	for _, k := range r.tops {
		if v, ok := in[k]; ok {
			if k == "facts" && factsValue != nil {
				v = factsValue
			}
			out[k] = v
		}
	}
	return out
}
