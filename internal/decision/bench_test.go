package decision_test

import (
	"bytes"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/policies"
)

func benchFixture(b *testing.B) (*snapshot.Request, *snapshot.FileFacts) {
	b.Helper()
	reqJSON, factsJSON := specexamples.NewFixture().JSON()
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	require.NoError(b, err)
	req, err := snapshot.ParseRequestBytes(reqJSON)
	require.NoError(b, err)
	return req, facts
}

// BenchmarkAssemble is the host's part of one decision: the input document from request and facts.
func BenchmarkAssemble(b *testing.B) {
	req, facts := benchFixture(b)
	b.ReportAllocs()
	for b.Loop() {
		_ = snapshot.Build(b.Context(), req, facts, snapshot.Options{})
	}
}

// uncached is an engine option set that evaluates every decision.
var uncached = decision.Options{Cache: decision.CacheOptions{Disabled: true}}

// BenchmarkEvaluate is the policy's part: one evaluation of an assembled input.
func BenchmarkEvaluate(b *testing.B) {
	req, facts := benchFixture(b)
	eng := decisiontest.EmbeddedEngine(b, uncached)
	in := snapshot.Build(b.Context(), req, facts, snapshot.Options{})
	b.ReportAllocs()
	for b.Loop() {
		if d, err := eng.Evaluate(b.Context(), in); err != nil || !d.Allow {
			b.Fatal("want a grant", err)
		}
	}
}

// BenchmarkDecide is one whole decision from request bytes: parse, assemble, evaluate.
func BenchmarkDecide(b *testing.B) {
	benchDecide(b, uncached)
}

// BenchmarkDecideCacheHit is a repeated decision: parse, assemble, and the answer from the
// decision cache (a fresh decision id included).
func BenchmarkDecideCacheHit(b *testing.B) {
	benchDecide(b, decision.Options{})
}

func benchDecide(b *testing.B, opts decision.Options) {
	benchDecideFixture(b, opts, specexamples.NewFixture(), true)
}

// BenchmarkDecideDeny is BenchmarkDecide on a deny: the worker of the pinned plugin reports no
// method, so the decision explains why (reasons method_not_verified and the like).
func BenchmarkDecideDeny(b *testing.B) {
	f := specexamples.NewFixture()
	f.Worker()["supportedMethods"] = []any{}
	benchDecideFixture(b, uncached, f, false)
}

// benchDecideFixture decides f's request from its bytes on f's facts, wanting allow; it reports
// the process's CPU time per decision (cpu-ns/op: user and system, the runtime's own work such
// as garbage collection included) beside the wall time.
func benchDecideFixture(b *testing.B, opts decision.Options, f specexamples.Fixture, allow bool) {
	reqJSON, factsJSON := f.JSON()
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	require.NoError(b, err)
	eng := decisiontest.EmbeddedEngine(b, opts)
	b.ReportAllocs()
	runtime.GC() // the set-up's garbage is not the decisions' CPU time
	cpu0 := processCPU()
	for b.Loop() {
		req, err := snapshot.ParseRequestBytes(reqJSON)
		if err != nil {
			b.Fatal(err)
		}
		if d, _, err := eng.Decide(b.Context(), req, facts); err != nil || d.Allow != allow {
			b.Fatal("want allow", allow, err)
		}
	}
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// processCPU is the CPU time (user and system) the process has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecideCacheHitParsed is a repeated decision through the Go API, which takes a parsed
// request: assemble, key, and the answer from the decision cache (a fresh decision id included).
func BenchmarkDecideCacheHitParsed(b *testing.B) {
	req, facts := benchFixture(b)
	eng := decisiontest.EmbeddedEngine(b, decision.Options{})
	b.ReportAllocs()
	for b.Loop() {
		if d, _, err := eng.Decide(b.Context(), req, facts); err != nil || !d.Allow {
			b.Fatal("want a grant", err)
		}
	}
	if s := eng.CacheStats(); s.Misses != 1 {
		b.Fatalf("want one miss, got %+v", s)
	}
}

// BenchmarkPolicyPrepared is what `opa bench` measures, in process: the embedded policy prepared
// with rego, evaluated on the assembled input converted once, without the engine. The engine's
// whole decision (BenchmarkDecide) is compared with it.
func BenchmarkPolicyPrepared(b *testing.B) {
	req, facts := benchFixture(b)
	in := snapshot.Build(b.Context(), req, facts, snapshot.Options{})
	pq := preparedPolicy(b)
	val, err := ast.InterfaceToValue(map[string]any(in))
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		rs, err := pq.Eval(b.Context(), rego.EvalParsedInput(val))
		if err != nil || len(rs) != 1 {
			b.Fatal("want one result", err)
		}
	}
}

// BenchmarkSideBySide times, in turns within each iteration, the policy alone (as
// BenchmarkPolicyPrepared), the engine's evaluation of an assembled input (as BenchmarkEvaluate)
// and the whole decision from request bytes (as BenchmarkDecide), so that a machine whose load
// changes slows all three alike. It reports the median of each (policy-ns, evaluate-ns,
// decide-ns) and decide/policy, the ratio of the whole decision to what `opa bench` measures.
func BenchmarkSideBySide(b *testing.B) {
	reqJSON, _ := specexamples.NewFixture().JSON()
	req, facts := benchFixture(b)
	in := snapshot.Build(b.Context(), req, facts, snapshot.Options{})
	pq := preparedPolicy(b)
	val, err := ast.InterfaceToValue(map[string]any(in))
	require.NoError(b, err)
	eng := decisiontest.EmbeddedEngine(b, uncached)
	steps := []func(){
		func() {
			if rs, err := pq.Eval(b.Context(), rego.EvalParsedInput(val)); err != nil || len(rs) != 1 {
				b.Fatal("want one result", err)
			}
		},
		func() {
			if d, err := eng.Evaluate(b.Context(), in); err != nil || !d.Allow {
				b.Fatal("want a grant", err)
			}
		},
		func() {
			r, err := snapshot.ParseRequestBytes(reqJSON)
			if err != nil {
				b.Fatal(err)
			}
			if d, _, err := eng.Decide(b.Context(), r, facts); err != nil || !d.Allow {
				b.Fatal("want a grant", err)
			}
		},
	}
	times := make([][]time.Duration, len(steps))
	for b.Loop() {
		for i, step := range steps {
			t0 := time.Now()
			step()
			times[i] = append(times[i], time.Since(t0))
		}
	}
	med := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Nanoseconds())
	}
	b.ReportMetric(med(times[0]), "policy-ns")
	b.ReportMetric(med(times[1]), "evaluate-ns")
	b.ReportMetric(med(times[2]), "decide-ns")
	b.ReportMetric(med(times[2])/med(times[0]), "decide/policy")
}

// BenchmarkPartialEvaluation times, in turns within each iteration, the policy alone (as
// BenchmarkPolicyPrepared) and the residual of its partial evaluation with the assembled input's
// facts known and every other part of the input unknown, the specialisation a facts generation
// would buy (rego.PartialResult, prepared once). It reports the median of each (general-ns,
// residual-ns) and residual/general. OPA v1.22.3 does not partially evaluate a rule with else
// (it keeps the reference), and the decision is one, so the residual is the general policy
// behind a wrapper: the engine does not specialise (BENCHMARKS.md, "Partial evaluation").
func BenchmarkPartialEvaluation(b *testing.B) {
	req, facts := benchFixture(b)
	in := snapshot.Build(b.Context(), req, facts, snapshot.Options{})
	mods, err := policies.Modules()
	require.NoError(b, err)
	opts := []func(*rego.Rego){
		rego.Query(decision.Query),
		rego.Input(map[string]any{"facts": in["facts"]}),
		rego.Unknowns([]string{"input.resolved", "input.narrowing", "input.operation", "input.lease",
			"input.environment", "input.command", "input.now_ns"}),
	}
	for name, src := range mods {
		opts = append(opts, rego.Module(name, src))
	}
	pr, err := rego.New(opts...).PartialResult(b.Context())
	require.NoError(b, err)
	residual, err := pr.Rego().PrepareForEval(b.Context())
	require.NoError(b, err)
	general := preparedPolicy(b)
	val, err := ast.InterfaceToValue(map[string]any(in))
	require.NoError(b, err)
	var want any
	times := make([][]time.Duration, 2)
	for b.Loop() {
		for i, pq := range []rego.PreparedEvalQuery{general, residual} {
			t0 := time.Now()
			rs, err := pq.Eval(b.Context(), rego.EvalParsedInput(val))
			times[i] = append(times[i], time.Since(t0))
			if err != nil || len(rs) != 1 || len(rs[0].Expressions) != 1 {
				b.Fatal("want one result", err)
			}
			if got := rs[0].Expressions[0].Value; want == nil {
				want = got
			} else if fmt.Sprint(got) != fmt.Sprint(want) {
				b.Fatalf("the residual decides %v, the policy %v", got, want)
			}
		}
	}
	med := func(d []time.Duration) float64 {
		s := slices.Clone(d)
		slices.Sort(s)
		return float64(s[len(s)/2].Nanoseconds())
	}
	b.ReportMetric(med(times[0]), "general-ns")
	b.ReportMetric(med(times[1]), "residual-ns")
	b.ReportMetric(med(times[1])/med(times[0]), "residual/general")
}

// preparedPolicy prepares the embedded policy with rego alone, as `opa bench` does.
func preparedPolicy(b *testing.B) rego.PreparedEvalQuery {
	b.Helper()
	mods, err := policies.Modules()
	require.NoError(b, err)
	opts := []func(*rego.Rego){rego.Query(decision.Query)}
	for name, src := range mods {
		opts = append(opts, rego.Module(name, src))
	}
	pq, err := rego.New(opts...).PrepareForEval(b.Context())
	require.NoError(b, err)
	return pq
}

// BenchmarkEvaluateCacheHit is the engine's part of a repeated decision: the cache key of an
// assembled input, the lookup, and a fresh decision id.
func BenchmarkEvaluateCacheHit(b *testing.B) {
	req, facts := benchFixture(b)
	eng := decisiontest.EmbeddedEngine(b, decision.Options{})
	in := snapshot.Build(b.Context(), req, facts, snapshot.Options{})
	b.ReportAllocs()
	for b.Loop() {
		if d, err := eng.Evaluate(b.Context(), in); err != nil || !d.Allow {
			b.Fatal("want a grant", err)
		}
	}
	if s := eng.CacheStats(); s.Misses != 1 {
		b.Fatalf("want one miss, got %+v", s)
	}
}

// BenchmarkManifestSize is one decision (input assembly and evaluation, no cache) on a plugin
// whose manifest has 1 or 256 entries, the looked-up one first. "full" carries the whole manifest
// in the input, as the input did before it carried only the looked-up entries ("index"): the
// cost of "index" does not grow with the manifest, that of "full" does.
func BenchmarkManifestSize(b *testing.B) {
	for _, n := range []int{1, 256} {
		f := specexamples.NewFixture()
		manifest := f.Plugin()["manifest"].(map[string]any)
		entries := manifest["environmentDrivers"].([]any)
		for i := 1; i < n; i++ {
			e := maps.Clone(f.Entry())
			e["driverKey"] = fmt.Sprintf("other.driver.%d", i)
			e["sandboxCapabilities"] = maps.Clone(f.Entry()["sandboxCapabilities"].(map[string]any))
			entries = append(entries, e)
		}
		manifest["environmentDrivers"] = entries
		reqJSON, factsJSON := f.JSON()
		facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
		require.NoError(b, err)
		req, err := snapshot.ParseRequestBytes(reqJSON)
		require.NoError(b, err)
		pf, ok := facts.Plugin("test.plugin")
		require.True(b, ok)
		require.Len(b, pf.Record["manifest"].(map[string]any)["environmentDrivers"], n)
		eng := decisiontest.EmbeddedEngine(b, uncached)
		for _, input := range []string{"full", "index"} {
			b.Run(fmt.Sprintf("entries=%d/input=%s", n, input), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					in := snapshot.Build(b.Context(), req, facts, snapshot.Options{})
					if input == "full" {
						in["facts"].(map[string]any)["plugin"] = pf.Record
					}
					if d, err := eng.Evaluate(b.Context(), in); err != nil || !d.Allow {
						b.Fatal("want a grant", err)
					}
				}
			})
		}
	}
}
