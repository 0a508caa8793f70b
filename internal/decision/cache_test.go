package decision

import (
	"encoding/json"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInputReadsOfEmbeddedPolicy: the embedded policy is cacheable and reads only these paths;
// now_ns, the lease, the environment and the command are not among them.
func TestInputReadsOfEmbeddedPolicy(t *testing.T) {
	e := embeddedEngine(t, Options{})
	assert.Empty(t, e.CacheStatus())
	p := e.cur.Load()
	assert.ElementsMatch(t, []string{"operation", "resolved", "facts", "narrowing"}, p.reads.tops)
	assert.Contains(t, p.reads.paths, []any{"facts", "worker"})
	assert.Contains(t, p.reads.paths, []any{"narrowing"})
	assert.Contains(t, p.reads.paths, []any{"resolved", "driver"})
}

// TestCacheOffForUnboundedOrImpurePolicies: a policy that calls a non-deterministic or impure
// builtin, or reads input without a constant key, is never cached.
func TestCacheOffForUnboundedOrImpurePolicies(t *testing.T) {
	const doc = `{"allow": false, "code": "X", "message": "", "reasons": [], "capabilities": ` + allFalse + `}`
	tests := []struct {
		name, body, why string
	}{
		{name: "time", body: `x := time.now_ns()`, why: "time.now_ns"},
		{name: "http", body: `x := http.send({"method": "get", "url": "http://127.0.0.1:1"})`, why: "http.send"},
		{name: "rand", body: `x := rand.intn("a", 10)`, why: "rand.intn"},
		{name: "uuid", body: `x := uuid.rfc4122("a")`, why: "uuid.rfc4122"},
		{name: "runtime", body: `x := opa.runtime()`, why: "opa.runtime"},
		{name: "net", body: `x := net.lookup_ip_addr("localhost")`, why: "net.lookup_ip_addr"},
		{name: "trace", body: `x if trace("t")`, why: "trace"},
		{name: "jwt verify", body: `x := io.jwt.decode_verify("a", {"secret": "s"})`, why: "io.jwt.decode_verify"},
		{name: "whole input", body: `x := input`, why: "input as a whole"},
		{name: "variable at the root", body: `x contains v if { some k; v := input[k] }`, why: "without a constant key"},
		{name: "whole input as an argument", body: `x := object.keys(input)`, why: "input as a whole"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := engineWith(t, "package authz\ndecision := "+doc+"\n"+tt.body+"\n")
			assert.Contains(t, e.CacheStatus(), tt.why)
			for range 3 {
				_, err := e.Evaluate(t.Context(), grantInput())
				require.NoError(t, err)
			}
			assert.Equal(t, CacheStats{}, e.CacheStats(), "an uncacheable policy must not touch the cache")
		})
	}
}

func TestCacheOffByOptionAndForPreparedPolicies(t *testing.T) {
	off := embeddedEngine(t, Options{Cache: CacheOptions{Disabled: true}})
	assert.Contains(t, off.CacheStatus(), "turned off")
	_, err := off.Evaluate(t.Context(), grantInput())
	require.NoError(t, err)
	assert.Equal(t, CacheStats{}, off.CacheStats())

	prep := New(Options{})
	require.NoError(t, prep.Prepare(t.Context(), "r1", rego.Module("p.rego", "package authz\ndecision := 1\n")))
	assert.Contains(t, prep.CacheStatus(), "caller options")
}

// TestCacheHitIsAFreshDecision: a hit answers the same document with a fresh decision id and
// the current revision, and counts as a hit.
func TestCacheHitIsAFreshDecision(t *testing.T) {
	e := embeddedEngine(t, Options{})
	a, err := e.Evaluate(t.Context(), grantInput())
	require.NoError(t, err)
	in := grantInput()
	in["now_ns"] = int64(42) // not read by the policy: same key
	in["lease"] = map[string]any{"id": "another lease"}
	b, err := e.Evaluate(t.Context(), in)
	require.NoError(t, err)
	assert.Equal(t, CacheStats{Hits: 1, Misses: 1}, e.CacheStats())
	assert.NotEqual(t, a.DecisionID, b.DecisionID)
	assert.Equal(t, a.Revision, b.Revision)
	a.DecisionID, b.DecisionID = "", ""
	assert.Equal(t, a, b)

	// a hit's reasons are the caller's to change
	in = grantInput()
	in["facts"].(map[string]any)["worker"] = map[string]any{"generation": uint64(2), "supportedMethods": []any{}}
	d1, err := e.Evaluate(t.Context(), in)
	require.NoError(t, err)
	d1.Reasons[0] = "changed"
	d2, err := e.Evaluate(t.Context(), in)
	require.NoError(t, err)
	assert.Equal(t, []string{"method_not_verified"}, d2.Reasons)
}

// TestCacheKeyCoversEveryLiveFact: a change of worker generation, methods, manifest, status or
// config validity is a new key.
func TestCacheKeyCoversEveryLiveFact(t *testing.T) {
	e := embeddedEngine(t, Options{})
	p := e.cur.Load()
	base, ok := p.reads.key(p.gen, grantInput())
	require.True(t, ok)
	changes := map[string]func(map[string]any){
		"generation": func(in map[string]any) { facts(in)["worker"].(map[string]any)["generation"] = uint64(2) },
		"methods":    func(in map[string]any) { facts(in)["worker"].(map[string]any)["supportedMethods"] = []any{} },
		"status":     func(in map[string]any) { facts(in)["plugin"].(map[string]any)["status"] = "disabled" },
		"manifest": func(in map[string]any) {
			facts(in)["plugin"].(map[string]any)["manifest"] = map[string]any{"environmentDrivers": []any{}}
		},
		"config":      func(in map[string]any) { in["narrowing"].(map[string]any)["configResolutionFailed"] = true },
		"worker gone": func(in map[string]any) { delete(facts(in), "worker") },
		"type":        func(in map[string]any) { in["resolved"].(map[string]any)["pluginBacked"] = "true" },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			in := grantInput()
			change(in)
			k, ok := p.reads.key(p.gen, in)
			require.True(t, ok)
			assert.NotEqual(t, base, k)
		})
	}
	other, ok := p.reads.key(p.gen+1, grantInput())
	require.True(t, ok)
	assert.NotEqual(t, base, other, "another policy generation is another key")
}

func facts(in map[string]any) map[string]any { return in["facts"].(map[string]any) }

// TestCacheBounds: the cache holds at most MaxEntries entries and MaxBytes bytes, evicting the
// least recently used.
func TestCacheBounds(t *testing.T) {
	c := newDecisionCache(CacheOptions{MaxEntries: 3})
	k := func(i byte) (out [32]byte) { out[0] = i; return out }
	for i := range byte(5) {
		c.put(k(i), Document{Code: "C"})
	}
	assert.Equal(t, 3, c.len())
	assert.Equal(t, uint64(2), c.stats().Evictions)
	_, hit := c.get(k(0))
	assert.False(t, hit, "the oldest entries are evicted")
	_, hit = c.get(k(4))
	assert.True(t, hit)

	one := entrySize(Document{Code: "C"})
	b := newDecisionCache(CacheOptions{MaxBytes: 2 * one})
	for i := range byte(4) {
		b.put(k(i), Document{Code: "C"})
	}
	assert.Equal(t, 2, b.len())
	assert.LessOrEqual(t, b.bytes, 2*one)
	b.put(k(9), Document{Code: string(make([]byte, 4*one))})
	assert.Equal(t, 2, b.len(), "an entry larger than the bound is not held")
}

// TestCachePurgedOnNewPolicy: loading a policy drops the entries of the one before.
func TestCachePurgedOnNewPolicy(t *testing.T) {
	e := embeddedEngine(t, Options{})
	_, err := e.Evaluate(t.Context(), grantInput())
	require.NoError(t, err)
	require.Equal(t, 1, e.cache.len())
	mods, err := policiesModules()
	require.NoError(t, err)
	require.NoError(t, e.LoadModules(t.Context(), mods, "again"))
	assert.Equal(t, 0, e.cache.len())
}

// TestEncodeIsInjective: values OPA tells apart have different encodings.
func TestEncodeIsInjective(t *testing.T) {
	vals := []any{nil, true, false, "", "a", "ab", json.Number("1"), 1.0, 1.5, 2, int64(3), uint64(4),
		[]any{}, []any{"a"}, []any{"a", "b"}, []any{[]any{"a"}, "b"}, map[string]any{}, map[string]any{"a": "b"},
		map[string]any{"a": []any{}}, map[string]any{"ab": ""}, map[string]any{"a": "", "b": ""}, []string{"x"},
		map[string]map[string]any{"a": {}}}
	seen := map[string]int{}
	for i, v := range vals {
		b, ok := encode(nil, v)
		require.True(t, ok)
		if j, dup := seen[string(b)]; dup {
			t.Fatalf("%#v and %#v encode alike", vals[j], v)
		}
		seen[string(b)] = i
	}
	a, _ := encode(nil, map[string]any{"x": 1, "y": []any{"a", true}})
	b, _ := encode(nil, map[string]any{"y": []any{"a", true}, "x": 1})
	assert.Equal(t, a, b, "map order does not matter")
}
