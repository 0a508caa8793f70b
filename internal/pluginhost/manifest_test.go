//go:build unix

package pluginhost

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specoracle"
)

// TestManifestAtLimitsDecidesAsTheOracle: a live plugin with 256 manifest entries decides, for
// keys at the start, middle and end of its manifest, of either kind, on both plugin paths, and
// for keys it does not have, exactly as the oracle says from the host's whole facts file; and
// the input carries only the looked-up entries.
func TestManifestAtLimitsDecidesAsTheOracle(t *testing.T) {
	runParallel(t)
	cfg := testConfig(t, boundsPlugin(t, "big", "-key", "bounds.big", "-entries", "255"))
	h, rec := startHost(t, cfg)
	require.Equal(t, StatusReady, settled(t, h, "big").Status)
	rec.record(h)
	eng := decisiontest.EmbeddedEngine(t, decision.Options{Cache: decision.CacheOptions{Disabled: true}})

	pf, ok := h.Plugin("big")
	require.True(t, ok)
	require.Len(t, pf.Record["manifest"].(map[string]any)["environmentDrivers"], 256)

	tests := []struct {
		name      string
		metadata  string
		wantAllow bool
		wantKeys  []string // driverKeys of the entries the input carries
	}{
		{name: "sandbox, first entry", metadata: `"driver": "sandbox", "sandboxProviderPlugin": true, "provider": "bounds"`,
			wantAllow: true, wantKeys: []string{"bounds"}},
		{name: "sandbox, entry of another kind", metadata: `"driver": "sandbox", "sandboxProviderPlugin": true, "provider": "extra128"`,
			wantKeys: []string{"extra128"}},
		{name: "sandbox, missing key", metadata: `"driver": "sandbox", "sandboxProviderPlugin": true, "provider": "nope"`,
			wantKeys: []string{}},
		{name: "plugin driver, last entry", metadata: `"driver": "plugin", "driverKey": "extra254"`,
			wantAllow: true, wantKeys: []string{"extra254"}},
		{name: "plugin driver, first entry", metadata: `"driver": "plugin", "driverKey": "bounds"`,
			wantAllow: true, wantKeys: []string{"bounds"}},
		{name: "plugin driver, missing key", metadata: `"driver": "plugin", "driverKey": "extra255"`,
			wantKeys: []string{}},
		{name: "both keys", metadata: `"driver": "plugin", "sandboxProviderPlugin": true, "provider": "extra200", "driverKey": "extra3"`,
			wantAllow: true, wantKeys: []string{"extra3", "extra200"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reqJSON := []byte(`{"environment": {"driver": "sandbox", "config": {}}, "lease": {"leasePolicy": "reuse_by_environment",
				"metadata": {"pluginId": "big", ` + tt.metadata + `}}}`)
			req, err := snapshot.ParseRequest(bytes.NewReader(reqJSON))
			require.NoError(t, err)

			in := snapshot.Build(t.Context(), req, h, snapshot.Options{})
			drivers := in["facts"].(map[string]any)["plugin"].(map[string]any)["manifest"].(map[string]any)["environmentDrivers"].([]any)
			keys := []string{}
			for _, e := range drivers {
				keys = append(keys, e.(map[string]any)["driverKey"].(string))
			}
			require.Equal(t, tt.wantKeys, keys)

			// The oracle reads the whole manifest of the host's facts file, with the worker's
			// answer to this request's config check.
			facts := h.FactsFile()
			if w, ok := facts.Workers["big"]; ok {
				valid, err := h.ConfigValid(t.Context(), "big", pf.Worker, "bounds", map[string]any{})
				w["configValid"] = err == nil && valid
			}
			var reqVal, factsVal any
			require.NoError(t, json.Unmarshal(reqJSON, &reqVal))
			require.NoError(t, json.Unmarshal([]byte(mustJSON(t, facts)), &factsVal))
			want, err := specoracle.Decide(reqVal, factsVal)
			require.NoError(t, err)

			got, _, err := eng.Decide(t.Context(), req, h)
			require.NoError(t, err)
			require.Equal(t, tt.wantAllow, want.Allow, "oracle: %s %v", want.Code, want.Reasons)
			require.Equal(t, want.Allow, got.Allow)
			require.Equal(t, want.Code, got.Code)
			require.Equal(t, want.Message, got.Message)
			require.Equal(t, want.Reasons, got.Reasons)
			require.Equal(t, want.Capabilities, decisiontest.CapabilityMap(got.Capabilities))
		})
	}
}
