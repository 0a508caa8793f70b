package snapshot

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
)

func nested(depth int) string {
	return strings.Repeat(`{"a":`, depth) + `1` + strings.Repeat(`}`, depth)
}

func TestRequestBounds(t *testing.T) {
	long := strings.Repeat("x", MaxRequestStringBytes+1)
	fits := strings.Repeat("x", MaxRequestStringBytes)
	tests := []struct {
		name    string
		body    string
		wantErr string // "" means accepted
	}{
		{name: "deepest accepted", body: `{"lease":{"metadata":` + nested(MaxRequestDepth-2) + `}}`},
		{name: "one level too deep", body: `{"lease":{"metadata":` + nested(MaxRequestDepth-1) + `}}`,
			wantErr: fmt.Sprintf("request field lease.metadata%s is nested deeper than the limit of %d levels", strings.Repeat(".a", MaxRequestDepth-2), MaxRequestDepth)},
		{name: "deep arrays", body: `{"command":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
			wantErr: "request field command[0][0]"},
		{name: "far too deep for the JSON decoder", body: `{"command":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`,
			wantErr: "not valid JSON"},
		{name: "longest string", body: `{"command":["sh","-c","` + fits + `"]}`},
		{name: "string too long", body: `{"command":["sh","-c","` + long + `"]}`,
			wantErr: fmt.Sprintf("request field command[2] is a string of %d bytes, over the limit of %d bytes", len(long), MaxRequestStringBytes)},
		{name: "key too long", body: `{"environment":{"` + long + `":1}}`,
			wantErr: "request field environment has a key of"},
		// A string is measured once decoded: escapes count as the byte they stand for.
		{name: "escaped string that fits once decoded", body: `{"command":["` + strings.Repeat(`\t`, MaxRequestStringBytes) + `"]}`},
		{name: "escaped string too long once decoded", body: `{"command":["` + strings.Repeat(`\t`, MaxRequestStringBytes+1) + `"]}`,
			wantErr: fmt.Sprintf("request field command[0] is a string of %d bytes", MaxRequestStringBytes+1)},
		{name: "escaped key too long once decoded", body: `{"lease":{"` + strings.Repeat(`\n`, MaxRequestStringBytes+1) + `":true}}`,
			wantErr: "request field lease has a key of"},
		// The same bounds hold for a request encoding/json decodes (a non-ASCII string).
		{name: "string too long beside a non-ASCII one", body: `{"environment":{"name":"é"},"command":["` + long + `"]}`,
			wantErr: fmt.Sprintf("request field command[0] is a string of %d bytes", len(long))},
		{name: "one level too deep beside a non-ASCII string", body: `{"environment":{"name":"é"},"lease":{"metadata":` + nested(MaxRequestDepth-1) + `}}`,
			wantErr: "is nested deeper than the limit"},
		{name: "operation too long is still a bad operation", body: `{"operation":"` + long + `"}`, wantErr: "request field operation is a string"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseRequest(strings.NewReader(tt.body))
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, coded.BadRequest, coded.CodeOf(err))
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.NotContains(t, err.Error(), "\n", "one line")
			assert.Less(t, len(err.Error()), 1024, "the message names the limit, not the value")
		})
	}
}

// A number the policy engine cannot represent, in a field the policy does not read, leaves the
// request decidable: the input document converts for OPA, with the number's literal text.
func TestRequestOutOfRangeNumbers(t *testing.T) {
	req, err := ParseRequest(strings.NewReader(`{"environment":{"config":{"size":1e40000,"n":[-1e-40000, 1e400, 2]}},
		"lease":{"metadata":{"pluginId":"p","weight":1E+99999999}},"command":[1e40000]}`))
	require.NoError(t, err)
	in := Build(context.Background(), req, mustFacts(t, `{}`), Options{})
	_, err = ast.InterfaceToValue(map[string]any(in))
	require.NoError(t, err)
	cfg := req.Environment["config"].(map[string]any)
	assert.Equal(t, "1e40000", cfg["size"])
	n := cfg["n"].([]any)
	assert.Equal(t, "-1e-40000", n[0])
	assert.Equal(t, "1e400", fmt.Sprint(n[1]), "representable: kept as a number")
	assert.IsType(t, n[2], n[1])
	assert.Equal(t, "1E+99999999", req.Metadata["weight"])
	assert.Equal(t, []any{"1e40000"}, req.Command)
}

// A facts file holding a number the policy engine cannot represent is refused at load, instead
// of turning every decision on it into an evaluation failure.
func TestFactsOutOfRangeNumbers(t *testing.T) {
	_, err := ParseFacts(strings.NewReader(`{"plugins":[{"id":"p","manifest":{"environmentDrivers":[{"weight":1e40000}]}}]}`))
	require.Error(t, err)
	assert.Equal(t, coded.BadFacts, coded.CodeOf(err))
	assert.Equal(t, "facts.plugins[0].manifest.environmentDrivers[0].weight: the number 1e40000 is out of the range the policy engine accepts", err.Error())

	f, err := ParseFacts(strings.NewReader(`{"plugins":[{"id":"p","n":1e400}],"builtinProviders":{"b":{"x":12345678901234567890}}}`))
	require.NoError(t, err, "large but representable numbers are facts like any other")
	_, err = ast.InterfaceToValue(map[string]any(Build(context.Background(), mustRequest(t, `{"lease":{"metadata":{"pluginId":"p","provider":"b"}}}`), f, Options{})))
	require.NoError(t, err)
}
