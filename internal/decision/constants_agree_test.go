package decision_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
)

// TestConstantsAgreeWithTheGeneralPath: the engine, which hands OPA the policy's literal rules
// (its tables) evaluated once per activation, decides as OPA evaluating them in every query, on
// every worked example of the contract and on generated requests and facts.
func TestConstantsAgreeWithTheGeneralPath(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 100
	}
	opts := decision.Options{Cache: decision.CacheOptions{Disabled: true}}
	fast := decisiontest.EmbeddedEngine(t, opts)
	general := decisiontest.EmbeddedEngine(t, opts)
	general.WithoutConstants()
	checked, grants := 0, 0
	check := func(name string, reqJSON, factsJSON []byte) {
		t.Helper()
		req, rerr := snapshot.ParseRequestBytes(reqJSON)
		facts, ferr := snapshot.ParseFacts(bytes.NewReader(factsJSON))
		if rerr != nil || ferr != nil {
			return
		}
		in := snapshot.Build(t.Context(), req, facts, snapshot.Options{})
		want, werr := general.Evaluate(t.Context(), in)
		got, gerr := fast.Evaluate(t.Context(), in)
		require.Equal(t, werr == nil, gerr == nil, name)
		want.DecisionID, got.DecisionID = "", ""
		require.Equal(t, want, got, "%s: request %s facts %s", name, reqJSON, factsJSON)
		checked++
		if got.Allow {
			grants++
		}
	}
	for _, row := range specexamples.Rows() {
		reqJSON, factsJSON := row.Fixture().JSON()
		check(row.Name, reqJSON, factsJSON)
	}
	g := gen{r: rand.New(rand.NewPCG(20261207, 29))}
	for i := range n {
		g.friendly = i%2 == 0
		reqJSON, _ := roundTrip(t, g.request())
		factsJSON, _ := roundTrip(t, g.facts())
		check("generated", reqJSON, factsJSON)
	}
	require.Greater(t, checked, n/2)
	require.Greater(t, grants, n/50, "grants must be among the cases")
}
