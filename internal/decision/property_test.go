package decision_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specoracle"
	"github.com/authz-dev/authz/internal/testutil"
)

// absent marks a field the generator leaves out.
type absentT struct{}

var absent = absentT{}

// gen draws requests and facts from small vocabularies that hit every branch of docs/contract.md,
// "The nine capabilities", "The decision, in order" and "Resolving the snapshot", with wrong types mixed in everywhere a value is read.
// In friendly mode it mostly takes the first value offered, which is always the one that leads
// towards a grant, so that grants are common and each case differs from one in a few places.
type gen struct {
	r        *rand.Rand
	friendly bool
}

func (g gen) pick(vals ...any) any {
	if g.friendly && g.chance(0.9) {
		return vals[0]
	}
	return vals[g.r.IntN(len(vals))]
}

func (g gen) chance(p float64) bool { return g.r.Float64() < p }

func put(m map[string]any, k string, v any) {
	if v != absent {
		m[k] = v
	}
}

var allMethods = []string{"environmentResumeLease", "environmentReleaseLease", "environmentDestroyLease",
	"environmentSyncIn", "environmentSyncOut", "environmentExecute", "duplexChannelOpen",
	"environmentRunnerIngressEndpoint"}

func (g gen) methods() any {
	if g.chance(0.1) {
		return g.pick(nil, "duplexChannelOpen", map[string]any{"a": "duplexChannelOpen"})
	}
	var out []any
	for _, m := range allMethods {
		if g.chance(0.6) || (g.friendly && g.chance(0.9)) {
			out = append(out, m)
		}
	}
	if g.chance(0.2) {
		out = append(out, g.pick(1, nil, "DuplexChannelOpen", true))
	}
	if out == nil {
		out = []any{}
	}
	return out
}

func (g gen) boolish() any { return g.pick(true, true, false, "true", 1, nil, absent, absent) }

func (g gen) declaration() any {
	switch g.r.IntN(10) {
	case 0:
		return nil
	case 1:
		return g.pick("x", []any{}, true)
	case 2, 3:
		return absent
	}
	caps := map[string]any{}
	for _, k := range api.CapabilityKeys {
		put(caps, k, g.boolish())
	}
	return caps
}

func (g gen) entry(key any) any {
	if g.chance(0.05) {
		return g.pick("entry", 3, nil)
	}
	e := map[string]any{}
	put(e, "driverKey", key)
	put(e, "kind", g.pick("sandbox_provider", "sandbox_provider", "environment_driver", "Sandbox_provider", absent, 1))
	put(e, "sandboxCapabilities", g.declaration())
	put(e, "supportsReusableLeases", g.pick(absent, absent, true, false, nil, "yes"))
	return e
}

func (g gen) request() any {
	if g.chance(0.02) {
		return g.pick([]any{}, "x", nil, 1.0)
	}
	md := map[string]any{}
	put(md, "driver", g.pick("sandbox", "sandbox", "plugin", "plugin", "local", "ssh", "foo", "Sandbox", "", 7, nil, absent))
	put(md, "sandboxProviderPlugin", g.pick(true, true, false, "true", absent))
	put(md, "pluginId", g.pick("p1", "p1", "p1", "p2", "P1", "", nil, absent))
	put(md, "provider", g.pick("daytona", "daytona", "fake", "other", "", 3, absent, absent))
	put(md, "driverKey", g.pick("daytona", "dk", "", absent))
	put(md, "backend", g.pick(absent, "job", "vm", absent))
	put(md, "nativeFileSyncUnsupported", g.pick(absent, true, false, "true", absent))
	lease := map[string]any{}
	put(lease, "leasePolicy", g.pick("reuse_by_environment", "reuse_by_environment", "ephemeral", "retain_on_failure", absent, 5))
	put(lease, "metadata", g.pick(md, md, md, md, md, md, md, md, md, md, md, md, md, md, md, md, md, md, md, absent, nil))
	env := map[string]any{}
	put(env, "driver", g.pick("sandbox", "sandbox", "plugin", "local", "", absent, 1))
	put(env, "config", g.pick(map[string]any{"provider": g.pick("daytona", "fake", "", 2)}, "cfg", absent))
	req := map[string]any{}
	put(req, "operation", g.pick("openDuplexChannel", "openDuplexChannel", "getRunnerIngressEndpoint", absent, absent,
		g.pick("other", nil)))
	put(req, "environment", g.pick(env, env, env, env, env, env, env, env, env, env, env, env, env, env, env, env, env, env, env, absent, nil))
	put(req, "lease", g.pick(lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, lease, absent, []any{}))
	put(req, "command", g.pick([]any{"sh"}, absent))
	return req
}

func (g gen) facts() any {
	if g.chance(0.02) {
		return g.pick([]any{}, nil, map[string]any{"plugins": nil}, map[string]any{"workers": []any{}},
			map[string]any{"plugins": []any{map[string]any{"id": 1}}}, map[string]any{"builtinProviders": map[string]any{"x": 1}})
	}
	var plugins []any
	for _, id := range []string{"p1", "p2"} {
		if g.chance(0.15) {
			continue
		}
		p := map[string]any{"id": id}
		put(p, "status", g.pick("ready", "ready", "ready", "disabled", "Ready", "error", 1, absent))
		put(p, "key", "acme")
		var entries []any
		n := g.r.IntN(3) + 1
		if g.friendly && g.chance(0.9) {
			n = 1
		}
		for range n {
			entries = append(entries, g.entry(g.pick("daytona", "daytona", "dk", "fake", 1)))
		}
		manifest := map[string]any{"environmentDrivers": entries}
		put(p, "manifest", g.pick(manifest, manifest, manifest, manifest, manifest, absent, "m",
			map[string]any{"environmentDrivers": map[string]any{"a": entries[0]}}))
		plugins = append(plugins, p)
	}
	workers := map[string]any{}
	for _, id := range []string{"p1", "p2", "P1"} {
		if g.chance(0.8) {
			w := map[string]any{}
			put(w, "supportedMethods", g.methods())
			put(w, "configValid", g.pick(absent, absent, true, false, "true", nil))
			workers[id] = w
		}
	}
	builtins := map[string]any{}
	for _, key := range []string{"fake", "daytona"} {
		if g.chance(0.7) {
			b := map[string]any{}
			put(b, "execute", g.boolish())
			put(b, "supportsReusableLeases", g.boolish())
			builtins[key] = b
		}
	}
	f := map[string]any{}
	put(f, "plugins", g.pick(plugins, plugins, plugins, absent))
	put(f, "workers", g.pick(workers, workers, workers, absent))
	put(f, "builtinProviders", g.pick(builtins, builtins, absent))
	return f
}

// roundTrip turns a generated value into JSON bytes and back, as both sides will see it.
func roundTrip(t testing.TB, v any) ([]byte, any) {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out any
	require.NoError(t, dec.Decode(&out))
	return b, out
}

// checkAgainstOracle decides one request and facts both ways and fails on any difference:
// bad-input classification, allow, code, message, reasons and every capability.
func checkAgainstOracle(t testing.TB, eng *decision.Engine, reqJSON, factsJSON []byte, reqVal, factsVal any) {
	t.Helper()
	want, oerr := specoracle.Decide(reqVal, factsVal)
	req, rerr := snapshot.ParseRequest(bytes.NewReader(reqJSON))
	var ferr error
	var facts *snapshot.FileFacts
	if rerr == nil {
		facts, ferr = snapshot.ParseFacts(bytes.NewReader(factsJSON))
	}
	switch {
	case errors.Is(oerr, specoracle.ErrBadRequest):
		require.Error(t, rerr, "oracle: bad request (%v); engine accepted %s", oerr, reqJSON)
		require.Equal(t, coded.BadRequest, coded.CodeOf(rerr))
		return
	case rerr != nil:
		t.Fatalf("engine: bad request (%v); oracle accepted %s", rerr, reqJSON)
	case errors.Is(oerr, specoracle.ErrBadFacts):
		require.Error(t, ferr, "oracle: bad facts (%v); engine accepted %s", oerr, factsJSON)
		require.Equal(t, coded.BadFacts, coded.CodeOf(ferr))
		return
	case ferr != nil:
		t.Fatalf("engine: bad facts (%v); oracle accepted %s", ferr, factsJSON)
	case oerr != nil:
		t.Fatalf("oracle error: %v", oerr)
	}
	got, _, err := eng.Decide(t.Context(), req, facts)
	require.NoError(t, err)
	ctx := "request " + string(reqJSON) + "\nfacts " + string(factsJSON)
	if got.Allow && !want.Allow {
		t.Fatalf("engine GRANTS what the oracle refuses (%s %v)\n%s", want.Code, want.Reasons, ctx)
	}
	require.Equal(t, want.Allow, got.Allow, ctx)
	require.Equal(t, want.Code, got.Code, ctx)
	require.Equal(t, want.Message, got.Message, ctx)
	require.Equal(t, want.Reasons, got.Reasons, ctx)
	require.Equal(t, want.Capabilities, decisiontest.CapabilityMap(got.Capabilities), ctx)
}

// TestAgreesWithOracle is the property: for random requests and facts, the engine and the
// independent oracle agree on everything, and in particular the engine never grants more.
func TestAgreesWithOracle(t *testing.T) {
	n := 1500
	if testing.Short() {
		n = 300
	}
	eng := newEngine(t)
	g := gen{r: rand.New(rand.NewPCG(20261130, 1))}
	grants := 0
	for i := range n {
		g.friendly = i%2 == 0
		reqJSON, reqVal := roundTrip(t, g.request())
		factsJSON, factsVal := roundTrip(t, g.facts())
		checkAgainstOracle(t, eng, reqJSON, factsJSON, reqVal, factsVal)
		if d, err := specoracle.Decide(reqVal, factsVal); err == nil && d.Allow {
			grants++
		}
	}
	// The generator must reach grants as well as denies, or the property says little.
	require.Greater(t, grants, n/50, "too few grants generated: the property would be vacuous")
	t.Logf("%d cases, %d grants", n, grants)
}

// FuzzDecide feeds arbitrary bytes as request and facts: the engine never panics, never grants
// what the oracle refuses, and agrees with it on everything else.
func FuzzDecide(f *testing.F) {
	g := gen{r: rand.New(rand.NewPCG(7, 7))}
	for range 20 {
		req, _ := json.Marshal(g.request())
		facts, _ := json.Marshal(g.facts())
		f.Add(req, facts)
	}
	f.Add([]byte(`{`), []byte(`{}`))
	f.Add([]byte(`null`), []byte(`null`))
	eng := newEngine(f)
	f.Fuzz(func(t *testing.T, reqJSON, factsJSON []byte) {
		var reqVal, factsVal any
		if !testutil.DecodeOneJSON(reqJSON, &reqVal) {
			_, err := snapshot.ParseRequest(bytes.NewReader(reqJSON))
			require.Error(t, err)
			return
		}
		if !testutil.DecodeOneJSON(factsJSON, &factsVal) {
			_, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
			require.Error(t, err)
			return
		}
		checkAgainstOracle(t, eng, reqJSON, factsJSON, reqVal, factsVal)
	})
}

// TestCachedAgreesWithUncached is the cache's safety property: on random assembled inputs and on
// every single-field perturbation of each (a changed value, a changed type, a removed member), an
// engine with the decision cache answers exactly what an engine without it answers, although
// its cache already holds the decisions of the neighbouring inputs.
func TestCachedAgreesWithUncached(t *testing.T) {
	n := 25
	if testing.Short() {
		n = 8
	}
	cached := newEngine(t)
	uncached := decisiontest.EmbeddedEngine(t, decision.Options{Cache: decision.CacheOptions{Disabled: true}})
	g := gen{r: rand.New(rand.NewPCG(20261130, 2))}
	compare := func(in snapshot.Input) {
		t.Helper()
		want, werr := uncached.Evaluate(t.Context(), in)
		got, gerr := cached.Evaluate(t.Context(), in)
		require.Equal(t, werr == nil, gerr == nil)
		want.DecisionID, got.DecisionID = "", ""
		if !assert.Equal(t, want, got) {
			b, _ := json.Marshal(in)
			t.Fatalf("cached and uncached differ on %s", b)
		}
	}
	for i := 0; i < n; i++ {
		g.friendly = i%2 == 0
		reqJSON, _ := roundTrip(t, g.request())
		factsJSON, _ := roundTrip(t, g.facts())
		req, rerr := snapshot.ParseRequest(bytes.NewReader(reqJSON))
		facts, ferr := snapshot.ParseFacts(bytes.NewReader(factsJSON))
		if rerr != nil || ferr != nil {
			continue
		}
		base := snapshot.Build(t.Context(), req, facts, snapshot.Options{})
		compare(base)
		for _, path := range leafPaths(map[string]any(base), nil) {
			for _, v := range []any{absent, nil, true, "ready", json.Number("2"), []any{"duplexChannelOpen"}} {
				compare(perturb(base, path, v))
			}
		}
		compare(base)
	}
	s := cached.CacheStats()
	t.Logf("cache: %+v", s)
	require.Greater(t, s.Hits, uint64(n), "the property must exercise cache hits")
	require.Greater(t, s.Misses, uint64(n))
}

// leafPaths lists the path of every member and element of v (inner nodes included).
func leafPaths(v any, prefix []any) [][]any {
	var out [][]any
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := append(append([]any{}, prefix...), k)
			out = append(out, p)
			out = append(out, leafPaths(e, p)...)
		}
	case []any:
		for i, e := range x {
			p := append(append([]any{}, prefix...), i)
			out = append(out, p)
			out = append(out, leafPaths(e, p)...)
		}
	}
	return out
}

// perturb returns a deep copy of in with the value at path replaced by v (removed for absent).
func perturb(in snapshot.Input, path []any, v any) snapshot.Input {
	out := deepCopy(map[string]any(in)).(map[string]any)
	var cur any = out
	for i, e := range path {
		last := i == len(path)-1
		switch c := cur.(type) {
		case map[string]any:
			k := e.(string)
			if last {
				if v == absent {
					delete(c, k)
				} else {
					c[k] = v
				}
			}
			cur = c[k]
		case []any:
			j := e.(int)
			if last {
				if v == absent {
					c[j] = nil
				} else {
					c[j] = v
				}
			}
			cur = c[j]
		}
	}
	return out
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	case snapshot.Input:
		return deepCopy(map[string]any(x))
	}
	return v
}
