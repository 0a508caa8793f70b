package decision_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/api"
	"github.com/authz-dev/authz/internal/decision"
	"github.com/authz-dev/authz/internal/decision/decisiontest"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
)

// decide runs a fixture through the public path: JSON bytes → parsers → engine.
func decide(t testing.TB, eng *decision.Engine, f specexamples.Fixture) decision.Document {
	t.Helper()
	reqJSON, factsJSON := f.JSON()
	req, err := snapshot.ParseRequest(bytes.NewReader(reqJSON))
	require.NoError(t, err)
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	require.NoError(t, err)
	doc, _, err := eng.Decide(t.Context(), req, facts)
	require.NoError(t, err)
	return doc
}

func newEngine(t testing.TB) *decision.Engine {
	t.Helper()
	eng := decisiontest.EmbeddedEngine(t, decision.Options{})
	return eng
}

// TestSpecExamples is docs/contract.md, "Worked examples", row by row.
func TestSpecExamples(t *testing.T) {
	eng := newEngine(t)
	for _, ex := range specexamples.Rows() {
		t.Run(ex.Name, func(t *testing.T) {
			d := decide(t, eng, ex.Fixture())
			assert.Equal(t, ex.Allow, d.Allow)
			assert.Equal(t, ex.Code, d.Code)
			assert.Equal(t, ex.Message, d.Message)
			if ex.Allow {
				assert.Equal(t, []string{}, d.Reasons)
			} else {
				assert.Equal(t, ex.Reasons, d.Reasons)
			}
			for k, v := range ex.Also {
				assert.Equal(t, v, d.Capabilities.Get(k), k)
			}
			assert.NotEmpty(t, d.DecisionID)
			assert.Equal(t, eng.Revision(), d.Revision)
		})
	}
}

// TestDocumentJSONHasEveryKey checks the wire shape of docs/contract.md, "The decision document".
func TestDocumentJSONHasEveryKey(t *testing.T) {
	d := decide(t, newEngine(t), specexamples.NewFixture())
	b, err := json.Marshal(d)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	for _, k := range []string{"allow", "code", "message", "reasons", "capabilities", "decision_id", "revision"} {
		assert.Contains(t, m, k)
	}
	assert.Equal(t, []any{}, m["reasons"], "a grant has an empty reasons array, not null")
	caps := m["capabilities"].(map[string]any)
	assert.Len(t, caps, 9)
	for _, k := range api.CapabilityKeys {
		assert.IsType(t, true, caps[k], k)
	}
}

func TestDecisionIDsAreFresh(t *testing.T) {
	eng := newEngine(t)
	f := specexamples.NewFixture()
	a, b := decide(t, eng, f), decide(t, eng, f)
	assert.NotEqual(t, a.DecisionID, b.DecisionID)
	assert.Equal(t, a.Revision, b.Revision)
	// A decision id is a random (version 4, RFC 9562 variant) UUID in its canonical form.
	for _, id := range []string{a.DecisionID, b.DecisionID} {
		u, err := uuid.Parse(id)
		require.NoError(t, err, id)
		assert.Equal(t, u.String(), id)
		assert.Equal(t, uuid.Version(4), u.Version(), id)
		assert.Equal(t, uuid.RFC4122, u.Variant(), id)
	}
}
