package policy

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJSONCopySharesNothing: what the decision log hands OPA's mask rules shares no map or slice
// with the decision, whatever Go types the decision holds, and is equal to it as JSON.
func TestJSONCopySharesNothing(t *testing.T) {
	inner := map[string]any{"id": "p", "methods": []any{"a", json.Number("1"), true, nil}}
	typed := map[string]string{"k": "v"}
	orig := map[string]any{"facts": inner, "typed": typed, "list": []any{inner}}

	got, err := jsonCopy(orig)
	require.NoError(t, err)
	want, err := json.Marshal(orig)
	require.NoError(t, err)
	gotJSON, err := json.Marshal(got)
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(gotJSON))

	c := got.(map[string]any)
	delete(c["facts"].(map[string]any), "id")
	c["facts"].(map[string]any)["methods"].([]any)[0] = "changed"
	c["list"].([]any)[0].(map[string]any)["id"] = "changed"
	c["typed"].(map[string]any)["k"] = "changed"
	assert.Equal(t, "p", inner["id"])
	assert.Equal(t, "a", inner["methods"].([]any)[0])
	assert.Equal(t, "v", typed["k"])

	_, err = jsonCopy(map[string]any{"f": func() {}})
	assert.Error(t, err, "a value JSON cannot hold is an error, not a shared value")
}
