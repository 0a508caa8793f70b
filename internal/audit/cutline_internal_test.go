package audit

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCutLineNamesEachMembersEncodedSize: the size a cut note gives for a member is the length
// json.Marshal writes for it, for members of every kind (escaped and non-ASCII strings, numbers,
// nested objects and arrays), now that the sizes are added up from the members' own.
func TestCutLineNamesEachMembersEncodedSize(t *testing.T) {
	var members []any
	members = append(members,
		strings.Repeat("<a&b>\"\\\n", 40),
		strings.Repeat("é€😀", 60),
		map[string]any{"n": json.Number("12.5e3"), "list": []any{true, nil, "x", json.Number("-1")}, "s": strings.Repeat("y", 300)},
		[]any{map[string]any{"a<b": strings.Repeat("z", 200)}, []any{}, map[string]any{}},
	)
	input := map[string]any{"lease": map[string]any{"id": "lease-1"}}
	want := map[string]int{}
	for i, m := range members {
		b, err := json.Marshal(m)
		require.NoError(t, err)
		input[fmt.Sprintf("m%d", i)] = m
		want[fmt.Sprintf("/input/m%d", i)] = len(b)
	}
	l := &decisionLog{}
	whole, err := json.Marshal(logEntry{DecisionID: "d", Input: input})
	require.NoError(t, err)
	// Room for the line with every member cut, not with any one of them whole.
	line, err := l.cutLine(logEntry{DecisionID: "d", Input: input}, len(whole)-want["/input/m3"]-want["/input/m2"]-want["/input/m1"]-want["/input/m0"]+4*60+120)
	require.NoError(t, err)
	var got struct {
		Input map[string]any `json:"input"`
		Cut   []string       `json:"cut"`
	}
	require.NoError(t, json.Unmarshal(line, &got))
	assert.ElementsMatch(t, []string{"/input/m0", "/input/m1", "/input/m2", "/input/m3"}, got.Cut)
	for path, size := range want {
		name := strings.TrimPrefix(path, "/input/")
		require.Contains(t, got.Input, name)
		assert.Equal(t, fmt.Sprintf(cutNote, size), got.Input[name], path)
	}
}
