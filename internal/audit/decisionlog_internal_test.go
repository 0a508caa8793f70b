package audit

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMaskValue(t *testing.T) {
	const doc = `{"lease":{"metadata":{"token":"t","keep":1,"a/b":"slash","~x":"tilde"}},
		"command":["sh","-c","secret"],
		"environment":{"config":{"apiKey":"k","provider":"p"}},
		"facts":{"plugin":{"manifest":{"environmentDrivers":[{"secret":1},{"secret":2}]}}}}`
	tests := []struct {
		name string
		mask string
		want string
	}{
		{name: "one field", mask: "/input/lease/metadata/token",
			want: `{"lease":{"metadata":{"token":"[MASKED]","keep":1,"a/b":"slash","~x":"tilde"}}}`},
		{name: "escaped slash", mask: "/input/lease/metadata/a~1b",
			want: `{"lease":{"metadata":{"token":"t","keep":1,"a/b":"[MASKED]","~x":"tilde"}}}`},
		{name: "escaped tilde", mask: "/input/lease/metadata/~0x",
			want: `{"lease":{"metadata":{"token":"t","keep":1,"a/b":"slash","~x":"[MASKED]"}}}`},
		{name: "array index", mask: "/input/command/2", want: `{"command":["sh","-c","[MASKED]"]}`},
		{name: "whole object", mask: "/input/environment/config", want: `{"environment":{"config":"[MASKED]"}}`},
		{name: "wildcard in object", mask: "/input/environment/config/*",
			want: `{"environment":{"config":{"apiKey":"[MASKED]","provider":"[MASKED]"}}}`},
		{name: "wildcard in array", mask: "/input/facts/plugin/manifest/environmentDrivers/*/secret",
			want: `{"facts":{"plugin":{"manifest":{"environmentDrivers":[{"secret":"[MASKED]"},{"secret":"[MASKED]"}]}}}}`},
		{name: "missing path changes nothing", mask: "/input/lease/metadata/nothing/deeper", want: `{}`},
		{name: "index out of range", mask: "/input/command/7", want: `{}`},
		{name: "non-canonical index", mask: "/input/command/02", want: `{}`},
		{name: "whole input", mask: "/input", want: `"[MASKED]"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in map[string]any
			require.NoError(t, json.Unmarshal([]byte(doc), &in))
			before, err := json.Marshal(in)
			require.NoError(t, err)

			segs, err := parseMask(tt.mask)
			require.NoError(t, err)
			got := maskValue(in, segs)

			after, err := json.Marshal(in)
			require.NoError(t, err)
			assert.JSONEq(t, string(before), string(after), "the original is never modified")

			// want lists only the parts that changed; the rest must equal the original.
			var want any
			require.NoError(t, json.Unmarshal([]byte(tt.want), &want))
			if wm, ok := want.(map[string]any); ok {
				var orig map[string]any
				require.NoError(t, json.Unmarshal([]byte(doc), &orig))
				want = merge(orig, wm)
			}
			gotJSON, err := json.Marshal(got)
			require.NoError(t, err)
			wantJSON, err := json.Marshal(want)
			require.NoError(t, err)
			assert.JSONEq(t, string(wantJSON), string(gotJSON))
		})
	}
}

// merge overlays patch onto base (objects merged key by key, anything else replaced).
func merge(base, patch map[string]any) map[string]any {
	for k, pv := range patch {
		if pm, ok := pv.(map[string]any); ok {
			if bm, ok := base[k].(map[string]any); ok {
				base[k] = merge(bm, pm)
				continue
			}
		}
		base[k] = pv
	}
	return base
}

func TestParseMaskRejects(t *testing.T) {
	for _, m := range []string{"", "input/x", "/result", "/inputs/x", "/input/", "/input//x", "/input/a~2"} {
		t.Run(m, func(t *testing.T) {
			_, err := parseMask(m)
			assert.Error(t, err)
		})
	}
}
