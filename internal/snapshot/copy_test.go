package snapshot

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCopyDocumentSharesNothing: a copy is equal to the document as JSON and shares no map or
// slice with it, at any depth, so a reader that edits the copy in place (OPA's decision-log
// masks) leaves the document alone.
func TestCopyDocumentSharesNothing(t *testing.T) {
	inner := map[string]any{"id": "p", "methods": []any{"a", json.Number("1"), true, nil}}
	orig := map[string]any{"facts": inner, "list": []any{inner}, "generation": uint64(3)}

	got := CopyDocument(orig)
	want, err := json.Marshal(orig)
	require.NoError(t, err)
	gotJSON, err := json.Marshal(got)
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(gotJSON))

	c := got.(map[string]any)
	delete(c["facts"].(map[string]any), "id")
	c["facts"].(map[string]any)["methods"].([]any)[0] = "changed"
	c["list"].([]any)[0].(map[string]any)["id"] = "changed"
	assert.Equal(t, "p", inner["id"])
	assert.Equal(t, "a", inner["methods"].([]any)[0])
}
