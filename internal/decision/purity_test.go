package decision

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// builtinCall is a builtin with arguments it accepts.
type builtinCall struct{ name, args string }

func (b builtinCall) arity() int { return len(ast.BuiltinMap[b.name].Decl.FuncArgs().Args) }

// impureCalls are builtins whose answer may change between two evaluations of the same input.
var impureCalls = []builtinCall{
	{"time.now_ns", ""},
	{"opa.runtime", ""},
	{"uuid.rfc4122", `"a"`},
	{"http.send", `{"method": "get", "url": "http://127.0.0.1:1"}`},
	{"net.lookup_ip_addr", `"localhost"`},
	{"io.jwt.decode_verify", `"a", {"secret": "s"}`},
	{"rand.intn", `"a", 10`},
	{"trace", `"t"`},
}

// pureCalls are deterministic builtins of the same arities.
var pureCalls = []builtinCall{
	{"upper", `"a"`},
	{"count", `[1]`},
	{"sprintf", `"%v", ["b"]`},
	{"concat", `",", ["a"]`},
	{"abs", `-1`},
}

// stubs are functions of the policy, one per arity, that `with` replaces.
const stubs = "stub0 := 0\nstub1(a) := a\nstub2(a, b) := [a, b]\n"

// reachForms express the use of a builtin b in an expression that binds y: a call, a `with`
// whose value names the builtin, or a `with` whose value names a function of the policy that
// calls it. Each returns the expression and rules to add to the module that uses it; ok is
// false when the form does not apply to b.
var reachForms = map[string]func(b builtinCall) (expr, rules string, ok bool){
	"call": func(b builtinCall) (string, string, bool) { return "y := " + b.name + "(" + b.args + ")", "", true },
	"with builtin": func(b builtinCall) (string, string, bool) {
		if b.arity() == 0 {
			return "", "", false // a with value that names a builtin replaces a function of its arity
		}
		stub := fmt.Sprintf("stub%d", b.arity())
		return "y := " + stub + "(" + b.args + ") with " + stub + " as " + b.name, "", true
	},
	"with function": func(b builtinCall) (string, string, bool) {
		if b.arity() == 0 {
			return "y := stub0 with stub0 as wrapped0", "wrapped0 := " + b.name + "(" + b.args + ")\n", true
		}
		params := []string{"p0", "p1"}[:b.arity()]
		stub := fmt.Sprintf("stub%d", b.arity())
		fn := fmt.Sprintf("wrapped%d", b.arity())
		return "y := " + stub + "(" + b.args + ") with " + stub + " as " + fn,
			fn + "(" + strings.Join(params, ", ") + ") := " + b.name + "(" + strings.Join(params, ", ") + ")\n", true
	},
}

// places put an expression where the decision can reach it: a rule of the policy, a rule of
// another package read through data, an imported function, a comprehension, an else branch,
// every.
var places = map[string]func(expr, rules string) map[string]string{
	"rule": func(expr, rules string) map[string]string {
		return map[string]string{"p.rego": mainModule("x := y if { " + expr + " }\n" + rules)}
	},
	"other package via data": func(expr, rules string) map[string]string {
		return map[string]string{
			"p.rego":   mainModule("x := data.lib.v\n"),
			"lib.rego": "package lib\n" + stubs + rules + "v := y if { " + expr + " }\n",
		}
	},
	"imported function": func(expr, rules string) map[string]string {
		return map[string]string{
			"p.rego":   "package authz\nimport data.lib\n" + decisionRule + "x := lib.g(1)\n",
			"lib.rego": "package lib\n" + stubs + rules + "g(_) := y if { " + expr + " }\n",
		}
	},
	"comprehension": func(expr, rules string) map[string]string {
		return map[string]string{"p.rego": mainModule("x := [y | some i in [1]; " + expr + "]\n" + rules)}
	},
	"else": func(expr, rules string) map[string]string {
		return map[string]string{"p.rego": mainModule("x := 1 if { false } else := y if { " + expr + " }\n" + rules)}
	},
	"every": func(expr, rules string) map[string]string {
		return map[string]string{"p.rego": mainModule("x if { every i in [1] { " + expr + "; y != i } }\n" + rules)}
	},
}

const decisionRule = `decision := {"allow": false, "code": "X", "message": "", "reasons": [], "capabilities": ` + allFalse + "}\n"

func mainModule(body string) string { return "package authz\n" + decisionRule + stubs + body }

func loadPolicy(t testing.TB, modules map[string]string) (*Engine, error) {
	t.Helper()
	e := New(Options{})
	err := e.LoadModules(t.Context(), modules, "test")
	return e, err
}

// TestCacheOffForEveryRouteToAnImpureBuiltin generates a policy for every way of reaching a
// builtin (call, `with` naming it, `with` naming a function that calls it) in every place the
// decision can reach (a rule, another package through data, an imported function, a
// comprehension, an else branch, every): with an impure builtin the cache is off and no
// decision touches it; with a pure one the cache is on and the second decision is a hit.
func TestCacheOffForEveryRouteToAnImpureBuiltin(t *testing.T) {
	for formName, form := range reachForms {
		for placeName, place := range places {
			for _, b := range impureCalls {
				expr, rules, ok := form(b)
				if !ok {
					continue // the form does not apply to this builtin
				}
				t.Run(formName+"/"+placeName+"/"+b.name, func(t *testing.T) {
					mods := place(expr, rules)
					e, err := loadPolicy(t, mods)
					require.NoError(t, err, "%v", mods)
					assert.Contains(t, e.CacheStatus(), b.name, "%v", mods)
					for range 2 {
						_, err := e.Evaluate(t.Context(), grantInput())
						require.NoError(t, err)
					}
					assert.Equal(t, CacheStats{}, e.CacheStats(), "an uncacheable policy must not touch the cache")
				})
			}
			for _, b := range pureCalls {
				expr, rules, ok := form(b)
				if !ok {
					continue
				}
				t.Run(formName+"/"+placeName+"/pure "+b.name, func(t *testing.T) {
					mods := place(expr, rules)
					e, err := loadPolicy(t, mods)
					require.NoError(t, err, "%v", mods)
					assert.Empty(t, e.CacheStatus(), "%v", mods)
					for range 2 {
						_, err := e.Evaluate(t.Context(), grantInput())
						require.NoError(t, err)
					}
					assert.Equal(t, CacheStats{Hits: 1, Misses: 1}, e.CacheStats())
				})
			}
		}
	}
}

// hs256 is a JWT signed with HMAC-SHA256 under secret, expiring at exp.
func hs256(secret string, exp time.Time) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	body := enc.EncodeToString(fmt.Appendf(nil, `{"exp":%d}`, exp.Unix()))
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(head + "." + body))
	return head + "." + body + "." + enc.EncodeToString(mac.Sum(nil))
}

// TestCachedJWTGrantDoesNotOutliveExpiry: a grant that depends on a JWT verified through
// `with f as io.jwt.decode_verify` is not served from the cache once the token expired: the
// engine with the cache on answers what a fresh evaluation answers, a deny.
func TestCachedJWTGrantDoesNotOutliveExpiry(t *testing.T) {
	token := hs256("s", time.Now().Add(3*time.Second)) // valid for 2 s at least (exp is in whole seconds)
	src := `package authz
verify(_, _) := [false, {}, {}]
default decision := {"allow": false, "code": "EXPIRED", "message": "", "reasons": [], "capabilities": ` + allFalse + `}
decision := {"allow": true, "code": "", "message": "", "reasons": [], "capabilities": ` + allFalse + `} if {
	input.operation == "openDuplexChannel"
	[valid, _, _] := verify("` + token + `", {"secret": "s"}) with verify as io.jwt.decode_verify
	valid
}
`
	cached := New(Options{})
	require.NoError(t, cached.LoadModules(t.Context(), map[string]string{"p.rego": src}, "jwt"))
	fresh := New(Options{Cache: CacheOptions{Disabled: true}})
	require.NoError(t, fresh.LoadModules(t.Context(), map[string]string{"p.rego": src}, "jwt"))

	doc, err := cached.Evaluate(t.Context(), grantInput())
	require.NoError(t, err)
	require.True(t, doc.Allow, "the token is valid for now")

	require.Eventually(t, func() bool {
		d, err := fresh.Evaluate(t.Context(), grantInput())
		return err == nil && !d.Allow
	}, 10*time.Second, 20*time.Millisecond, "a fresh evaluation denies once the token expired")
	doc, err = cached.Evaluate(t.Context(), grantInput())
	require.NoError(t, err)
	assert.False(t, doc.Allow, "the cached grant must not outlive the token")
	assert.Equal(t, "EXPIRED", doc.Code)
}
