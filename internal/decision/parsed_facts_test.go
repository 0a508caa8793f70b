package decision_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
)

// unindexedFacts hands out its plugins without an index and with a worker whose process has
// ended, the two paths of snapshot.Build a facts file does not take.
type unindexedFacts struct {
	*snapshot.FileFacts
	dead bool
}

func (f unindexedFacts) Plugin(id string) (snapshot.PluginFacts, bool) {
	p, ok := f.FileFacts.Plugin(id)
	if !ok {
		return p, false
	}
	p.Index = nil
	if p.Worker != nil && f.dead {
		p.Worker = snapshot.NewWorker(p.Worker.Generation, p.Worker.SupportedMethods, func() bool { return false })
	}
	return p, true
}

// TestParsedFactsAgreeWithTheGeneralPath: the facts Decide hands OPA already parsed (converted
// once per facts generation, snapshot.BuildParsed) are exactly the conversion of the input's
// facts, and Decide (which uses them) decides as Evaluate of the same input (which converts the
// whole input), on every worked example of the contract and on generated requests and facts,
// through an index, without one, with a merged manifest and with a worker that has ended.
func TestParsedFactsAgreeWithTheGeneralPath(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 100
	}
	eng := decisiontest.EmbeddedEngine(t, decision.Options{Cache: decision.CacheOptions{Disabled: true}})
	checked := 0
	check := func(name string, reqJSON, factsJSON []byte) {
		t.Helper()
		req, rerr := snapshot.ParseRequestBytes(reqJSON)
		file, ferr := snapshot.ParseFacts(bytes.NewReader(factsJSON))
		if rerr != nil || ferr != nil {
			return
		}
		for _, facts := range []snapshot.Facts{file, unindexedFacts{FileFacts: file}, unindexedFacts{FileFacts: file, dead: true}} {
			in, parsed := snapshot.BuildParsed(context.Background(), req, facts, snapshot.Options{})
			want, err := ast.InterfaceToValue(in["facts"])
			require.NoError(t, err)
			got := parsed.Value()
			require.NotNil(t, got, name)
			require.Equal(t, 0, want.Compare(got), "%s: parsed facts %v, want %v", name, got, want)

			decided, _, derr := eng.Decide(t.Context(), req, facts)
			evaluated, eerr := eng.Evaluate(t.Context(), in)
			require.Equal(t, eerr == nil, derr == nil, name)
			decided.DecisionID, evaluated.DecisionID = "", ""
			// The worker's liveness is read again by Decide; a facts source whose worker
			// has ended gives both the same input.
			require.Equal(t, evaluated, decided, "%s: request %s facts %s", name, reqJSON, factsJSON)
			checked++
		}
	}
	for _, row := range specexamples.Rows() {
		reqJSON, factsJSON := row.Fixture().JSON()
		check(row.Name, reqJSON, factsJSON)
	}
	// A lease on the plugin driver whose driverKey and provider key both have entries: the
	// record carries the two keys' entries merged, made for the decision.
	f := specexamples.NewFixture()
	f.Metadata()["driver"] = "plugin"
	f.Metadata()["driverKey"] = "other"
	entries := f.Plugin()["manifest"].(map[string]any)["environmentDrivers"].([]any)
	other := map[string]any{"driverKey": "other", "kind": "environment_driver"}
	f.Plugin()["manifest"].(map[string]any)["environmentDrivers"] = append([]any{other}, entries...)
	reqJSON, factsJSON := f.JSON()
	check("merged manifest", reqJSON, factsJSON)

	g := gen{r: rand.New(rand.NewPCG(20261207, 28))}
	for i := range n {
		g.friendly = i%2 == 0
		reqJSON, _ := roundTrip(t, g.request())
		factsJSON, _ := roundTrip(t, g.facts())
		check("generated", reqJSON, factsJSON)
	}
	require.Greater(t, checked, n, "the generator must give decidable cases")
}

// TestConcurrentDecisionsShareParsedValues: decisions in parallel on one engine share the parsed
// facts (one plugin record and worker) and the policy's constants; run with -race, no decision
// may write what another reads, and every one grants as the first did.
func TestConcurrentDecisionsShareParsedValues(t *testing.T) {
	eng := decisiontest.EmbeddedEngine(t, decision.Options{Cache: decision.CacheOptions{Disabled: true}})
	reqJSON, factsJSON := specexamples.NewFixture().JSON()
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	require.NoError(t, err)
	want, _, err := eng.Decide(t.Context(), mustRequest(t, reqJSON), facts)
	require.NoError(t, err)
	require.True(t, want.Allow)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 50 {
				got, _, err := eng.Decide(context.Background(), mustRequest(t, reqJSON), facts)
				if err == nil && got.Capabilities != want.Capabilities {
					err = errors.New("a concurrent decision differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
}

func mustRequest(t testing.TB, b []byte) *snapshot.Request {
	req, err := snapshot.ParseRequestBytes(b)
	if err != nil {
		t.Error(err)
	}
	return req
}
