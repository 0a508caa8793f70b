package server_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/specoracle"
)

// FuzzAuthorize sends arbitrary bodies through the whole HTTP handler (parsing, input assembly,
// the decision cache, evaluation, the answer): it never panics, answers only the documented
// statuses, and never grants what the independent oracle refuses for the same request and facts.
func FuzzAuthorize(f *testing.F) {
	reqJSON, _ := specexamples.NewFixture().JSON()
	f.Add(reqJSON)
	for _, s := range []string{`{}`, `[]`, `null`, `{"operation": "getRunnerIngressEndpoint"}`,
		`{"lease": {"metadata": {"driver": "plugin", "pluginId": "test.plugin", "driverKey": "daytona"}}}`,
		`{"lease": {"metadata": {"sandboxProviderPlugin": "true", "pluginId": "test.plugin", "provider": "daytona"}}}`} {
		f.Add([]byte(s))
	}
	factsJSON, err := os.ReadFile(filepath.Join("testdata", "facts.json"))
	require.NoError(f, err)
	var factsVal any
	dec := json.NewDecoder(bytes.NewReader(factsJSON))
	dec.UseNumber()
	require.NoError(f, dec.Decode(&factsVal))
	h := newServer(f).Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/v1/authorize", "/v1/data/authz/decision"} {
			sent := body
			if path == "/v1/data/authz/decision" {
				sent = append(append([]byte(`{"input": `), body...), '}')
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, bytes.NewReader(sent)))
			require.Contains(t, []int{http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusInternalServerError}, rec.Code, rec.Body.String())
			if rec.Code != http.StatusOK {
				continue
			}
			var answer struct {
				Allow  *bool `json:"allow"`
				Result *struct {
					Allow bool `json:"allow"`
				} `json:"result"`
			}
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer))
			allow := answer.Allow != nil && *answer.Allow || answer.Result != nil && answer.Result.Allow
			if !allow {
				continue
			}
			var reqVal any
			d := json.NewDecoder(bytes.NewReader(body))
			d.UseNumber()
			require.NoError(t, d.Decode(&reqVal), "a grant for a body that is not JSON: %q", body)
			want, err := specoracle.Decide(reqVal, factsVal)
			require.NoError(t, err, "a grant for %q, which the oracle refuses", body)
			assert.True(t, want.Allow, "GRANT for %q; the oracle denies with %s %v", body, want.Code, want.Reasons)
		}
	})
}
