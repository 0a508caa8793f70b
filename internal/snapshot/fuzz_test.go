package snapshot_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/coded"
	"github.com/authz-dev/authz/internal/snapshot"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/specoracle"
	"github.com/authz-dev/authz/internal/testutil"
)

// FuzzParseRequest: request parsing never panics, refuses exactly what the contract calls a bad
// request (as the independent oracle reads it), and an accepted request is well-formed and
// assembles into an input without panicking.
func FuzzParseRequest(f *testing.F) {
	reqJSON, factsJSON := specexamples.NewFixture().JSON()
	f.Add(reqJSON)
	for _, s := range []string{`{}`, `[]`, `null`, `{"operation": null}`, `{"operation": "getRunnerIngressEndpoint"}`,
		`{"lease": {"metadata": null}}`, `{"environment": 1}`, `{"lease": []}`, `{"a": 1} {}`, `{"command": [1, {"x": null}]}`} {
		f.Add([]byte(s))
	}
	facts, err := snapshot.ParseFacts(bytes.NewReader(factsJSON))
	require.NoError(f, err)
	var factsVal any
	require.True(f, testutil.DecodeOneJSON(factsJSON, &factsVal))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := snapshot.ParseRequest(bytes.NewReader(b))
		var val any
		if !testutil.DecodeOneJSON(b, &val) {
			require.Error(t, err, "not one JSON value, yet accepted: %q", b)
			assert.Equal(t, coded.BadRequest, coded.CodeOf(err))
			return
		}
		_, oerr := specoracle.Decide(val, factsVal)
		if errors.Is(oerr, specoracle.ErrBadRequest) {
			require.Error(t, err, "the oracle refuses %q", b)
			assert.Equal(t, coded.BadRequest, coded.CodeOf(err))
			return
		}
		require.NoError(t, err, "the oracle accepts %q", b)
		assert.Contains(t, []string{snapshot.OpOpenDuplexChannel, snapshot.OpGetRunnerIngressEndpoint}, req.Operation)
		require.NotNil(t, req.Environment)
		require.NotNil(t, req.Lease)
		require.NotNil(t, req.Metadata)
		in := snapshot.Build(t.Context(), req, facts, snapshot.Options{})
		assert.Equal(t, req.Operation, in["operation"])
	})
}

// FuzzParseFacts: facts parsing never panics and refuses exactly what the contract calls
// malformed facts (as the oracle reads them, with a well-formed request).
func FuzzParseFacts(f *testing.F) {
	reqJSON, factsJSON := specexamples.NewFixture().JSON()
	f.Add(factsJSON)
	for _, s := range []string{`{}`, `[]`, `null`, `{"plugins": null}`, `{"plugins": [{"id": ""}]}`,
		`{"plugins": [{"id": "a"}, {"id": "a"}]}`, `{"workers": {"a": 1}}`, `{"builtinProviders": {"fake": {"execute": true}}}`,
		`{"workers": {"a": {"supportedMethods": ["x", 1], "configValid": null}}}`} {
		f.Add([]byte(s))
	}
	var reqVal any
	require.True(f, testutil.DecodeOneJSON(reqJSON, &reqVal))
	req, err := snapshot.ParseRequest(bytes.NewReader(reqJSON))
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, b []byte) {
		facts, err := snapshot.ParseFacts(bytes.NewReader(b))
		var val any
		if !testutil.DecodeOneJSON(b, &val) {
			require.Error(t, err, "not one JSON value, yet accepted: %q", b)
			assert.Equal(t, coded.BadFacts, coded.CodeOf(err))
			return
		}
		_, oerr := specoracle.Decide(reqVal, val)
		if errors.Is(oerr, specoracle.ErrBadFacts) {
			require.Error(t, err, "the oracle refuses %q", b)
			assert.Equal(t, coded.BadFacts, coded.CodeOf(err))
			return
		}
		require.NoError(t, err, "the oracle accepts %q", b)
		_ = snapshot.Build(t.Context(), req, facts, snapshot.Options{})
	})
}
