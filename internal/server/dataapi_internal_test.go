package server

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMisdirectedDataBody: a Data API body is recognised however its key "input" is spelled,
// and a request is not taken for one.
func TestMisdirectedDataBody(t *testing.T) {
	tests := []struct {
		name string
		body string
		want bool
	}{
		{name: "data api body", body: `{"input": {"lease": {}}}`, want: true},
		{name: "escaped letter", body: `{"\u0069nput": {}}`, want: true},
		{name: "escaped last letter", body: `{"inpu\u0074": 1}`, want: true},
		{name: "input and a request member", body: `{"input": {}, "lease": {}}`},
		{name: "request", body: `{"operation": "openDuplexChannel", "lease": {"metadata": {}}}`},
		{name: "input as a value", body: `{"command": ["input"]}`},
		{name: "key input nested", body: `{"lease": {"input": 1}}`},
		{name: "not json", body: `{"input": `},
		{name: "not an object", body: `["input"]`},
		{name: "escaped backslash then u", body: `{"a": "\\u", "input": 1}`, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, misdirectedDataBody([]byte(tt.body)))
			assert.Equal(t, tt.want, namesInputOnly([]byte(tt.body)), "the full check")
		})
	}
}

// FuzzMayNameInput: the cheap test that skips decoding never skips a body that decodes to an
// object with the key "input".
func FuzzMayNameInput(f *testing.F) {
	for _, s := range []string{`{"input": {}}`, `{"\u0069nput": {}}`, `{"inp\u0075t": 1}`, `{"in\u0070ut": 1, "lease": {}}`,
		`{"operation": "openDuplexChannel"}`, `{"input" : 1}`, "{\"input\"\n:1}", `{"a": "\"input\""}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var top map[string]any
		if err := json.Unmarshal(body, &top); err != nil {
			return
		}
		if _, ok := top["input"]; ok {
			require.True(t, mayNameInput(body), "a body with the key input is skipped: %q", body)
		}
		require.Equal(t, namesInputOnly(body), misdirectedDataBody(body), "%q", body)
	})
}
