package server_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/authz-dev/authz/internal/server"
	"github.com/authz-dev/authz/internal/specexamples"
	"github.com/authz-dev/authz/internal/testutil"
)

// toAuthZEN maps a request of the service onto an AuthZEN evaluation as docs/contract.md
// ("AuthZEN") writes the mapping: subject = lease, resource = environment, action = operation,
// context.command = command.
func toAuthZEN(t testing.TB, reqJSON []byte) map[string]any {
	t.Helper()
	var req map[string]any
	require.NoError(t, json.Unmarshal(reqJSON, &req))
	entity := func(typ string, v any) map[string]any {
		obj, _ := v.(map[string]any)
		props := map[string]any{}
		var id any
		for k, val := range obj {
			if k == "id" {
				id = val
				continue
			}
			props[k] = val
		}
		e := map[string]any{"type": typ, "properties": props}
		if id != nil {
			e["id"] = id
		}
		return e
	}
	op, ok := req["operation"].(string)
	if !ok {
		op = "openDuplexChannel"
	}
	e := map[string]any{
		"subject":  entity("lease", req["lease"]),
		"resource": entity("environment", req["environment"]),
		"action":   map[string]any{"name": op},
	}
	if cmd, ok := req["command"]; ok {
		e["context"] = map[string]any{"command": cmd}
	}
	return e
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// TestAuthZENAnswersEveryContractExampleAsAuthorize sends every worked example of the contract
// to /v1/authorize and, mapped, to the two AuthZEN endpoints: the decisions are the same.
func TestAuthZENAnswersEveryContractExampleAsAuthorize(t *testing.T) {
	for _, ex := range specexamples.Rows() {
		t.Run(ex.Name, func(t *testing.T) {
			reqJSON, factsJSON := ex.Fixture().JSON()
			path := filepath.Join(t.TempDir(), "facts.json")
			require.NoError(t, os.WriteFile(path, factsJSON, 0o600))
			facts, err := server.LoadStaticFacts(path)
			require.NoError(t, err)
			base := startHTTP(t, newServer(t, withFacts(facts)))

			want := post(t, base+"/v1/authorize", string(reqJSON))
			require.Equal(t, http.StatusOK, want.status, string(want.body))
			doc := want.json(t)
			require.Equal(t, ex.Allow, doc["allow"])

			eval := toAuthZEN(t, reqJSON)
			single := post(t, base+"/access/v1/evaluation", mustJSON(t, eval))
			require.Equal(t, http.StatusOK, single.status, string(single.body))
			batch := post(t, base+"/access/v1/evaluations", mustJSON(t, map[string]any{"evaluations": []any{eval}}))
			require.Equal(t, http.StatusOK, batch.status, string(batch.body))
			evaluations, ok := batch.json(t)["evaluations"].([]any)
			require.True(t, ok, string(batch.body))
			require.Len(t, evaluations, 1)

			for name, got := range map[string]map[string]any{"evaluation": single.json(t), "evaluations": evaluations[0].(map[string]any)} {
				assert.Equal(t, doc["allow"], got["decision"], name)
				ctx, ok := got["context"].(map[string]any)
				require.True(t, ok, name)
				for _, k := range []string{"code", "message", "reasons", "capabilities", "revision"} {
					assert.Equal(t, doc[k], ctx[k], "%s: %s", name, k)
				}
				assert.NotEmpty(t, ctx["decision_id"], name)
				assert.NotEqual(t, doc["decision_id"], ctx["decision_id"], "%s: every evaluation is a decision of its own", name)
			}
		})
	}
}

func TestAuthZENEvaluationsSemanticsAndDefaults(t *testing.T) {
	base := startHTTP(t, newServer(t))
	reqJSON, _ := specexamples.NewFixture().JSON()
	grant := toAuthZEN(t, reqJSON)
	localDriver := map[string]any{"subject": map[string]any{"type": "lease", "id": "lease-1", "properties": map[string]any{"metadata": map[string]any{"driver": "local"}}}}
	badItem := map[string]any{"subject": map[string]any{"type": "user", "id": "alice"}}

	// The top level gives resource, action and context; each item gives its subject.
	body := func(semantic string, items ...any) string {
		b := map[string]any{"resource": grant["resource"], "action": grant["action"], "context": grant["context"], "evaluations": items}
		if semantic != "" {
			b["options"] = map[string]any{"evaluations_semantic": semantic}
		}
		return mustJSON(t, b)
	}
	decisions := func(a answer) []bool {
		t.Helper()
		require.Equal(t, http.StatusOK, a.status, string(a.body))
		var out []bool
		for _, e := range a.json(t)["evaluations"].([]any) {
			out = append(out, e.(map[string]any)["decision"].(bool))
		}
		return out
	}
	items := []any{map[string]any{"subject": grant["subject"]}, localDriver, badItem, map[string]any{"subject": grant["subject"]}}

	assert.Equal(t, []bool{true, false, false, true}, decisions(post(t, base+"/access/v1/evaluations", body("", items...))), "execute_all is the default")
	assert.Equal(t, []bool{true, false, false, true}, decisions(post(t, base+"/access/v1/evaluations", body("execute_all", items...))))
	assert.Equal(t, []bool{true, false}, decisions(post(t, base+"/access/v1/evaluations", body("deny_on_first_deny", items...))))
	assert.Equal(t, []bool{true}, decisions(post(t, base+"/access/v1/evaluations", body("permit_on_first_permit", items...))))
	assert.Equal(t, []bool{false, false, true}, decisions(post(t, base+"/access/v1/evaluations", body("permit_on_first_permit", localDriver, badItem, map[string]any{"subject": grant["subject"]}))))

	// The item that is not a request of this service is a deny that says why, not a decision.
	a := post(t, base+"/access/v1/evaluations", body("", badItem))
	ctx := a.json(t)["evaluations"].([]any)[0].(map[string]any)["context"].(map[string]any)
	assert.Equal(t, "BAD_REQUEST", ctx["code"])
	assert.Contains(t, ctx["message"], `subject.type must be "lease"`)
	assert.Nil(t, ctx["decision_id"])

	// Without evaluations, it is one evaluation.
	one := post(t, base+"/access/v1/evaluations", mustJSON(t, grant))
	require.Equal(t, http.StatusOK, one.status, string(one.body))
	assert.Equal(t, true, one.json(t)["decision"])

	tooMany := make([]any, 65)
	for i := range tooMany {
		tooMany[i] = map[string]any{}
	}
	assert.Equal(t, http.StatusBadRequest, post(t, base+"/access/v1/evaluations", body("", tooMany...)).status)
	assert.Equal(t, http.StatusBadRequest, post(t, base+"/access/v1/evaluations", body("first_wins", items...)).status)
}

// TestAuthZENBadRequests: a request that is not an AuthZEN request of this service, or whose
// mapping would be a bad request on /v1/authorize, is the same 4xx, before any decision.
func TestAuthZENBadRequests(t *testing.T) {
	var log strings.Builder
	base := startHTTP(t, newServer(t, withDecisionLog(&log)))
	reqJSON, _ := specexamples.NewFixture().JSON()
	grant := toAuthZEN(t, reqJSON)
	with := func(k string, v any) string {
		e := map[string]any{}
		for kk, vv := range grant {
			e[kk] = vv
		}
		e[k] = v
		return mustJSON(t, e)
	}
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{name: "not JSON", body: "nope", status: http.StatusBadRequest},
		{name: "an array", body: "[]", status: http.StatusBadRequest},
		{name: "trailing data", body: mustJSON(t, grant) + " {}", status: http.StatusBadRequest},
		{name: "no subject", body: with("subject", nil), status: http.StatusBadRequest, want: "no subject"},
		{name: "subject of another type", body: with("subject", map[string]any{"type": "user", "id": "alice"}), status: http.StatusBadRequest, want: `subject.type must be "lease"`},
		{name: "resource of another type", body: with("resource", map[string]any{"type": "document", "id": "d"}), status: http.StatusBadRequest, want: `resource.type must be "environment"`},
		{name: "no action", body: with("action", map[string]any{}), status: http.StatusBadRequest, want: "action.name"},
		{name: "unknown operation", body: with("action", map[string]any{"name": "deleteEverything"}), status: http.StatusBadRequest, want: "operation"},
		{name: "metadata that is not an object", body: with("subject", map[string]any{"type": "lease", "id": "lease-1", "properties": map[string]any{"metadata": 42}}), status: http.StatusBadRequest, want: "metadata must be an object"},
		{name: "a string over the request bound", body: with("context", map[string]any{"command": []any{strings.Repeat("x", 65<<10)}}), status: http.StatusBadRequest, want: "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/access/v1/evaluation", "/access/v1/evaluations"} {
				a := post(t, base+path, tc.body)
				assert.Equal(t, tc.status, a.status, "%s: %s", path, a.body)
				if tc.want != "" {
					assert.Contains(t, a.json(t)["message"], tc.want, path)
				}
			}
		})
	}
	assert.Empty(t, log.String(), "bad requests are not decisions")

	// Non-JSON content types are refused, as on /v1/authorize (no CORS-simple posts).
	a := do(t, http.MethodPost, base+"/access/v1/evaluation", "text/plain", strings.NewReader(mustJSON(t, grant)))
	assert.Equal(t, http.StatusUnsupportedMediaType, a.status)
}

func TestAuthZENConfigurationAndRequestID(t *testing.T) {
	base := startHTTP(t, newServer(t))
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/.well-known/authzen-configuration", nil)
	require.NoError(t, err)
	req.Header.Set("X-Request-ID", "req-42")
	resp, err := testClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "req-42", resp.Header.Get("X-Request-ID"))
	var conf map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&conf))
	assert.Equal(t, base, conf["policy_decision_point"])
	assert.Equal(t, base+"/access/v1/evaluation", conf["access_evaluation_endpoint"])
	assert.Equal(t, base+"/access/v1/evaluations", conf["access_evaluations_endpoint"])

	// The evaluation endpoint it names answers, and echoes the request id too.
	reqJSON, _ := specexamples.NewFixture().JSON()
	ev, err := http.NewRequestWithContext(t.Context(), http.MethodPost, conf["access_evaluation_endpoint"], strings.NewReader(mustJSON(t, toAuthZEN(t, reqJSON))))
	require.NoError(t, err)
	ev.Header.Set("Content-Type", "application/json")
	ev.Header.Set("X-Request-ID", "req-43")
	evResp, err := testClient.Do(ev)
	require.NoError(t, err)
	defer evResp.Body.Close()
	assert.Equal(t, http.StatusOK, evResp.StatusCode)
	assert.Equal(t, "req-43", evResp.Header.Get("X-Request-ID"))
}

// TestAuthZENNeedsTheDecideScope: the AuthZEN endpoints are decision endpoints, with the same
// authentication as /v1/authorize.
func TestAuthZENNeedsTheDecideScope(t *testing.T) {
	dir := t.TempDir()
	tokens := testutil.WriteFile(t, dir, "tokens", "decide-token-0123456789 decide\ninspect-token-0123456789 inspect\n")
	require.NoError(t, os.Chmod(tokens, 0o600))
	s := newServer(t, withConfig(func(c *server.Config) {
		c.Authentication.Mode = server.AuthToken
		c.Authentication.TokensFile = tokens
	}))
	base := startHTTP(t, s)
	reqJSON, _ := specexamples.NewFixture().JSON()
	body := mustJSON(t, toAuthZEN(t, reqJSON))
	for _, tc := range []struct {
		token  string
		status int
	}{{"", http.StatusUnauthorized}, {"inspect-token-0123456789", http.StatusForbidden}, {"decide-token-0123456789", http.StatusOK}} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/access/v1/evaluation", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := testClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode, tc.token)
	}
}

// TestAuthZENMemberNamesAreExact: member names are the specification's, case-sensitive, each
// sent once; a case variant or a repeated member is a 400 that names it, never decided as the
// request encoding/json would make of it (`"SUBJECT"` taken as subject, a second "Type" taken
// as the type).
func TestAuthZENMemberNamesAreExact(t *testing.T) {
	t.Parallel()
	var log strings.Builder
	base := startHTTP(t, newServer(t, withDecisionLog(&log)))
	reqJSON, _ := specexamples.NewFixture().JSON()
	grant := toAuthZEN(t, reqJSON)
	subject := mustJSON(t, grant["subject"])
	resource := mustJSON(t, grant["resource"])
	action := mustJSON(t, grant["action"])
	rest := `"resource":` + resource + `,"action":` + action
	// The grant itself answers 200 on both endpoints: the cases below differ from it by a name.
	for _, path := range []string{"/access/v1/evaluation", "/access/v1/evaluations"} {
		a := post(t, base+path, `{"subject":`+subject+`,`+rest+`}`)
		require.Equal(t, http.StatusOK, a.status, "%s: %s", path, a.body)
	}
	for _, tc := range []struct{ name, body, member string }{
		{"upper-case subject", `{"SUBJECT":` + subject + `,` + rest + `}`, `"SUBJECT"`},
		{"case variant of type", `{"subject":{"type":"user","Type":"lease","id":"lease-1"},` + rest + `}`, `"subject.Type"`},
		{"repeated type", `{"subject":{"type":"user","type":"lease","id":"lease-1"},` + rest + `}`, `"subject.type"`},
		{"repeated subject", `{"subject":{"type":"user"},"subject":` + subject + `,` + rest + `}`, `"subject"`},
		{"case variant of action.name", `{"subject":` + subject + `,"resource":` + resource + `,"action":{"Name":"openDuplexChannel"}}`, `"action.Name"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, path := range []string{"/access/v1/evaluation", "/access/v1/evaluations"} {
				a := post(t, base+path, tc.body)
				require.Equal(t, http.StatusBadRequest, a.status, "%s: %s", path, a.body)
				assert.Contains(t, a.json(t)["message"], tc.member, path)
			}
		})
	}
	// In an evaluations request, the items and options are checked too.
	for _, tc := range []struct{ name, body, member string }{
		{"item's subject case variant", `{` + rest + `,"evaluations":[{"subject":` + subject + `},{"Subject":` + subject + `}]}`, `"evaluations[1].Subject"`},
		{"options case variant", `{"subject":` + subject + `,` + rest + `,"evaluations":[{}],"options":{"Evaluations_Semantic":"deny_on_first_deny"}}`, `"options.Evaluations_Semantic"`},
		{"repeated evaluations", `{"subject":` + subject + `,` + rest + `,"evaluations":[{}],"evaluations":[{}]}`, `"evaluations"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := post(t, base+"/access/v1/evaluations", tc.body)
			require.Equal(t, http.StatusBadRequest, a.status, string(a.body))
			assert.Contains(t, a.json(t)["message"], tc.member)
		})
	}
	var lines int
	for _, l := range strings.Split(log.String(), "\n") {
		if l != "" {
			lines++
		}
	}
	assert.Equal(t, 2, lines, "only the grants sent as they should be are decisions: %s", log.String())
}
