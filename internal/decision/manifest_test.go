package decision_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/specoracle"
)

// bigFacts is g.facts() with the manifests of its plugins grown past the host's limit of 256
// entries: the entries of the generated keys (duplicates included) sit at random places among
// hundreds of entries of other keys, non-object entries and entries whose driverKey is not a
// string. The input carries only the looked-up entries; the oracle reads the whole manifest.
func (g gen) bigFacts() any {
	f := g.facts()
	fm, ok := f.(map[string]any)
	if !ok {
		return f
	}
	plugins, ok := fm["plugins"].([]any)
	if !ok {
		return f
	}
	for _, p := range plugins {
		manifest, ok := p.(map[string]any)["manifest"].(map[string]any)
		if !ok {
			continue
		}
		entries, ok := manifest["environmentDrivers"].([]any)
		if !ok {
			continue
		}
		// Duplicates of the looked-up keys, one time in four.
		if g.chance(0.25) {
			entries = append(entries, g.entry(g.pick("daytona", "dk", "fake")))
		}
		n := 256 + g.r.IntN(64)
		for i := range n {
			var filler any
			switch g.r.IntN(8) {
			case 0:
				filler = g.pick("daytona", "dk", nil, 1, []any{"daytona"}, []any{map[string]any{"driverKey": "daytona"}})
			case 1:
				filler = map[string]any{"driverKey": g.pick(1, nil, true, []any{"daytona"}, map[string]any{"daytona": true}), "kind": "sandbox_provider"}
			case 2:
				filler = map[string]any{"kind": "sandbox_provider", "sandboxCapabilities": map[string]any{"environmentExecute": true}}
			default:
				filler = g.entry(fmt.Sprintf("other%d", i))
			}
			at := g.r.IntN(len(entries) + 1)
			entries = append(entries[:at], append([]any{filler}, entries[at:]...)...)
		}
		manifest["environmentDrivers"] = entries
		manifest["version"] = "2"
	}
	return f
}

// TestBigManifestAgreesWithOracle: with manifests of hundreds of entries around the looked-up
// keys (duplicates, non-objects, keys of other types), the engine, which carries only the
// entries of the keys it looks up, decides exactly as the oracle that reads the whole manifest.
func TestBigManifestAgreesWithOracle(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 100
	}
	eng := newEngine(t)
	g := gen{r: rand.New(rand.NewPCG(20261130, 7))}
	grants, invalid := 0, 0
	for i := range n {
		g.friendly = i%2 == 0
		reqJSON, reqVal := roundTrip(t, g.request())
		factsJSON, factsVal := roundTrip(t, g.bigFacts())
		checkAgainstOracle(t, eng, reqJSON, factsJSON, reqVal, factsVal)
		if d, err := specoracle.Decide(reqVal, factsVal); err == nil {
			if d.Allow {
				grants++
			}
			if len(d.Reasons) == 1 && d.Reasons[0] == "driver_entry_invalid" {
				invalid++
			}
		}
	}
	require.Greater(t, grants, n/50, "too few grants generated: the property would be vacuous")
	require.Positive(t, invalid, "no duplicate entry generated: the property would miss them")
	t.Logf("%d cases, %d grants, %d invalid entries", n, grants, invalid)
}
