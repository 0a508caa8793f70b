package decision_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/policies"
)

// commonAgreeQuery evaluates, on one input, the policy's common path (the snapshot and the
// reasons of a plugin-backed lease whose identity the facts confirm, read in one rule body each)
// and its general path (the contract's rules one by one), for every capability of the table.
const commonAgreeQuery = `common := [c | c := data.authz._common_capabilities]
general := data.authz._general_capabilities
common_reasons := {k: r | some k, _ in data.authz.tables.capabilities; r := data.authz._common_reasons(k)}
general_reasons := {k: r | some k, _ in data.authz.tables.capabilities; r := data.authz._general_reasons(k)}
doc := data.authz.decision
explained := {"allow": false, "code": data.authz.code, "message": data.authz.message, "reasons": data.authz.reasons, "capabilities": general}`

// TestCommonPathAgreesWithTheGeneralPath: wherever the policy takes its common path (the
// snapshot of _common_capabilities, the reasons of _common_reasons, the decision's common grant
// and deny), the general path gives the same snapshot and, for every capability, the same
// reasons; where it does not, _common_reasons is undefined; and every deny is what the general
// rules explain (code, message, reasons of the first failing check, the general snapshot). On
// every worked example of the contract and on generated requests and facts, with grants and
// denies among the common cases.
func TestCommonPathAgreesWithTheGeneralPath(t *testing.T) {
	n := 1500
	if testing.Short() {
		n = 300
	}
	mods, err := policies.Modules()
	require.NoError(t, err)
	opts := []func(*rego.Rego){rego.Query(commonAgreeQuery)}
	for name, src := range mods {
		opts = append(opts, rego.Module(name, src))
	}
	pq, err := rego.New(opts...).PrepareForEval(t.Context())
	require.NoError(t, err)

	checked, commonGrants, commonDenies, denies := 0, 0, 0, 0
	check := func(name string, reqJSON, factsJSON []byte) {
		t.Helper()
		req, rerr := snapshot.ParseRequestBytes(reqJSON)
		facts, ferr := snapshot.ParseFacts(bytes.NewReader(factsJSON))
		if rerr != nil || ferr != nil {
			return
		}
		in := snapshot.Build(t.Context(), req, facts, snapshot.Options{})
		rs, err := pq.Eval(t.Context(), rego.EvalInput(map[string]any(in)))
		require.NoError(t, err)
		require.Len(t, rs, 1, "%s: request %s facts %s", name, reqJSON, factsJSON)
		b := rs[0].Bindings
		ctx := []any{"%s: request %s facts %s", name, reqJSON, factsJSON}
		general, generalReasons := b["general"].(map[string]any), b["general_reasons"].(map[string]any)
		require.Len(t, general, len(api.CapabilityKeys), ctx...)
		require.Len(t, generalReasons, len(general), ctx...)
		checked++
		switch common := b["common"].([]any); len(common) {
		case 0:
			require.Empty(t, b["common_reasons"], ctx...)
		case 1:
			require.Equal(t, general, common[0], ctx...)
			require.Equal(t, generalReasons, b["common_reasons"], ctx...)
			doc := b["doc"].(map[string]any)
			require.Equal(t, general, doc["capabilities"], ctx...)
			if doc["allow"] == true {
				commonGrants++
			} else {
				commonDenies++
			}
		default:
			t.Fatalf("_common_capabilities has %d values", len(common))
		}
		// A deny (but for a failed evaluation) carries what the general rules explain: the first
		// failing check's code and message, its reasons, the general snapshot.
		if doc := b["doc"].(map[string]any); doc["allow"] == false && !slices.Equal(doc["reasons"].([]any), []any{"evaluation_failed"}) {
			require.Equal(t, b["explained"], doc, ctx...)
			denies++
		}
	}
	for _, row := range specexamples.Rows() {
		reqJSON, factsJSON := row.Fixture().JSON()
		check(row.Name, reqJSON, factsJSON)
	}
	g := gen{r: rand.New(rand.NewPCG(20261208, 31))}
	for i := range n {
		g.friendly = i%2 == 0
		reqJSON, _ := roundTrip(t, g.request())
		factsJSON, _ := roundTrip(t, g.facts())
		check("generated", reqJSON, factsJSON)
	}
	require.Greater(t, checked, n/2)
	// The property says little unless the common path is taken, on grants and on denies.
	require.Greater(t, commonGrants, n/50, "too few common grants")
	require.Greater(t, commonDenies, n/50, "too few common denies")
	require.Greater(t, denies, commonDenies)
	t.Logf("%d cases, %d denies explained; the common path on %d grants and %d denies", checked, denies, commonGrants, commonDenies)
}
